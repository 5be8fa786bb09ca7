#include "shoal/ps/worker.h"

#include <chrono>
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

Result<Worker::Pulled> Worker::push_pull(const std::string& key, std::int64_t step,
                                         const Tensor& grad, double lr, Deadline dl) {
  Request r;
  r.op = 'X';
  r.worker = worker_;
  r.key = key;
  r.step = step;
  r.seq = ++seq_;
  r.lr = lr;
  r.value = grad;
  const std::string msg = encode(r);
  for (int wait_ms = 1;; wait_ms = std::min(wait_ms * 2, 100)) {
    SHOAL_ASSIGN_OR_RETURN(std::string rep, call_server(server_of(key), msg, dl));
    if (rep.empty()) return invalid_argument("ps server: empty pushpull reply");
    const auto pr = static_cast<PushResult>(rep[0]);
    if (pr != PushResult::kWait) {
      SHOAL_ASSIGN_OR_RETURN(auto v, decode_pull_reply(std::string_view(rep).substr(1)));
      return Pulled{pr, v.first, std::move(v.second)};
    }
    if (dl.expired())
      return deadline_exceeded(
          "worker {}: key '{}' step {} still too far ahead of the slowest worker at the deadline",
          worker_, key, step);
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
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
