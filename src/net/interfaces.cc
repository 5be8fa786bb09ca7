#include "shoal/net/interfaces.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "shoal/core/env.h"

namespace shoal::net {

namespace {

std::string numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  else
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  return buf;
}

std::string names_of(const std::vector<Interface>& all) {
  std::string s;
  for (const Interface& i : all)
    s += fmt::format("{}{} ({})", s.empty() ? "" : ", ", i.name, i.addr);
  return s.empty() ? "none" : s;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::size_t b = 0;
  while (b <= s.size()) {
    std::size_t e = s.find(',', b);
    if (e == std::string::npos) e = s.size();
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

// "[::1]" -> "::1": the forms a host:port string gives an IPv6 address in.
std::string unbracketed(const std::string& h) {
  return h.size() > 2 && h.front() == '[' && h.back() == ']' ? h.substr(1, h.size() - 2) : h;
}

}  // namespace

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.starts_with("127.");
}

std::string listen_address_for(const std::string& host) {
  if (is_loopback_host(host) || host.empty()) return host;
  in6_addr a6{};
  in_addr a4{};
  const std::string h = unbracketed(host);
  if (inet_pton(AF_INET, h.c_str(), &a4) == 1 || inet_pton(AF_INET6, h.c_str(), &a6) == 1)
    return host;
  return "0.0.0.0";
}

Result<std::vector<Interface>> list_interfaces() {
  ifaddrs* head = nullptr;
  if (getifaddrs(&head) != 0) return internal_error("getifaddrs: {}", std::strerror(errno));
  std::vector<Interface> v4, v6;
  for (ifaddrs* a = head; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || (a->ifa_flags & IFF_UP) == 0) continue;
    const int fam = a->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    Interface i{a->ifa_name, numeric(a->ifa_addr), (a->ifa_flags & IFF_LOOPBACK) != 0};
    if (fam == AF_INET6 && i.addr.starts_with("fe80")) continue;  // link-local: needs a scope
    (fam == AF_INET ? v4 : v6).push_back(std::move(i));
  }
  freeifaddrs(head);
  v4.insert(v4.end(), v6.begin(), v6.end());
  return v4;
}

Result<Interface> interface_by_name(const std::string& spec) {
  SHOAL_ASSIGN_OR_RETURN(std::vector<Interface> all, list_interfaces());
  std::string list = spec;
  const bool exclude = list.starts_with("^");
  if (exclude) list.erase(0, 1);
  const bool exact = list.starts_with("=");
  if (exact) list.erase(0, 1);
  const std::vector<std::string> names = split_commas(list);
  if (names.empty()) return invalid_argument("SHOAL_SOCKET_IFNAME='{}' names no interface", spec);
  for (const Interface& i : all) {
    const bool named = std::any_of(names.begin(), names.end(), [&](const std::string& n) {
      return exact ? i.name == n : i.name.starts_with(n);
    });
    if (named != exclude) return i;
  }
  return not_found("SHOAL_SOCKET_IFNAME={} selects none of this host's interfaces that are up: {}",
                   spec, names_of(all));
}

Result<Interface> interface_toward(const std::string& host_in) {
  const std::string host = unbracketed(host_in);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "9", &hints, &res); rc != 0)
    return invalid_argument("the store's host {}: {}", host, gai_strerror(rc));
  std::string local, last = "no address";
  for (addrinfo* a = res; a != nullptr && local.empty(); a = a->ai_next) {
    int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0)
      local = numeric(reinterpret_cast<const sockaddr*>(&ss));
    else
      last = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  if (local.empty()) return unavailable("no route from this host to {}: {}", host, last);
  SHOAL_ASSIGN_OR_RETURN(std::vector<Interface> all, list_interfaces());
  for (const Interface& i : all)
    if (i.addr == local) return i;
  return Interface{"?", local, is_loopback_host(local)};
}

Result<Interface> choose_interface(const std::string& store_host, std::string* why) {
  const bool remote_store = !store_host.empty() && !is_loopback_host(store_host);
  Interface chosen;
  if (auto spec = env::get("SHOAL_SOCKET_IFNAME")) {
    SHOAL_ASSIGN_OR_RETURN(chosen, interface_by_name(*spec));
    *why = fmt::format("SHOAL_SOCKET_IFNAME={}", *spec);
    // A loopback choice is refused only when the store is not this host's.
    if (chosen.loopback && remote_store) {
      auto toward = interface_toward(store_host);
      if (!toward.ok() || !toward->loopback)
        return failed_precondition(
            "SHOAL_SOCKET_IFNAME={} selects the loopback interface {} ({}), which ranks on other "
            "hosts cannot reach, while the store's address {} is not a loopback one: name an "
            "interface the hosts reach each other through",
            *spec, chosen.name, chosen.addr, store_host);
    }
    return chosen;
  }
  if (!store_host.empty()) {
    SHOAL_ASSIGN_OR_RETURN(chosen, interface_toward(store_host));
    *why = fmt::format("the route to the store's host {}", store_host);
    if (!chosen.loopback || !remote_store) return chosen;
    // The store's name is this host's and resolves to loopback here
    // (Debian's 127.0.1.1): the others know it by another address.
  }
  SHOAL_ASSIGN_OR_RETURN(std::vector<Interface> all, list_interfaces());
  for (const Interface& i : all)
    if (!i.loopback) {
      *why = store_host.empty()
                 ? "the first interface that is not loopback (the store has no host)"
                 : fmt::format(
                       "the first interface that is not loopback (the store's host {} is this "
                       "one, named by a loopback address here)",
                       store_host);
      return i;
    }
  *why = "loopback: this host has no other interface";
  return Interface{"lo", "127.0.0.1", true};
}

}  // namespace shoal::net
