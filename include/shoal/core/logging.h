// Rank-prefixed logging over spdlog: "[12:03:04.511 r3/16 worker] W msg".
// Level from SHOAL_LOG_LEVEL (trace, debug, info, warn, error, off).
// Thread-safe (spdlog's mt sink).
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <string_view>

namespace shoal::log {

// Sets the rank/role shown in every line's prefix. Call once at start-up.
void set_identity(int rank, int world_size, std::string_view role);
spdlog::logger& logger();

// A budget for one kind of repeated line (a refused client, a dropped
// probe): the first `burst` of each `period` are logged, the rest counted,
// and the next line logged says how many were held back. One client
// looping on a refused connection wrote 12,427 lines in 28 s without it.
// Not thread-safe: one per loop or per object.
class LineBudget {
 public:
  explicit LineBudget(int burst = 5, std::chrono::seconds period = std::chrono::seconds(10))
      : burst_(burst), period_(period) {}
  // True when this line should be logged; `*held` is then the number held
  // back since the last line logged (0 for none).
  bool take(std::uint64_t* held);
  std::uint64_t total() const { return total_; }

 private:
  int burst_;
  std::chrono::seconds period_;
  std::chrono::steady_clock::time_point start_{};
  int used_ = 0;
  std::uint64_t held_ = 0, total_ = 0;
};

}  // namespace shoal::log

#define SHOAL_LOG_TRACE(...) ::shoal::log::logger().trace(__VA_ARGS__)
#define SHOAL_LOG_DEBUG(...) ::shoal::log::logger().debug(__VA_ARGS__)
#define SHOAL_LOG_INFO(...) ::shoal::log::logger().info(__VA_ARGS__)
#define SHOAL_LOG_WARN(...) ::shoal::log::logger().warn(__VA_ARGS__)
#define SHOAL_LOG_ERROR(...) ::shoal::log::logger().error(__VA_ARGS__)
