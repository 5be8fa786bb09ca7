#include "shoal/net/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace shoal::net {
namespace {

struct Entry {
  std::size_t bytes;
  int fd;
  std::uint64_t id;
};
std::mutex g_mu;
// Live regions by base address.
std::map<std::uintptr_t, Entry>& registry() {
  static std::map<std::uintptr_t, Entry> m;
  return m;
}
std::atomic<std::uint64_t> g_next_id{1};

std::string region_name(std::uint64_t id) { return "shoal-region-" + std::to_string(id); }

std::size_t round_to_pages(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return std::max<std::size_t>(1, (bytes + page - 1) / page) * page;
}

}  // namespace

Result<std::shared_ptr<SharedRegion>> SharedRegion::create(std::size_t bytes) {
  const std::size_t size = round_to_pages(bytes);
  const std::uint64_t id = g_next_id.fetch_add(1);
  const std::string name = region_name(id);
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return unavailable("memfd_create({}): {}", name, std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int e = errno;
    ::close(fd);
    return unavailable("ftruncate({}, {} bytes): {}", name, size, std::strerror(e));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    ::close(fd);
    return unavailable("mmap of {} ({} bytes): {}", name, size, std::strerror(e));
  }
  std::shared_ptr<SharedRegion> r(new SharedRegion());
  r->base_ = p;
  r->bytes_ = size;
  r->fd_ = fd;
  std::lock_guard<std::mutex> lk(g_mu);
  registry()[reinterpret_cast<std::uintptr_t>(p)] = Entry{size, fd, id};
  return r;
}

SharedRegion::~SharedRegion() {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    registry().erase(reinterpret_cast<std::uintptr_t>(base_));
  }
  // Peers that mapped it keep their pages until they unmap: no one reads
  // freed memory, whatever the order of exits.
  munmap(base_, bytes_);
  ::close(fd_);
}

std::optional<SharedRef> find_shared(const void* p, std::size_t n) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard<std::mutex> lk(g_mu);
  auto& m = registry();
  auto it = m.upper_bound(a);
  if (it == m.begin()) return std::nullopt;
  --it;
  const Entry& e = it->second;
  if (a - it->first > e.bytes || n > e.bytes - (a - it->first)) return std::nullopt;
  return SharedRef{e.id, e.fd, e.bytes, a - it->first};
}

Result<std::unique_ptr<PeerMapping>> PeerMapping::open(int pid, const SharedRef& ref) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(ref.fd);
  // The fd number names whatever the process holds there now: check that it
  // is the region that was announced before mapping it.
  char link[256];
  ssize_t k = readlink(path.c_str(), link, sizeof link - 1);
  if (k < 0) return unavailable("readlink {}: {}", path, std::strerror(errno));
  link[k] = '\0';
  const std::string want = "/memfd:" + region_name(ref.id);
  if (std::string(link).rfind(want + " ", 0) != 0 && std::string(link) != want)
    return failed_precondition("{} is '{}', not the announced region {}", path, link, want);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return unavailable("open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != ref.region_bytes) {
    ::close(fd);
    return failed_precondition("{} holds {} bytes, the peer announced {}", path,
                               static_cast<long long>(st.st_size), ref.region_bytes);
  }
  void* p = mmap(nullptr, ref.region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  ::close(fd);  // the mapping keeps the memory
  if (p == MAP_FAILED) return unavailable("mmap {}: {}", path, std::strerror(e));
  std::unique_ptr<PeerMapping> m(new PeerMapping());
  m->base_ = p;
  m->bytes_ = ref.region_bytes;
  return m;
}

PeerMapping::~PeerMapping() { munmap(base_, bytes_); }

}  // namespace shoal::net
