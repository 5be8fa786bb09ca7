#include "shoal/net/store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <list>

#include "shoal/core/env.h"
#include "shoal/core/logging.h"
#include "shoal/tensor/safetensors.h"

namespace shoal::net {
namespace fs = std::filesystem;

namespace {
constexpr std::uint64_t kMaxStoreFrame = 64 << 20;
constexpr auto kIoTimeout = std::chrono::seconds(30);

}  // namespace

Status Store::wait(const std::vector<std::string>& keys, Deadline dl) {
  for (const auto& k : keys) SHOAL_RETURN_IF_ERROR(get(k, dl).status());
  return ok_status();
}

// ------------------------------------------------------------- server

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const std::string& host, int port) {
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer());
  SHOAL_ASSIGN_OR_RETURN(s->listener_, Socket::listen(host, port));
  SHOAL_ASSIGN_OR_RETURN(s->port_, s->listener_.local_port());
  SHOAL_ASSIGN_OR_RETURN(s->host_, s->listener_.local_host());
  s->thread_ = std::thread([p = s.get()] { p->serve(); });
  return s;
}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void TcpStoreServer::serve() {
  std::map<std::string, std::string> kv;
  std::list<Socket> clients;
  struct Waiter {
    Socket* client;
    std::string key;
    std::uint64_t seq;
  };
  std::vector<Waiter> waiters;
  auto reply = [](Socket& c, std::uint64_t seq, const std::string& v) {
    FrameHeader h;
    h.type = static_cast<std::uint16_t>(FrameType::kStoreReply);
    h.length = v.size();
    h.seq = seq;
    return c.send_frame(h, v.data(), Deadline::after(kIoTimeout));
  };
  while (!stop_) {
    std::vector<pollfd> fds;
    fds.push_back({listener_.fd(), POLLIN, 0});
    std::vector<Socket*> order;
    for (auto& c : clients) {
      fds.push_back({c.fd(), POLLIN, 0});
      order.push_back(&c);
    }
    int rc = ::poll(fds.data(), fds.size(), 100);
    if (rc <= 0) continue;
    if (fds[0].revents & POLLIN) {
      auto c = listener_.accept(Deadline::after(std::chrono::milliseconds(100)));
      if (c.ok()) clients.push_back(std::move(c).value());
    }
    std::vector<Socket*> dead;
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (!(fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Socket& c = *order[i];
      Deadline dl = Deadline::after(kIoTimeout);
      auto h = c.recv_header(kMaxStoreFrame, dl);
      std::string body;
      Status st = h.status();
      if (st.ok() && h->type != static_cast<std::uint16_t>(FrameType::kStoreRequest))
        st = invalid_argument("store: frame type {} is not a request", h->type);
      if (st.ok()) {
        body.resize(h->length);
        st = c.recv_all(body.data(), body.size(), dl);
      }
      char cmd = 0;
      std::string parts[3];
      if (st.ok() && !parse_store_request(body, &cmd, parts))
        st = invalid_argument("store: malformed request");
      if (!st.ok()) {
        if (st.code() != StatusCode::kUnavailable)
          SHOAL_LOG_WARN("store: dropping client {}: {}", c.peer(), st.to_string());
        dead.push_back(&c);
        continue;
      }
      const std::string& key = parts[0];
      std::string out;
      bool deferred = false;
      switch (cmd) {
        case 'S':
          kv[key] = parts[1];
          break;
        case 'G':
          if (kv.count(key))
            out = kv[key];
          else
            deferred = true;
          break;
        case 'A': {
          std::int64_t cur = 0, delta = 0;
          if (kv.count(key)) {
            auto v = env::parse_int(kv[key], key);
            cur = v.ok() ? *v : 0;
          }
          auto d = env::parse_int(parts[1], "delta");
          delta = d.ok() ? *d : 0;
          kv[key] = std::to_string(cur + delta);
          out = kv[key];
          break;
        }
        case 'C': {
          auto it = kv.find(key);
          std::string cur = it == kv.end() ? "" : it->second;
          if (cur == parts[1]) kv[key] = parts[2];
          out = kv.count(key) ? kv[key] : "";
          break;
        }
        default:
          SHOAL_LOG_WARN("store: unknown command '{}' from {}", cmd, c.peer());
          dead.push_back(&c);
          continue;
      }
      if (deferred) {
        waiters.push_back({&c, key, h->seq});
      } else if (!reply(c, h->seq, out).ok()) {
        dead.push_back(&c);
      }
      if (cmd == 'S' || cmd == 'A' || cmd == 'C') {
        for (auto it = waiters.begin(); it != waiters.end();) {
          if (kv.count(it->key)) {
            if (!reply(*it->client, it->seq, kv[it->key]).ok()) dead.push_back(it->client);
            it = waiters.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    for (Socket* d : dead) {
      std::erase_if(waiters, [&](const Waiter& w) { return w.client == d; });
      clients.remove_if([&](const Socket& s) { return &s == d; });
    }
  }
}

// ------------------------------------------------------------- client

Result<std::unique_ptr<TcpStore>> TcpStore::connect(const std::string& host, int port,
                                                    Deadline dl) {
  auto s = std::unique_ptr<TcpStore>(new TcpStore());
  auto sock = Socket::connect(host, port, dl);
  if (!sock.ok())
    return sock.status().with_context(fmt::format("store at {}:{} is unreachable", host, port));
  s->sock_ = std::move(sock).value();
  s->sock_.set_peer(fmt::format("store {}:{}", host, port));
  return s;
}

Result<std::string> TcpStore::call(char cmd, const std::string& key, const std::string& a,
                                   const std::string& b, Deadline dl) {
  std::string req = pack_store_request(cmd, key, a, b);
  FrameHeader h;
  h.type = static_cast<std::uint16_t>(FrameType::kStoreRequest);
  h.length = req.size();
  SHOAL_RETURN_IF_ERROR(sock_.send_frame(h, req.data(), dl));
  auto rh = sock_.recv_header(kMaxStoreFrame, dl);
  if (!rh.ok()) {
    if (rh.status().code() == StatusCode::kDeadlineExceeded) {
      sock_.close();  // a late reply would desynchronize the stream
      return deadline_exceeded("store: key '{}' did not appear before the deadline", key);
    }
    return rh.status();
  }
  std::string v(rh->length, '\0');
  SHOAL_RETURN_IF_ERROR(sock_.recv_all(v.data(), v.size(), dl));
  return v;
}

Status TcpStore::set(const std::string& key, const std::string& value) {
  return call('S', key, value, "", Deadline::after(kIoTimeout)).status();
}
Result<std::string> TcpStore::get(const std::string& key, Deadline dl) {
  if (!sock_.valid()) return unavailable("store connection was closed after a timeout");
  return call('G', key, "", "", dl);
}
Result<std::int64_t> TcpStore::add(const std::string& key, std::int64_t delta) {
  SHOAL_ASSIGN_OR_RETURN(std::string v,
                         call('A', key, std::to_string(delta), "", Deadline::after(kIoTimeout)));
  return env::parse_int(v, key);
}
Result<std::string> TcpStore::compare_set(const std::string& key, const std::string& expected,
                                          const std::string& desired) {
  return call('C', key, expected, desired, Deadline::after(kIoTimeout));
}

// ------------------------------------------------------------- file store

std::string FileStore::path(const std::string& key) const {
  std::string name;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.')
      name.push_back(static_cast<char>(c));
    else
      name += fmt::format("%{:02x}", c);
  }
  return (fs::path(dir_) / name).string();
}

Status FileStore::set(const std::string& key, const std::string& value) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  return write_file_atomic(path(key), value);
}

Result<std::string> FileStore::get(const std::string& key, Deadline dl) {
  std::string p = path(key);
  for (int i = 0;; ++i) {
    std::error_code ec;
    if (fs::exists(p, ec)) return read_file(p);
    if (dl.expired())
      return deadline_exceeded("file store {}: key '{}' did not appear before the deadline", dir_,
                               key);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(1 + i, 50)));
  }
}

namespace {
// Runs f under an exclusive flock on dir/.lock.
template <typename F>
auto locked(const std::string& dir, F f) -> decltype(f()) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string lp = (fs::path(dir) / ".lock").string();
  int fd = ::open(lp.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) return unavailable("file store: open {}: {}", lp, std::strerror(errno));
  ::flock(fd, LOCK_EX);
  auto r = f();
  ::flock(fd, LOCK_UN);
  ::close(fd);
  return r;
}
}  // namespace

Result<std::int64_t> FileStore::add(const std::string& key, std::int64_t delta) {
  return locked(dir_, [&]() -> Result<std::int64_t> {
    std::int64_t cur = 0;
    std::error_code ec;
    if (fs::exists(path(key), ec)) {
      SHOAL_ASSIGN_OR_RETURN(std::string v, read_file(path(key)));
      SHOAL_ASSIGN_OR_RETURN(cur, env::parse_int(v, key));
    }
    cur += delta;
    SHOAL_RETURN_IF_ERROR(write_file_atomic(path(key), std::to_string(cur)));
    return cur;
  });
}

Result<std::string> FileStore::compare_set(const std::string& key, const std::string& expected,
                                           const std::string& desired) {
  return locked(dir_, [&]() -> Result<std::string> {
    std::string cur;
    std::error_code ec;
    if (fs::exists(path(key), ec)) {
      SHOAL_ASSIGN_OR_RETURN(cur, read_file(path(key)));
    }
    if (cur == expected) {
      SHOAL_RETURN_IF_ERROR(write_file_atomic(path(key), desired));
      return desired;
    }
    return cur;
  });
}

}  // namespace shoal::net
