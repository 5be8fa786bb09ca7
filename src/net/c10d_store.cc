#include "shoal/net/c10d_store.h"

#include <cstring>

#include "shoal/core/bytes.h"
#include "shoal/core/logging.h"

namespace shoal::net {
namespace {

// torch/csrc/distributed/c10d/TCPStore.cpp (1.13): QueryType and
// WaitResponseType.
enum class Query : std::uint8_t { kSet = 0, kCompareSet = 1, kGet = 2, kAdd = 3, kWait = 5 };
constexpr std::uint8_t kStopWaiting = 0;
constexpr std::uint64_t kMaxValue = 64 << 20;

void put_bytes(std::string& out, const std::string& s) {
  append_le<std::uint64_t>(out, s.size());
  out += s;
}
std::string query(Query q) { return std::string(1, static_cast<char>(q)); }

}  // namespace

Result<std::unique_ptr<C10dStore>> C10dStore::connect(const std::string& host, int port,
                                                      Deadline dl) {
  auto s = std::unique_ptr<C10dStore>(new C10dStore());
  auto sock = Socket::connect(host, port, dl);
  if (!sock.ok())
    return sock.status().with_context(
        fmt::format("torchrun's store (c10d TCPStore) at {}:{} is unreachable", host, port));
  s->sock_ = std::move(sock).value();
  s->sock_.set_peer(fmt::format("torchrun's store {}:{}", host, port));
  return s;
}

Status C10dStore::send(const std::string& bytes, Deadline dl) {
  if (!sock_.valid()) return unavailable("{}: connection was closed after a timeout", sock_.peer());
  return sock_.send_all(bytes.data(), bytes.size(), dl).with_context(sock_.peer());
}

template <typename T>
Result<T> C10dStore::recv_value(Deadline dl) {
  T v{};
  Status st = sock_.recv_all(&v, sizeof v, dl);
  if (!st.ok()) {
    sock_.close();  // a late reply would desynchronize the stream
    return st.with_context(sock_.peer());
  }
  return v;
}

Result<std::string> C10dStore::recv_bytes(Deadline dl) {
  SHOAL_ASSIGN_OR_RETURN(std::uint64_t n, recv_value<std::uint64_t>(dl));
  if (n > kMaxValue) {
    sock_.close();
    return invalid_argument("{}: a value of {} bytes is over the {} byte limit", sock_.peer(), n,
                            kMaxValue);
  }
  std::string v(n, '\0');
  if (Status st = sock_.recv_all(v.data(), n, dl); !st.ok()) {
    sock_.close();
    return st.with_context(sock_.peer());
  }
  return v;
}

Status C10dStore::set(const std::string& key, const std::string& value) {
  std::string m = query(Query::kSet);
  put_bytes(m, key);
  put_bytes(m, value);
  return send(m, Deadline::after(io_timeout_));
}

Result<std::string> C10dStore::get(const std::string& key, Deadline dl) {
  // The server answers a get of a missing key with an error and a closed
  // connection: wait for it first, as torch's own client does.
  std::string w = query(Query::kWait);
  append_le<std::uint64_t>(w, 1);
  put_bytes(w, key);
  SHOAL_RETURN_IF_ERROR(send(w, dl));
  auto r = recv_value<std::uint8_t>(dl);
  if (!r.ok()) {
    if (r.status().code() == StatusCode::kDeadlineExceeded)
      return deadline_exceeded("{}: key '{}' did not appear before the deadline", sock_.peer(),
                               key);
    return r.status();
  }
  if (*r != kStopWaiting)
    return invalid_argument("{}: unexpected answer {} to a wait", sock_.peer(), int{*r});
  std::string g = query(Query::kGet);
  put_bytes(g, key);
  SHOAL_RETURN_IF_ERROR(send(g, dl));
  return recv_bytes(dl);
}

Result<std::int64_t> C10dStore::add(const std::string& key, std::int64_t delta) {
  const Deadline dl = Deadline::after(io_timeout_);
  std::string m = query(Query::kAdd);
  put_bytes(m, key);
  append_le<std::int64_t>(m, delta);
  SHOAL_RETURN_IF_ERROR(send(m, dl));
  return recv_value<std::int64_t>(dl);
}

Result<std::string> C10dStore::compare_set(const std::string& key, const std::string& expected,
                                           const std::string& desired) {
  const Deadline dl = Deadline::after(io_timeout_);
  std::string m = query(Query::kCompareSet);
  put_bytes(m, key);
  put_bytes(m, expected);
  put_bytes(m, desired);
  SHOAL_RETURN_IF_ERROR(send(m, dl));
  return recv_bytes(dl);
}

}  // namespace shoal::net
