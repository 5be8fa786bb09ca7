// The TCP store's server: the store's map and its blocked gets, served
// by a FrameServer (the authenticated, bounded, deadline-keeping loop
// shared with the parameter server). Wire format: docs/launch.md.
#include <map>
#include <mutex>

#include "shoal/core/env.h"
#include "shoal/core/logging.h"
#include "shoal/net/frame_server.h"
#include "shoal/net/store.h"

namespace shoal::net {
namespace {

using ConnId = FrameServer::ConnId;

// The map, its bounds and the clients blocked in get().
class Table {
 public:
  explicit Table(const ServerLimits& l) : limits_(l) {}
  // An error text when storing key=value would pass a limit.
  std::string check(const std::string& key, std::size_t value_bytes) const {
    auto it = kv_.find(key);
    std::uint64_t after_keys = kv_.size() + (it == kv_.end() ? 1 : 0);
    std::uint64_t after_bytes = bytes_ + value_bytes + (it == kv_.end() ? key.size() : 0) -
                                (it == kv_.end() ? 0 : it->second.size());
    if (after_keys > limits_.max_keys)
      return fmt::format("store full: {} keys held, the limit is {}", kv_.size(), limits_.max_keys);
    if (after_bytes > limits_.max_total_bytes)
      return fmt::format("store full: {} bytes held, setting '{}' ({} bytes) passes the limit {}",
                         bytes_, key, value_bytes, limits_.max_total_bytes);
    return "";
  }
  void put(const std::string& key, std::string value) {
    auto it = kv_.find(key);
    if (it == kv_.end()) {
      bytes_ += key.size() + value.size();
      kv_.emplace(key, std::move(value));
    } else {
      bytes_ = bytes_ - it->second.size() + value.size();
      it->second = std::move(value);
    }
  }
  const std::string* find(const std::string& key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
  }
  std::multimap<std::string, std::pair<std::uint64_t, std::uint64_t>> waiters;  // key -> conn, seq

 private:
  const ServerLimits& limits_;
  std::map<std::string, std::string> kv_;
  std::uint64_t bytes_ = 0;
};

}  // namespace

class TcpStoreServer::Handler final : public FrameServer::Handler {
 public:
  explicit Handler(const ServerLimits& l) : limits_(l), table_(limits_) {}

  std::string on_request(FrameServer& s, ConnId id, const FrameHeader& h,
                         std::string_view body) override {
    char cmd = 0;
    std::string parts[3];
    if (static_cast<FrameType>(h.type) != FrameType::kStoreRequest ||
        !parse_store_request(body, &cmd, parts))
      return fmt::format("sent a malformed request (frame type {}, {} bytes)", h.type, body.size());
    return serve(s, id, h.seq, cmd, parts);
  }
  void on_close(FrameServer&, ConnId id) override {
    std::erase_if(table_.waiters, [&](const auto& w) { return w.second.first == id; });
  }
  // Takes up end_waits() on the serving thread: every waiting get is
  // answered with the reason.
  void on_tick(FrameServer& s) override {
    if (ended_.empty()) {
      std::lock_guard<std::mutex> lk(mu_);
      ended_ = end_why_;
    }
    if (ended_.empty()) return;
    for (const auto& [key, w] : table_.waiters)
      s.reply(w.first, FrameType::kStoreError, w.second, ended_);
    table_.waiters.clear();
  }
  void end_waits(const std::string& why) {
    std::lock_guard<std::mutex> lk(mu_);
    end_why_ = why;
  }

 private:
  static std::string answer(FrameServer& s, ConnId id, std::uint64_t seq, const std::string& v) {
    s.reply(id, FrameType::kStoreReply, seq, v);
    return "";
  }
  static std::string error(FrameServer& s, ConnId id, std::uint64_t seq, const std::string& why) {
    s.reply(id, FrameType::kStoreError, seq, why);
    return "";
  }
  std::string serve(FrameServer& s, ConnId id, std::uint64_t seq, char cmd, std::string* parts) {
    const std::string& key = parts[0];
    if (cmd == 'G') {
      if (const std::string* v = table_.find(key)) {
        s.reply(id, FrameType::kStoreReply, seq, *v);
        return "";
      }
      if (!ended_.empty()) return error(s, id, seq, ended_);
      table_.waiters.emplace(key, std::pair{id, seq});
      return "";
    }
    std::string value;
    if (cmd == 'S') {
      value = parts[1];
    } else if (cmd == 'A') {
      const std::string* cur = table_.find(key);
      auto base = cur ? env::parse_int(*cur, key) : Result<std::int64_t>(std::int64_t{0});
      auto delta = env::parse_int(parts[1], "delta");
      if (!base.ok() || !delta.ok())
        return error(s, id, seq,
                     fmt::format("add to '{}': {}", key,
                                 (!base.ok() ? base.status() : delta.status()).message()));
      value = std::to_string(*base + *delta);
    } else if (cmd == 'C') {
      const std::string* cur = table_.find(key);
      if ((cur ? *cur : std::string()) != parts[1]) return answer(s, id, seq, cur ? *cur : "");
      value = parts[2];
    } else {
      return fmt::format("sent unknown command '{}'", cmd);
    }
    if (std::string full = table_.check(key, value.size()); !full.empty())
      return error(s, id, seq, full);
    table_.put(key, value);
    s.reply(id, FrameType::kStoreReply, seq, cmd == 'S' ? "" : value);
    auto [lo, hi] = table_.waiters.equal_range(key);
    for (auto it = lo; it != hi; ++it)
      s.reply(it->second.first, FrameType::kStoreReply, it->second.second, value);
    table_.waiters.erase(lo, hi);
    return "";
  }

  ServerLimits limits_;
  Table table_;
  std::string ended_;  // the serving thread's copy of end_why_
  std::mutex mu_;
  std::string end_why_;  // guarded by mu_
};

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const std::string& host, int port,
                                                              const std::string& token,
                                                              StoreLimits limits) {
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer());
  s->handler_ = std::make_unique<Handler>(limits);
  SHOAL_ASSIGN_OR_RETURN(s->server_,
                         FrameServer::start(host, port, token, s->handler_.get(), limits, "store"));
  return s;
}

TcpStoreServer::~TcpStoreServer() { server_.reset(); }

void TcpStoreServer::end_waits(const std::string& why) { handler_->end_waits(why); }

int TcpStoreServer::port() const { return server_->port(); }
const std::string& TcpStoreServer::host() const { return server_->host(); }
int TcpStoreServer::refused() const { return server_->refused(); }

}  // namespace shoal::net
