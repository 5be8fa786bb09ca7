#include "shoal/core/file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace shoal {

Status write_file_atomic(const std::string& path, std::string_view bytes, unsigned mode) {
  std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, static_cast<mode_t>(mode));
  // A leftover temporary keeps its old mode through O_CREAT: narrow it to
  // `mode` before a byte is written (never widen what the umask took away).
  struct stat st {};
  if (fd >= 0 && ::fstat(fd, &st) == 0 && (st.st_mode & 0777 & ~mode) != 0 &&
      ::fchmod(fd, st.st_mode & 0777 & mode) != 0) {
    const int e = errno;
    ::close(fd);
    return unavailable("{}: chmod {:o}: {}", tmp, mode, std::strerror(e));
  }
  if (fd < 0) return unavailable("{}: cannot create: {}", tmp, std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return unavailable("{}: write failed at byte {}: {}", tmp, done, std::strerror(e));
    }
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return unavailable("{}: fsync failed: {}", tmp, std::strerror(e));
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return unavailable("{}: close failed: {}", tmp, std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return unavailable("{}: rename from {} failed: {}", path, tmp, std::strerror(e));
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);  // best effort: some filesystems refuse fsync on directories
    ::close(dfd);
  }
  return ok_status();
}

int remove_dead_temporaries(const std::string& dir, std::chrono::seconds idle) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int removed = 0;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const auto at = name.rfind(".tmp.");
    if (at == std::string::npos || at + 5 == name.size()) continue;
    const std::string digits = name.substr(at + 5);
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // its writer may run
    std::error_code tec;
    const auto written = fs::last_write_time(e.path(), tec);
    if (tec || now - written < idle) continue;
    if (fs::remove(e.path(), tec)) ++removed;
  }
  return removed;
}

Result<std::string> read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return not_found("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return unavailable("{}: stat failed: {}", path, std::strerror(e));
  }
  std::string out(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < out.size()) {
    ssize_t r = ::read(fd, out.data() + done, out.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int e = errno;
      ::close(fd);
      return unavailable("{}: read failed at byte {}: {}", path, done,
                         r == 0 ? "unexpected EOF" : std::strerror(e));
    }
    done += static_cast<std::size_t>(r);
  }
  ::close(fd);
  return out;
}

}  // namespace shoal
