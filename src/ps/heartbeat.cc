#include "ps/heartbeat.h"

#include "ps/wire.h"
#include "shoal/core/logging.h"
#include "shoal/net/frame_server.h"

namespace shoal::ps {

Result<std::unique_ptr<Heartbeat>> Heartbeat::start(const std::vector<std::string>& servers,
                                                    const std::string& token, int worker,
                                                    double interval_s, Lookup lookup) {
  std::unique_ptr<Heartbeat> h(new Heartbeat());
  h->worker_ = worker;
  h->interval_s_ = interval_s;
  h->token_ = token;
  h->lookup_ = std::move(lookup);
  h->addrs_ = servers;
  const Deadline dl = Deadline::after_seconds(30);
  for (const auto& addr : servers) {
    SHOAL_ASSIGN_OR_RETURN(auto hp, net::split_host_port(addr, "ps server"));
    SHOAL_ASSIGN_OR_RETURN(net::Socket s,
                           net::connect_authenticated(hp.first, hp.second, dl, token, "ps server"));
    h->socks_.emplace_back(std::move(s));
  }
  h->thread_ = std::thread([p = h.get()] { p->loop(); });
  return h;
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Heartbeat::beat(std::size_t i, const std::string& msg, std::uint64_t seq) {
  net::Socket& s = *socks_[i];
  net::FrameHeader h;
  h.type = static_cast<std::uint16_t>(net::FrameType::kPsRequest);
  h.length = msg.size();
  h.seq = seq;
  const Deadline dl = Deadline::after_seconds(interval_s_ * 2 + 5);
  Status st = s.send_frame(h, msg.data(), dl);
  if (st.ok())
    st = net::recv_reply(s, net::FrameType::kPsReply, net::FrameType::kStoreError, 4096, dl)
             .status();
  if (st.ok()) return true;
  // The server is gone or refuses: the worker's own calls report it.
  SHOAL_LOG_DEBUG("worker {}: heartbeat to {}: {}", worker_, s.peer(), st.to_string());
  return false;
}

void Heartbeat::revive(std::size_t i) {
  if (!lookup_) return;
  const std::string addr = lookup_(static_cast<int>(i));
  if (addr.empty() || addr == addrs_[i]) return;  // not back yet
  auto hp = net::split_host_port(addr, "ps server");
  if (!hp.ok()) return;
  auto s = net::connect_authenticated(
      hp->first, hp->second, Deadline::after_seconds(interval_s_ + 1), token_, "ps server");
  if (!s.ok()) return;  // again next beat
  socks_[i].emplace(std::move(s).value());
  addrs_[i] = addr;
  SHOAL_LOG_INFO("worker {}: heartbeats to parameter server {} at {} again", worker_, i, addr);
}

void Heartbeat::loop() {
  Request r;
  r.op = Op::kHeartbeat;
  r.worker = worker_;
  const std::string msg = encode(r);
  std::uint64_t seq = 0;
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, std::chrono::duration<double>(interval_s_), [&] { return stop_; })) {
    lk.unlock();
    for (std::size_t i = 0; i < socks_.size(); ++i) {
      if (!socks_[i]) revive(i);
      if (socks_[i] && !beat(i, msg, ++seq)) socks_[i].reset();
    }
    lk.lock();
  }
}

}  // namespace shoal::ps
