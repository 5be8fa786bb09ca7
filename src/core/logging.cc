#include "shoal/core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace shoal::log {
namespace {

std::once_flag g_once;
std::shared_ptr<spdlog::logger> g_logger;

void apply_pattern(const std::string& who) {
  // %L is the one-letter level; who is "r3/16 worker".
  g_logger->set_pattern(fmt::format("[%H:%M:%S.%e {}] %L %v", who));
}

void init() {
  g_logger = spdlog::stderr_color_mt("shoal");
  const char* lvl = std::getenv("SHOAL_LOG_LEVEL");
  g_logger->set_level(lvl != nullptr ? spdlog::level::from_str(lvl) : spdlog::level::info);
  apply_pattern("r0/1 main");
}

}  // namespace

spdlog::logger& logger() {
  std::call_once(g_once, init);
  return *g_logger;
}

void set_identity(int rank, int world_size, std::string_view role) {
  logger();
  apply_pattern(fmt::format("r{}/{} {}", rank, world_size, role));
}

bool LineBudget::take(std::uint64_t* held) {
  ++total_;
  const auto now = std::chrono::steady_clock::now();
  if (used_ == 0 || now - start_ >= period_) {
    start_ = now;
    used_ = 0;
  }
  if (used_ >= burst_) {
    ++held_;
    return false;
  }
  ++used_;
  *held = std::exchange(held_, 0);
  return true;
}

}  // namespace shoal::log
