#include "shoal/ps/server.h"

#include <filesystem>
#include <map>
#include <mutex>
#include <vector>

#include "shoal/core/logging.h"
#include "shoal/ps/wire.h"

namespace shoal::ps {

using ConnId = net::FrameServer::ConnId;

class Server::Handler final : public net::FrameServer::Handler {
 public:
  Handler(std::unique_ptr<Shard> shard, const ServerOptions& o) : shard_(std::move(shard)), o_(o) {}

  std::string on_request(net::FrameServer& s, ConnId c, const net::FrameHeader& h,
                         std::string_view body) override {
    if (static_cast<net::FrameType>(h.type) != net::FrameType::kPsRequest)
      return fmt::format("sent frame type {} to a parameter server", h.type);
    auto r = decode_request(body);
    if (!r.ok()) return refuse(s, c, h.seq, r.status());
    Status st = serve(s, c, h.seq, *r);
    if (!st.ok()) return refuse(s, c, h.seq, st);
    return "";
  }

  void on_close(net::FrameServer& s, ConnId c) override {
    std::erase_if(pulls_, [&](const Pull& p) { return p.conn == c; });
    auto w = worker_of_.find(c);
    if (w == worker_of_.end()) return;
    SHOAL_LOG_WARN("ps server: worker {} left: its connection closed", w->second);
    (void)shard_->remove_worker(w->second);
    worker_of_.erase(w);
    answer_pulls(s);
  }

  ShardStats stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }
  Status final_snapshot() {
    return o_.snapshot.empty() ? ok_status() : shard_->snapshot(o_.snapshot);
  }

 private:
  struct Pull {
    ConnId conn;
    std::uint64_t seq;
    std::string key;
    std::uint64_t min_version;
  };

  std::string refuse(net::FrameServer& s, ConnId c, std::uint64_t seq, const Status& st) {
    s.reply(c, net::FrameType::kStoreError, seq, st.message());
    return "";  // a refused request is answered; the client stays
  }

  Status serve(net::FrameServer& s, ConnId c, std::uint64_t seq, const Request& r) {
    switch (r.op) {
      case 'J':
        SHOAL_RETURN_IF_ERROR(shard_->add_worker(r.worker));
        worker_of_[c] = r.worker;
        break;
      case 'Q':
        SHOAL_RETURN_IF_ERROR(shard_->remove_worker(r.worker));
        worker_of_.erase(c);
        answer_pulls(s);
        break;
      case 'I':
        SHOAL_RETURN_IF_ERROR(shard_->init(r.key, r.value));
        break;
      case 'P': {
        SHOAL_ASSIGN_OR_RETURN(PushResult pr,
                               shard_->push(r.worker, r.key, r.step, r.seq, r.value));
        s.reply(c, net::FrameType::kPsReply, seq, std::string(1, static_cast<char>(pr)));
        if (pr == PushResult::kApplied || pr == PushResult::kClosed) {
          answer_pulls(s);
          SHOAL_RETURN_IF_ERROR(maybe_snapshot());
        }
        publish();
        return ok_status();
      }
      case 'L': {
        SHOAL_ASSIGN_OR_RETURN(auto v, shard_->pull(r.key));
        if (v.first >= r.min_version)
          s.reply(c, net::FrameType::kPsReply, seq, encode_pull_reply(v.first, v.second));
        else
          pulls_.push_back({c, seq, r.key, r.min_version});
        return ok_status();
      }
    }
    s.reply(c, net::FrameType::kPsReply, seq, "");
    publish();
    return ok_status();
  }

  void answer_pulls(net::FrameServer& s) {
    std::erase_if(pulls_, [&](const Pull& p) {
      auto v = shard_->pull(p.key);
      if (!v.ok() || v->first < p.min_version) return false;
      s.reply(p.conn, net::FrameType::kPsReply, p.seq, encode_pull_reply(v->first, v->second));
      return true;
    });
  }

  Status maybe_snapshot() {
    if (o_.snapshot.empty() || o_.snapshot_every == 0) return ok_status();
    if (shard_->stats().applied - last_snapshot_ < o_.snapshot_every) return ok_status();
    last_snapshot_ = shard_->stats().applied;
    return shard_->snapshot(o_.snapshot);
  }

  void publish() {
    std::lock_guard<std::mutex> lk(mu_);
    stats_ = shard_->stats();
  }

  std::unique_ptr<Shard> shard_;
  ServerOptions o_;
  std::map<ConnId, int> worker_of_;
  std::vector<Pull> pulls_;
  std::uint64_t last_snapshot_ = 0;
  mutable std::mutex mu_;
  ShardStats stats_;
};

Result<std::unique_ptr<Server>> Server::start(const std::string& host, int port,
                                              const std::string& token, const ServerOptions& o) {
  SHOAL_ASSIGN_OR_RETURN(auto shard, Shard::create(o.shard));
  std::error_code ec;
  if (!o.snapshot.empty() && std::filesystem::exists(o.snapshot, ec)) {
    SHOAL_RETURN_IF_ERROR(shard->restore(o.snapshot).with_context("restarting the ps server"));
    SHOAL_LOG_INFO("ps server: restored from {} ({} workers)", o.snapshot, shard->workers().size());
  }
  std::unique_ptr<Server> s(new Server());
  s->handler_ = std::make_unique<Handler>(std::move(shard), o);
  SHOAL_ASSIGN_OR_RETURN(s->server_, net::FrameServer::start(host, port, token, s->handler_.get(),
                                                             o.limits, "ps server"));
  return s;
}

Server::~Server() {
  server_.reset();  // the serving thread stops first
  if (Status st = handler_->final_snapshot(); !st.ok())
    SHOAL_LOG_ERROR("ps server: last snapshot: {}", st.to_string());
}

int Server::port() const { return server_->port(); }
ShardStats Server::stats() const { return handler_->stats(); }
int Server::refused() const { return server_->refused(); }

}  // namespace shoal::ps
