#include "shoal/collective/registry.h"

#include <mutex>
#include <optional>
#include <vector>

namespace shoal::collective {
namespace {

struct Registered {
  comm::Communicator* c;
  bool overlap;
};
std::mutex g_mu;
std::vector<Registered>& comms() {
  static std::vector<Registered> v;
  return v;
}

// A copy: a later registration may move the vector's elements.
std::optional<Registered> lookup(std::int64_t id) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (id < 0 || id >= static_cast<std::int64_t>(comms().size())) return std::nullopt;
  return comms()[static_cast<std::size_t>(id)];
}

}  // namespace

std::int64_t register_communicator(comm::Communicator* c, bool overlap) {
  std::lock_guard<std::mutex> lk(g_mu);
  comms().push_back(Registered{c, overlap});
  return static_cast<std::int64_t>(comms().size()) - 1;
}

comm::Communicator* communicator(std::int64_t id) {
  const std::optional<Registered> r = lookup(id);
  return r ? r->c : nullptr;
}

bool overlapped(std::int64_t id) {
  const std::optional<Registered> r = lookup(id);
  return r && r->overlap;
}

}  // namespace shoal::collective
