// A loopback TCP port nobody listens on now: for tests whose processes
// must be told a port before one of them binds it (MASTER_PORT, torchrun's
// agent, DMLC_PS_ROOT_PORT), so that tests running in parallel do not meet
// on a fixed one.
//
// The port is drawn below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range): a port the kernel hands out
// for bind(0) is also one it hands to the next outgoing connect(), and
// tests running beside this one connect all the time, so such a port can
// be taken between this check and the job's own bind (seen in CI: the ps
// scheduler's "Address already in use"). Below the range only another
// explicit choice can take it, and the draw is random.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>

namespace shoal::testing {

inline bool port_is_free(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

inline int free_port() {
  int low = 32768;  // Linux's default start of the ephemeral range
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  if (low < 12000) low = 32768;  // an unusual range: use the default's gap
  const int first = low - 10000;
  std::mt19937 pick(std::random_device{}());
  std::uniform_int_distribution<int> in_range(first, low - 1);
  for (int tries = 0; tries < 200; ++tries) {
    const int port = in_range(pick);
    if (port_is_free(port)) return port;
  }
  return first + static_cast<int>(getpid()) % (low - first);  // all 200 taken: unlikely
}

}  // namespace shoal::testing
