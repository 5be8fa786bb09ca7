// Which of this host's network interfaces a process listens on and
// advertises to its peers, chosen as NCCL and Gloo users expect:
// SHOAL_SOCKET_IFNAME names it (as NCCL_SOCKET_IFNAME: a comma-separated
// list of name prefixes, `^` before the list excludes them, `=` before it
// asks for exact names); otherwise the interface the kernel routes to the
// store's host through, so ranks on one host keep loopback and ranks on
// several hosts get the address their peers can reach.
#pragma once

#include <string>
#include <vector>

#include "shoal/core/status.h"

namespace shoal::net {

struct Interface {
  std::string name;  // "eth0"
  std::string addr;  // numeric IPv4 or IPv6 address
  bool loopback = false;
};

// The up interfaces with an address, IPv4 before IPv6, in the kernel's order.
Result<std::vector<Interface>> list_interfaces();

// The first interface that `spec` (SHOAL_SOCKET_IFNAME's syntax) selects;
// an error lists the interfaces there are.
Result<Interface> interface_by_name(const std::string& spec);

// The interface whose address the kernel picks to reach `host` (no packet
// is sent: a UDP socket is connected and asked for its own address).
Result<Interface> interface_toward(const std::string& host);

// SHOAL_SOCKET_IFNAME if set, else the route toward `store_host`, else
// (no store host: a file store) the first interface that is not loopback.
// Loopback is refused when the store is on another host: peers there could
// not reach it. `why` says how the choice was made.
Result<Interface> choose_interface(const std::string& store_host, std::string* why);

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_host(const std::string& host);

// Where a server that others reach as `host` listens: that address when it
// is numeric (or loopback), every interface when it is a name, since this
// host may resolve its own name to 127.0.1.1 (Debian's /etc/hosts) while
// the others resolve it to an address they can reach.
std::string listen_address_for(const std::string& host);

}  // namespace shoal::net
