// Rank-prefixed logging over spdlog: "[12:03:04.511 r3/16 worker] W msg".
// Level from SHOAL_LOG_LEVEL (trace, debug, info, warn, error, off).
// Thread-safe (spdlog's mt sink).
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

namespace shoal::log {

// Sets the rank/role shown in every line's prefix. Call once at start-up.
void set_identity(int rank, int world_size, std::string_view role);
spdlog::logger& logger();

}  // namespace shoal::log

#define SHOAL_LOG_TRACE(...) ::shoal::log::logger().trace(__VA_ARGS__)
#define SHOAL_LOG_DEBUG(...) ::shoal::log::logger().debug(__VA_ARGS__)
#define SHOAL_LOG_INFO(...) ::shoal::log::logger().info(__VA_ARGS__)
#define SHOAL_LOG_WARN(...) ::shoal::log::logger().warn(__VA_ARGS__)
#define SHOAL_LOG_ERROR(...) ::shoal::log::logger().error(__VA_ARGS__)
