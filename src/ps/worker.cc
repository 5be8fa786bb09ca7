#include "shoal/ps/worker.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "shoal/core/hash.h"
#include "shoal/core/logging.h"
#include "shoal/net/frame_server.h"
#include "shoal/ps/wire.h"

namespace shoal::ps {

Result<std::unique_ptr<Worker>> Worker::connect(const std::vector<std::string>& servers,
                                                const std::string& token, int worker, Deadline dl,
                                                const ShardOptions* config) {
  if (servers.empty()) return invalid_argument("a worker needs at least one ps server");
  std::unique_ptr<Worker> w(new Worker());
  w->worker_ = worker;
  w->token_ = token;
  w->addrs_ = servers;
  if (config) w->config_ = *config;
  for (const auto& addr : servers) {
    SHOAL_ASSIGN_OR_RETURN(auto hp, net::split_host_port(addr, "ps server"));
    SHOAL_ASSIGN_OR_RETURN(net::Socket s,
                           net::connect_authenticated(hp.first, hp.second, dl, token, "ps server"));
    w->servers_.push_back(std::move(s));
  }
  if (config) SHOAL_RETURN_IF_ERROR(w->configure(*config, dl));
  Request j;
  j.op = 'J';
  j.worker = worker;
  for (auto& s : w->servers_) SHOAL_RETURN_IF_ERROR(w->call(s, encode(j), dl).status());
  return w;
}

Worker::~Worker() {
  if (!left_) (void)leave();
}

std::size_t Worker::server_of(const std::string& key) const {
  return fnv1a(key) % servers_.size();  // the same on every worker
}

Status Worker::reconnect(std::size_t i, Deadline dl) {
  SHOAL_ASSIGN_OR_RETURN(std::string addr, resolve_(static_cast<int>(i), addrs_[i]));
  SHOAL_ASSIGN_OR_RETURN(auto hp, net::split_host_port(addr, "ps server"));
  SHOAL_ASSIGN_OR_RETURN(net::Socket s,
                         net::connect_authenticated(hp.first, hp.second, dl, token_, "ps server"));
  if (config_) {
    Request c;
    c.op = 'C';
    c.config = config_text(*config_);
    SHOAL_RETURN_IF_ERROR(call(s, encode(c), dl).status());
  }
  Request j;
  j.op = 'J';
  j.worker = worker_;
  SHOAL_RETURN_IF_ERROR(call(s, encode(j), dl).status());
  servers_[i] = std::move(s);
  SHOAL_LOG_WARN("worker {}: reconnected to parameter server {} at {} (was {})", worker_, i, addr,
                 addrs_[i]);
  addrs_[i] = addr;
  return ok_status();
}

Result<std::string> Worker::call_server(std::size_t i, const std::string& payload, Deadline dl) {
  for (int attempt = 0;; ++attempt) {
    auto r = call(servers_[i], payload, dl);
    if (r.ok() || r.status().code() != StatusCode::kUnavailable || !resolve_ || dl.expired() ||
        attempt >= 5)
      return r;
    SHOAL_LOG_WARN("worker {}: lost parameter server {} at {} ({}); waiting for it to restart",
                   worker_, i, addrs_[i], r.status().message());
    if (Status st = reconnect(i, dl); !st.ok())
      return st.with_context(fmt::format("reconnecting to parameter server {}", i));
  }
}

Result<std::string> Worker::call(net::Socket& s, const std::string& payload, Deadline dl) {
  net::FrameHeader h;
  h.type = static_cast<std::uint16_t>(net::FrameType::kPsRequest);
  h.length = payload.size();
  h.seq = ++frame_;
  SHOAL_RETURN_IF_ERROR(s.send_frame(h, payload.data(), dl).with_context(s.peer()));
  return net::recv_reply(s, net::FrameType::kPsReply, net::FrameType::kStoreError,
                         std::uint64_t{1} << 34, dl);
}

Status Worker::configure(const ShardOptions& o, Deadline dl) {
  Request r;
  r.op = 'C';
  r.config = config_text(o);
  for (auto& s : servers_) SHOAL_RETURN_IF_ERROR(call(s, encode(r), dl).status());
  return ok_status();
}

Status Worker::init(const std::string& key, const Tensor& value) {
  Request r;
  r.op = 'I';
  r.key = key;
  r.value = value;
  return call_server(server_of(key), encode(r), Deadline::after_seconds(60)).status();
}

Result<PushResult> Worker::push(const std::string& key, std::int64_t step, const Tensor& grad,
                                Deadline dl) {
  Request r;
  r.op = 'P';
  r.worker = worker_;
  r.key = key;
  r.step = step;
  r.seq = ++seq_;
  r.value = grad;
  const std::string msg = encode(r);
  for (int wait_ms = 1;; wait_ms = std::min(wait_ms * 2, 100)) {
    SHOAL_ASSIGN_OR_RETURN(std::string rep, call_server(server_of(key), msg, dl));
    if (rep.size() != 1)
      return invalid_argument("ps server: push reply of {} bytes, expected 1", rep.size());
    const auto pr = static_cast<PushResult>(rep[0]);
    if (pr != PushResult::kWait) return pr;
    if (dl.expired())
      return deadline_exceeded(
          "worker {}: key '{}' step {} still too far ahead of the slowest "
          "worker at the deadline",
          worker_, key, step);
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
  }
}

Result<std::pair<std::uint64_t, Tensor>> Worker::pull(const std::string& key,
                                                      std::uint64_t min_version, Deadline dl) {
  Request r;
  r.op = 'L';
  r.key = key;
  r.min_version = min_version;
  SHOAL_ASSIGN_OR_RETURN(std::string rep, call_server(server_of(key), encode(r), dl));
  return decode_pull_reply(rep);
}

Result<Worker::Pulled> Worker::exchange(std::size_t i, const Request& r, Deadline dl,
                                        Tensor* into) {
  net::Socket& s = servers_[i];
  const std::string head = encode_head(r);
  const Tensor grad = r.value.contiguous();
  net::FrameHeader h;
  h.type = static_cast<std::uint16_t>(net::FrameType::kPsRequest);
  h.length = head.size() + grad.nbytes();
  h.seq = ++frame_;
  std::uint8_t hb[net::kHeaderBytes];
  net::encode_header(h, hb);
  SHOAL_RETURN_IF_ERROR(s.send_all(hb, sizeof hb, dl).with_context(s.peer()));
  SHOAL_RETURN_IF_ERROR(s.send_all(head.data(), head.size(), dl).with_context(s.peer()));
  SHOAL_RETURN_IF_ERROR(s.send_all(grad.raw_data(), grad.nbytes(), dl).with_context(s.peer()));
  // The reply: result, then (unless kWait) version, rank, dims, f32 data.
  SHOAL_ASSIGN_OR_RETURN(net::FrameHeader rh, s.recv_header(std::uint64_t{1} << 34, dl));
  if (rh.type == static_cast<std::uint16_t>(net::FrameType::kStoreError) ||
      rh.type != static_cast<std::uint16_t>(net::FrameType::kPsReply) || rh.length < 1) {
    std::string v(rh.length, '\0');
    SHOAL_RETURN_IF_ERROR(s.recv_all(v.data(), v.size(), dl).with_context(s.peer()));
    if (rh.type == static_cast<std::uint16_t>(net::FrameType::kStoreError))
      return failed_precondition("{} refused: {}", s.peer(), v);
    return invalid_argument("{}: a pushpull reply of type {} and {} bytes", s.peer(), rh.type,
                            rh.length);
  }
  std::uint8_t fixed[10];  // result, version, rank
  const std::size_t n_fixed = rh.length == 1 ? 1 : 10;
  SHOAL_RETURN_IF_ERROR(s.recv_all(fixed, n_fixed, dl).with_context(s.peer()));
  const auto pr = static_cast<PushResult>(fixed[0]);
  if (n_fixed == 1) {
    if (pr != PushResult::kWait)
      return invalid_argument("{}: a pushpull reply without a value ({})", s.peer(),
                              push_result_name(pr));
    return Pulled{pr, 0, Tensor()};
  }
  std::uint64_t version;
  std::memcpy(&version, fixed + 1, 8);
  const int rank = fixed[9];
  if (rank > 8) return invalid_argument("{}: a pushpull reply of rank {}", s.peer(), rank);
  std::int64_t dims[8];
  SHOAL_RETURN_IF_ERROR(s.recv_all(dims, 8 * static_cast<std::size_t>(rank), dl));
  Shape shape(dims, dims + rank);
  std::uint64_t numel = 1;
  for (std::int64_t d : shape) {
    if (d < 0 || (d > 0 && numel > (std::uint64_t{1} << 40) / static_cast<std::uint64_t>(d)))
      return invalid_argument("{}: a pushpull reply of shape {}", s.peer(), shape_str(shape));
    numel *= static_cast<std::uint64_t>(d);
  }
  if (rh.length != 10 + 8 * static_cast<std::uint64_t>(rank) + 4 * numel)
    return invalid_argument("{}: a pushpull reply of {} bytes for shape {}", s.peer(), rh.length,
                            shape_str(shape));
  Tensor value =
      into && into->dtype() == DType::kF32 && into->shape() == shape && into->is_contiguous()
          ? *into
          : Tensor::empty(shape, DType::kF32);
  SHOAL_RETURN_IF_ERROR(s.recv_all(value.raw_data(), 4 * numel, dl).with_context(s.peer()));
  return Pulled{pr, version, std::move(value)};
}

Result<Worker::Pulled> Worker::push_pull(const std::string& key, std::int64_t step,
                                         const Tensor& grad, double lr, Deadline dl, Tensor* into) {
  Request r;
  r.op = 'X';
  r.worker = worker_;
  r.key = key;
  r.step = step;
  r.seq = ++seq_;
  r.lr = lr;
  r.value = grad;
  const std::size_t i = server_of(key);
  for (int wait_ms = 1, lost = 0;;) {
    auto p = exchange(i, r, dl, into);
    if (!p.ok() && p.status().code() == StatusCode::kUnavailable && resolve_ && !dl.expired() &&
        lost++ < 5) {
      SHOAL_LOG_WARN("worker {}: lost parameter server {} at {} ({}); waiting for it to restart",
                     worker_, i, addrs_[i], p.status().message());
      if (Status st = reconnect(i, dl); !st.ok())
        return st.with_context(fmt::format("reconnecting to parameter server {}", i));
      continue;  // the same request, the same sequence number
    }
    if (!p.ok() || p->result != PushResult::kWait) return p;
    if (dl.expired())
      return deadline_exceeded(
          "worker {}: key '{}' step {} still too far ahead of the slowest worker at the deadline",
          worker_, key, step);
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    wait_ms = std::min(wait_ms * 2, 100);
  }
}

Status Worker::leave() {
  left_ = true;
  Request q;
  q.op = 'Q';
  q.worker = worker_;
  for (auto& s : servers_)
    SHOAL_RETURN_IF_ERROR(call(s, encode(q), Deadline::after_seconds(10)).status());
  return ok_status();
}

}  // namespace shoal::ps
