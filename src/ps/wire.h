// The parameter server's messages, carried in kPsRequest / kPsReply frames
// over the authenticated frame transport (net/frame_server.h). Private to
// ps (and its tests and fuzzer); the byte layout of every message is in
// docs/ps.md, "Wire format". Every decoder checks each length against what
// is left and refuses trailing bytes, naming the field (fuzzed in
// tests/fuzz/wire_fuzz.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "shoal/core/status.h"
#include "shoal/net/shared_memory.h"
#include "shoal/ps/codec.h"
#include "shoal/tensor/tensor.h"

namespace shoal::ps {

inline constexpr std::uint64_t kMaxKeyBytes = 4096;
// The codec byte of a shmpushpull's answer: the value is in the worker's
// memory already.
inline constexpr std::uint8_t kInPlace = 4;

// Where a shmpushpull's tensors lie in the worker's shared regions.
struct InPlace {
  std::int32_t pid = 0;  // the worker's process
  Shape shape;           // of the gradient and the value (f32)
  net::SharedRef grad;   // mapcheck: the probe word
  net::SharedRef dst;
};

// A request's first byte. Switches over it have no default, so the
// compiler names an operation a switch forgets.
enum class Op : std::uint8_t {
  kJoin = 'J',          // worker:i32
  kLeave = 'Q',         // worker:i32
  kHeartbeat = 'H',     // worker:i32
  kInit = 'I',          // key value
  kPush = 'P',          // worker key step seq grad
  kPull = 'L',          // key min_version reply
  kConfig = 'C',        // the worker's ShardOptions as text
  kPushPull = 'X',      // a push answered with the value once applied
  kPushRows = 'S',      // a row-sparse push
  kPullRows = 'W',      // a pull of some rows
  kPushRowsPull = 'R',  // a row-sparse push answered with the whole value
  kMapCheck = 'M',      // same host: proves the server maps the worker's memory
  kShmPushPull = 'Y',   // a pushpull through the worker's shared memory
};

struct Request {
  Op op{};  // 0: none yet
  std::int32_t worker = -1;
  std::string key;
  std::int64_t step = 0;
  std::uint64_t seq = 0, min_version = 0;
  double lr = 0;                   // pushpull: this step's learning rate (0 = the server's)
  std::string config;              // config
  Tensor value;                    // init: the value; push: the gradient
  Codec codec = Codec::kF32;       // how `value` travels
  float threshold = 0;             // kTwoBit
  Codec reply = Codec::kF32;       // pull, pushpull: how the value comes back
  std::vector<std::int64_t> rows;  // pushrows, pullrows
  InPlace mem;                     // mapcheck, shmpushpull
};

std::string encode(const Request& r);
// The same without the tensor's data (init, push, pushpull: the tensor is
// last): for an f32 tensor, encode(r) == encode_head(r) + its bytes, so a
// sender can write the data from the tensor's own memory.
std::string encode_head(const Request& r);
// `make`, when given, supplies the request's tensor for a shape (an f32,
// contiguous tensor of exactly that shape, e.g. a reused buffer): a server
// decodes each push into memory it already has instead of fresh pages.
using MakeTensor = std::function<Tensor(const Shape&)>;
Result<Request> decode_request(std::string_view in, const MakeTensor& make = {});

std::string encode_pull_reply(std::uint64_t version, const Tensor& value, Codec c = Codec::kF32);
// The same appended to `out` (one copy of the value, no temporary).
void append_pull_reply(std::string& out, std::uint64_t version, const Tensor& value,
                       Codec c = Codec::kF32);
// The same without an f32 value's data (it is last): for f32,
// append_pull_reply == append_pull_reply_head + the value's bytes, so a
// server can send the data from the value's own memory. Other codecs are
// appended whole.
void append_pull_reply_head(std::string& out, std::uint64_t version, const Tensor& value,
                            Codec c = Codec::kF32);
// A shmpushpull's value part: version, shape, kInPlace (no data).
void append_pull_reply_in_place(std::string& out, std::uint64_t version, const Shape& shape);
Result<std::pair<std::uint64_t, Tensor>> decode_pull_reply(std::string_view in);

}  // namespace shoal::ps
