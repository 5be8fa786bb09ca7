// TCP sockets for `comm` and `ps`: listen/accept/connect over IPv4 or IPv6
// with deadlines, and a framed wire format. Every frame starts with a
// 32-byte header (magic "SHOL", protocol version, type, payload length
// bounded by kMaxFrame, a sequence number and a 64-bit fingerprint of the
// operation) so a receiver can refuse a bad frame before reading past its
// bound, and can tell a peer running a different call from a corrupted
// stream. All I/O is nonblocking underneath and waits with poll() against
// a Deadline. A Socket is used by one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "shoal/core/deadline.h"
#include "shoal/core/status.h"

namespace shoal::net {

inline constexpr std::uint32_t kMagic = 0x4c4f4853;                 // "SHOL" little-endian
inline constexpr std::uint16_t kProtocolVersion = 2;                // 2: the store proves the token
inline constexpr std::uint64_t kMaxFrame = std::uint64_t{1} << 34;  // 16 GiB

enum class FrameType : std::uint16_t {
  kHello = 1,
  kChallenge = 2,
  kProof = 3,
  kData = 4,
  kAbort = 5,
  kStoreRequest = 6,
  kStoreReply = 7,
  kGoodbye = 8,     // clean shutdown: the peer closes next, not a fault
  kStoreError = 9,  // a request refused (store or ps server): the payload says why
  kPsRequest = 10,  // to a parameter server (ps/wire.h)
  kPsReply = 11,
};
inline constexpr FrameType kLastFrameType = FrameType::kPsReply;

struct FrameHeader {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kProtocolVersion;
  std::uint16_t type = 0;
  std::uint64_t length = 0;       // payload bytes that follow
  std::uint64_t seq = 0;          // collective sequence number
  std::uint64_t fingerprint = 0;  // hash of (op, dtype, count, root, ...)
};
inline constexpr std::size_t kHeaderBytes = 32;

void encode_header(const FrameHeader& h, std::uint8_t out[kHeaderBytes]);
// Checks magic, version, type range and the length bound (`max_length`,
// at most kMaxFrame); `peer` names the sender in errors.
Result<FrameHeader> decode_header(std::span<const std::uint8_t> in, std::uint64_t max_length,
                                  std::string_view peer);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& o) noexcept : fd_(o.fd_), peer_(std::move(o.peer_)) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();
  const std::string& peer() const { return peer_; }  // "rank 3 (127.0.0.1:4711)"
  void set_peer(std::string p) { peer_ = std::move(p); }

  // Listens on host:port (port 0 = ephemeral). host "" = loopback.
  static Result<Socket> listen(const std::string& host, int port, int backlog = 128);
  // Retries refused connections until the deadline (the peer may not be up yet).
  static Result<Socket> connect(const std::string& host, int port, Deadline dl);
  Result<Socket> accept(Deadline dl);
  Result<int> local_port() const;
  Result<std::string> local_host() const;

  Status send_all(const void* p, std::size_t n, Deadline dl);
  Status recv_all(void* p, std::size_t n, Deadline dl);
  Status send_frame(const FrameHeader& h, const void* payload, Deadline dl);
  // Reads a header (checked against max_length) and nothing else.
  Result<FrameHeader> recv_header(std::uint64_t max_length, Deadline dl);

 private:
  int fd_ = -1;
  std::string peer_;
};

// Store request payload: a command byte and three length-prefixed strings.
std::string pack_store_request(char cmd, const std::string& key, const std::string& a,
                               const std::string& b);
// False when the payload is not exactly that (lengths past the end, trailing bytes).
bool parse_store_request(std::string_view in, char* cmd, std::string* parts3);

// "host:port" / "[v6]:port" -> (host, port); the error names `what`.
Result<std::pair<std::string, int>> split_host_port(std::string_view s, std::string_view what);

}  // namespace shoal::net
