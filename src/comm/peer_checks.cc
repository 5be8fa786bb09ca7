#include "comm/peer_checks.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>

#include "shoal/core/logging.h"

namespace shoal::comm {
namespace {

std::int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status send_i64(net::Socket& s, std::int64_t v, Deadline dl) {
  net::FrameHeader h;
  h.type = static_cast<std::uint16_t>(net::FrameType::kData);
  h.length = sizeof v;
  return s.send_frame(h, &v, dl);
}

Result<std::int64_t> recv_i64(net::Socket& s, Deadline dl) {
  SHOAL_ASSIGN_OR_RETURN(net::FrameHeader h, s.recv_header(sizeof(std::int64_t), dl));
  if (h.type != static_cast<std::uint16_t>(net::FrameType::kData) || h.length != 8)
    return invalid_argument("clock check with {}: expected an 8-byte data frame, got type {} of {}",
                            s.peer(), h.type, h.length);
  std::int64_t v = 0;
  SHOAL_RETURN_IF_ERROR(s.recv_all(&v, sizeof v, dl));
  return v;
}

std::string utc(std::int64_t ns) {
  std::time_t t = static_cast<std::time_t>(ns / 1000000000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

Status skew_error(int r, std::int64_t offset_ns, std::int64_t t_r, double max_skew_s) {
  const double off = static_cast<double>(offset_ns) / 1e9;  // rank 0's clock minus rank r's
  return failed_precondition(
      "rank {}'s clock is {:.1f} s {} rank 0's (rank {}: {}, rank 0: {}); ranks of one job must "
      "agree within SHOAL_MAX_CLOCK_SKEW={:g} s: fix the host's time (NTP)",
      r, std::abs(off), off > 0 ? "behind" : "ahead of", r, utc(t_r), utc(t_r + offset_ns),
      max_skew_s);
}

}  // namespace

Status check_clocks(int rank, int world, std::vector<net::Socket>& peers, double max_skew_s,
                    Deadline dl) {
  if (world < 2 || max_skew_s <= 0) return ok_status();
  const auto limit = static_cast<std::int64_t>(max_skew_s * 1e9);
  if (rank == 0) {
    Status first;
    for (int r = 1; r < world; ++r) {  // in rank order: each sends, then waits for us
      net::Socket& s = peers[static_cast<std::size_t>(r)];
      SHOAL_ASSIGN_OR_RETURN(std::int64_t t1, recv_i64(s, dl));
      (void)t1;
      SHOAL_RETURN_IF_ERROR(send_i64(s, wall_ns(), dl));
      SHOAL_ASSIGN_OR_RETURN(std::int64_t offset, recv_i64(s, dl));
      SHOAL_ASSIGN_OR_RETURN(std::int64_t t_r, recv_i64(s, dl));
      if (std::llabs(offset) > limit && first.ok()) first = skew_error(r, offset, t_r, max_skew_s);
    }
    return first;
  }
  net::Socket& s = peers[0];
  const std::int64_t t1 = wall_ns();
  SHOAL_RETURN_IF_ERROR(send_i64(s, t1, dl));
  SHOAL_ASSIGN_OR_RETURN(std::int64_t t2, recv_i64(s, dl));
  const std::int64_t t3 = wall_ns();
  const std::int64_t offset = t2 - (t1 / 2 + t3 / 2);
  SHOAL_RETURN_IF_ERROR(send_i64(s, offset, dl));
  SHOAL_RETURN_IF_ERROR(send_i64(s, t3, dl));
  if (std::llabs(offset) > limit) return skew_error(rank, offset, t3, max_skew_s);
  return ok_status();
}

Status check_one_host(const std::vector<std::string>& host_of, bool launcher_local) {
  if (!launcher_local) return ok_status();
  auto name = [](const std::string& id) { return id.substr(0, id.find('/')); };
  for (std::size_t j = 1; j < host_of.size(); ++j)
    if (host_of[j] != host_of[0])
      return failed_precondition(
          "rank {} runs on host '{}' but rank 0 runs on '{}', while the launcher started all "
          "{} ranks on one host (SHOAL_LOCAL_WORLD_SIZE={}): a rank was started elsewhere, or "
          "its hostname differs",
          j, name(host_of[j]), name(host_of[0]), host_of.size(), host_of.size());
  return ok_status();
}

}  // namespace shoal::comm
