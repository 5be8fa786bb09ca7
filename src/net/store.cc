#include "shoal/net/store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <list>

#include "shoal/core/env.h"
#include "shoal/core/file.h"
#include "shoal/core/logging.h"
#include "shoal/net/auth.h"

namespace shoal::net {
namespace fs = std::filesystem;

namespace {
constexpr std::uint64_t kMaxStoreFrame = 64 << 20;

}  // namespace

Status Store::wait(const std::vector<std::string>& keys, Deadline dl) {
  for (const auto& k : keys) SHOAL_RETURN_IF_ERROR(get(k, dl).status());
  return ok_status();
}

Result<std::string> Store::peek(const std::string& key) {
  const std::string probe = "\x01peek: no key holds this";
  SHOAL_ASSIGN_OR_RETURN(std::string v, compare_set(key, probe, probe));
  // PyTorch's TCPStore answers a swap on an absent key with the expected
  // value (ours with ""): absent either way.
  return v == probe ? std::string() : v;
}

// ------------------------------------------------------------- client

Result<std::unique_ptr<TcpStore>> TcpStore::connect(const std::string& host, int port, Deadline dl,
                                                    const std::string& token) {
  auto s = std::unique_ptr<TcpStore>(new TcpStore());
  SHOAL_ASSIGN_OR_RETURN(s->sock_, connect_authenticated(host, port, dl, token, "store"));
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
  if (rh->type == static_cast<std::uint16_t>(FrameType::kStoreError))
    return failed_precondition("{} refused the request for key '{}': {}", sock_.peer(), key, v);
  return v;
}

Status TcpStore::set(const std::string& key, const std::string& value) {
  return call('S', key, value, "", Deadline::after(io_timeout_)).status();
}
Result<std::string> TcpStore::get(const std::string& key, Deadline dl) {
  if (!sock_.valid()) return unavailable("store connection was closed after a timeout");
  return call('G', key, "", "", dl);
}
Result<std::int64_t> TcpStore::add(const std::string& key, std::int64_t delta) {
  SHOAL_ASSIGN_OR_RETURN(std::string v,
                         call('A', key, std::to_string(delta), "", Deadline::after(io_timeout_)));
  return env::parse_int(v, key);
}
Result<std::string> TcpStore::compare_set(const std::string& key, const std::string& expected,
                                          const std::string& desired) {
  return call('C', key, expected, desired, Deadline::after(io_timeout_));
}

// ------------------------------------------------------------- file store

namespace {
// A job id as one path component: anything but [A-Za-z0-9._-] becomes '_'.
std::string component(const std::string& job) {
  std::string c = "job-";
  for (unsigned char ch : job)
    c.push_back(std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' ? static_cast<char>(ch)
                                                                        : '_');
  return c;
}

// Creates dir (and its parents); dir itself readable by this user only. An
// existing directory keeps its mode (the user chose it).
void make_private_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec)) return;
  fs::create_directories(dir, ec);
  ::chmod(dir.c_str(), 0700);
}
}  // namespace

FileStore::FileStore(std::string dir, const std::string& job) : dir_(std::move(dir)) {
  if (job.empty()) return;
  std::error_code ec;
  std::vector<std::string> others;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    std::string name = e.path().filename().string();
    if (name.starts_with("job-") && name != component(job)) others.push_back(name);
  }
  if (!others.empty())
    SHOAL_LOG_INFO("file store {}: keys of {} other job(s) there are ignored (first: {})", dir_,
                   others.size(), others.front());
  make_private_dir(dir_);
  dir_ = (fs::path(dir_) / component(job)).string();
}

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
  make_private_dir(dir_);
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
  make_private_dir(dir);
  std::string lp = (fs::path(dir) / ".lock").string();
  int fd = ::open(lp.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
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
