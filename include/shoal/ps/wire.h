// The parameter server's messages, carried in kPsRequest / kPsReply frames
// over the authenticated frame transport (net/frame_server.h). Little-
// endian; strings and tensors length-prefixed; every decoder checks each
// length against what is left and refuses trailing bytes, naming the
// field (fuzzed in tests/fuzz/wire_fuzz.cc).
//   request = op:u8 then
//     'J' join   worker:i32
//     'Q' leave  worker:i32
//     'H' heartbeat worker:i32   (from a worker's heartbeat thread)
//     'I' init   key:str value:tensor
//     'P' push   worker:i32 key:str step:i64 seq:u64 grad:tensor
//     'L' pull   key:str min_version:u64 reply:u8 (answered once version >= min)
//     'C' config text:str   (the worker's ShardOptions, config_text())
//     'X' pushpull worker:i32 key:str step:i64 seq:u64 lr:f64 reply:u8 grad:tensor
//     'S' pushrows worker:i32 key:str step:i64 seq:u64 lr:f64 rows grad:tensor
//         (a row-sparse push: grad holds the listed rows of the key's gradient)
//     'W' pullrows key:str min_version:u64 reply:u8 rows (answered like 'L',
//         with only the listed rows)
//     'R' pushrowspull worker:i32 key:str step:i64 seq:u64 lr:f64 reply:u8 rows
//         grad:tensor (a row-sparse push answered like 'X', with the whole
//         value: what the graph pass sends for an embedding table)
//     'M' mapcheck worker:i32 pid:i32 probe:ref (same host only: the server
//         maps the worker's region and answers the 8 bytes at the probe,
//         which proves it sees the worker's memory)
//     'Y' shmpushpull worker:i32 key:str step:i64 seq:u64 lr:f64 pid:i32
//         shape grad:ref dst:ref (a pushpull whose f32 gradient the server
//         reads from the worker's shared memory and whose value it writes
//         there, at dst; answered like 'X' with the codec byte kInPlace and
//         no data)
//   ref = id:u64 fd:i64 region_bytes:u64 offset:u64 (net::SharedRef; what
//         it points at must lie in the region); shape = rank:u8 dims:i64[rank]
//   rows = n:u32 (<= 2^24) then i64[n]
//   push and pushrows reply = result:u8 (PushResult); pull reply = version:u64 value:tensor
//   pushpull (and pushrowspull) reply = result:u8, then (unless kWait) a pull reply, sent once
//   the update the push belongs to is applied (sync: its round closed)
//   str = n:u32 bytes; tensor = ndim:u8 (<= 8) dims:i64[ndim] then its data
//   coded (ps/codec.h: codec:u8, 2bit threshold:f32, payload); reply = the
//   codec the value comes back in (f32, f16 or bf16)
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

struct Request {
  char op = 0;
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
