#include "shoal/net/shm.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/futex.h>
#include <sodium.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>

namespace shoal::net {

namespace {
// A futex shared between processes (the word is in a MAP_SHARED segment,
// so not FUTEX_PRIVATE).
long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, val, ts, nullptr, 0);
}
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
}  // namespace

void ShmRing::ring_bell() {
  // seq_cst pairs with sleep(): either the sleeper sees the new bell value
  // (FUTEX_WAIT returns at once) or this side sees the sleeper and wakes it.
  h_->bell.fetch_add(1, std::memory_order_seq_cst);
  if (h_->sleepers.load(std::memory_order_seq_cst) != 0)
    futex(&h_->bell, FUTEX_WAKE, INT32_MAX, nullptr);
}

void ShmRing::sleep(std::uint32_t seen, long timeout_us) {
  h_->sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (h_->bell.load(std::memory_order_seq_cst) == seen) {
    timespec ts{timeout_us / 1000000, (timeout_us % 1000000) * 1000};
    futex(&h_->bell, FUTEX_WAIT, seen, &ts);
  }
  h_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

std::size_t ShmRing::write_some(const void* p, std::size_t n) {
  const std::uint64_t cap = h_->capacity;
  const std::uint64_t head = h_->head.load(std::memory_order_relaxed);
  const std::uint64_t tail = h_->tail.load(std::memory_order_acquire);
  std::size_t k = std::min<std::uint64_t>(n, cap - (head - tail));
  if (k == 0) return 0;
  std::size_t at = head & (cap - 1), first = std::min<std::size_t>(k, cap - at);
  std::memcpy(data_ + at, p, first);
  if (k > first) std::memcpy(data_, static_cast<const std::uint8_t*>(p) + first, k - first);
  h_->head.store(head + k, std::memory_order_release);
  ring_bell();
  return k;
}

std::size_t ShmRing::read_some(void* p, std::size_t n) {
  const std::uint64_t cap = h_->capacity;
  const std::uint64_t tail = h_->tail.load(std::memory_order_relaxed);
  const std::uint64_t head = h_->head.load(std::memory_order_acquire);
  std::size_t k = std::min<std::uint64_t>(n, head - tail);
  if (k == 0) return 0;
  std::size_t at = tail & (cap - 1), first = std::min<std::size_t>(k, cap - at);
  std::memcpy(p, data_ + at, first);
  if (k > first) std::memcpy(static_cast<std::uint8_t*>(p) + first, data_, k - first);
  h_->tail.store(tail + k, std::memory_order_release);
  ring_bell();
  return k;
}

namespace {
std::size_t round_pow2(std::size_t v) {
  std::size_t p = 4096;
  while (p < v) p <<= 1;
  return p;
}
// Layout: [hdr A->B][hdr B->A][data A->B][data B->A]; the creator is A.
constexpr std::size_t kHdr = sizeof(ShmRing::Header);
}  // namespace

Result<std::unique_ptr<ShmChannel>> ShmChannel::map(int fd, std::string name, bool creator,
                                                    std::size_t bytes) {
  std::size_t cap = bytes;
  if (!creator) {
    struct stat st {};
    if (fstat(fd, &st) != 0) return unavailable("shm {}: fstat: {}", name, std::strerror(errno));
    if (static_cast<std::size_t>(st.st_size) < 2 * kHdr)
      return invalid_argument("shm {}: segment of {} bytes is too small", name, st.st_size);
    cap = (static_cast<std::size_t>(st.st_size) - 2 * kHdr) / 2;
  }
  std::size_t size = 2 * kHdr + 2 * cap;
  if (creator && ftruncate(fd, static_cast<off_t>(size)) != 0)
    return unavailable("shm {}: ftruncate {} bytes: {}", name, size, std::strerror(errno));
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return unavailable("shm {}: mmap: {}", name, std::strerror(errno));
  std::unique_ptr<ShmChannel> c(new ShmChannel());
  c->name_ = std::move(name);
  c->base_ = base;
  c->size_ = size;
  c->linked_ = creator;
  auto* b = static_cast<std::uint8_t*>(base);
  auto* h0 = reinterpret_cast<ShmRing::Header*>(b);
  auto* h1 = reinterpret_cast<ShmRing::Header*>(b + kHdr);
  if (creator) {
    new (h0) ShmRing::Header();
    new (h1) ShmRing::Header();
    h0->capacity = h1->capacity = cap;
  } else if (h0->capacity != cap || h1->capacity != cap) {
    return invalid_argument("shm {}: header capacity {} does not match segment size", c->name_,
                            h0->capacity);
  }
  ShmRing r0(h0, b + 2 * kHdr), r1(h1, b + 2 * kHdr + cap);
  c->tx_ = creator ? r0 : r1;
  c->rx_ = creator ? r1 : r0;
  return c;
}

Result<std::unique_ptr<ShmChannel>> ShmChannel::create(std::size_t bytes) {
  unsigned char rnd[8];
  randombytes_buf(rnd, sizeof rnd);
  std::string name = "/shoal-";
  for (unsigned char c : rnd) name += fmt::format("{:02x}", c);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return unavailable("shm_open {}: {}", name, std::strerror(errno));
  auto c = map(fd, name, true, round_pow2(bytes));
  if (!c.ok()) shm_unlink(name.c_str());
  return c;
}

Result<std::unique_ptr<ShmChannel>> ShmChannel::open(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos)
    return invalid_argument("shm name '{}' is not of the form /name", name);
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return unavailable("shm_open {}: {}", name, std::strerror(errno));
  return map(fd, name, false, 0);
}

void ShmChannel::unlink() {
  if (linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

ShmChannel::~ShmChannel() {
  unlink();
  if (base_ != nullptr) munmap(base_, size_);
}

std::string host_identity() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  // What decides whether two processes can share memory, not what they are
  // called: the IPC and PID namespaces (System V, CMA by pid) and the
  // /dev/shm instance (POSIX shm_open). Two containers or namespaced hosts
  // with one hostname on one kernel differ here.
  auto ns = [](const char* which) {
    char buf[64] = {0};
    const std::string path = std::string("/proc/self/ns/") + which;
    const ssize_t n = readlink(path.c_str(), buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("?");
  };
  struct stat st {};
  const std::string shm_dev =
      stat("/dev/shm", &st) == 0 ? std::to_string(static_cast<unsigned long long>(st.st_dev)) : "?";
  return fmt::format("{}/{}/{}/{}/shm:{}", host, boot, ns("ipc"), ns("pid"), shm_dev);
}

}  // namespace shoal::net
