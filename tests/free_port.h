// A loopback TCP port nobody listens on now: for tests whose processes
// must be told a port before one of them binds it (MASTER_PORT, torchrun's
// agent, DMLC_PS_ROOT_PORT), so that tests running in parallel do not meet
// on a fixed one.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace shoal::testing {

inline int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port > 0 ? port : 20000 + getpid() % 10000;
}

}  // namespace shoal::testing
