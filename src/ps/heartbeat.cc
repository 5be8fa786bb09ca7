#include "ps/heartbeat.h"

#include <poll.h>

#include <algorithm>

#include "ps/wire.h"
#include "shoal/core/logging.h"
#include "shoal/net/frame_server.h"

namespace shoal::ps {

Result<std::unique_ptr<Heartbeat>> Heartbeat::start(const std::vector<std::string>& servers,
                                                    const std::string& token, int worker,
                                                    double interval_s, double deadline_s,
                                                    Lookup lookup) {
  std::unique_ptr<Heartbeat> h(new Heartbeat());
  h->worker_ = worker;
  h->interval_s_ = interval_s;
  h->deadline_s_ = deadline_s;
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
  h->asked_.resize(servers.size());
  h->last_sent_.assign(servers.size(), Clock::time_point());
  h->silent_.resize(servers.size());
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

std::string Heartbeat::silent(std::size_t i) const {
  std::lock_guard<std::mutex> lk(mu_);
  return i < silent_.size() ? silent_[i] : "";
}

void Heartbeat::tend(std::size_t i, const std::string& msg, std::uint64_t seq) {
  const auto now = Clock::now();
  if (!socks_[i] && std::chrono::duration<double>(now - last_sent_[i]).count() >= interval_s_) {
    last_sent_[i] = now;
    revive(i);
  }
  if (!socks_[i]) return;
  net::Socket& s = *socks_[i];
  auto failed = [&](const Status& st) {
    // The server is gone or refuses: the worker's own calls report it.
    SHOAL_LOG_DEBUG("worker {}: heartbeat to {}: {}", worker_, s.peer(), st.to_string());
    socks_[i].reset();
    asked_[i].reset();
  };
  if (asked_[i]) {
    pollfd pf{s.fd(), POLLIN, 0};
    if (::poll(&pf, 1, 0) <= 0) {
      const double waited = std::chrono::duration<double>(now - *asked_[i]).count();
      if (waited <= deadline_s_) return;
      std::lock_guard<std::mutex> lk(mu_);
      if (silent_[i].empty())
        silent_[i] = fmt::format(
            "parameter server {} at {} answered no heartbeat for {:.1f} s (SHOAL_PS_HEARTBEAT="
            "{} s): it is stopped or hung",
            i, addrs_[i], waited, deadline_s_);
      return;
    }
    Status st = net::recv_reply(s, net::FrameType::kPsReply, net::FrameType::kStoreError, 4096,
                                Deadline::after_seconds(5))
                    .status();
    if (!st.ok()) return failed(st);
    asked_[i].reset();
    std::lock_guard<std::mutex> lk(mu_);
    silent_[i].clear();
  }
  if (std::chrono::duration<double>(now - last_sent_[i]).count() < interval_s_) return;
  net::FrameHeader h;
  h.type = static_cast<std::uint16_t>(net::FrameType::kPsRequest);
  h.length = msg.size();
  h.seq = seq;
  if (Status st = s.send_frame(h, msg.data(), Deadline::after_seconds(2)); !st.ok())
    return failed(st);
  asked_[i] = now;
  last_sent_[i] = now;
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
  // Answers are looked for more often than beats go out: a silent server
  // is named soon after its deadline.
  const double tick = std::min(interval_s_, 0.25);
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, std::chrono::duration<double>(tick), [&] { return stop_; })) {
    lk.unlock();
    for (std::size_t i = 0; i < socks_.size(); ++i) tend(i, msg, ++seq);
    lk.lock();
  }
}

}  // namespace shoal::ps
