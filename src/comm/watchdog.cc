#include "comm/watchdog.h"

#include <algorithm>
#include <cstdlib>

#include "shoal/core/env.h"
#include "shoal/core/logging.h"

namespace shoal::comm {
namespace {

constexpr const char* kDone = "done";

std::string beat_key(const std::string& prefix, int rank) {
  return fmt::format("{}/hb/{}", prefix, rank);
}
std::string abort_key(const std::string& prefix) { return prefix + "/hb/abort"; }

}  // namespace

Result<double> heartbeat_deadline() {
  SHOAL_ASSIGN_OR_RETURN(double s, env::get_double("SHOAL_HEARTBEAT", 15));
  if (s < 0) return invalid_argument("SHOAL_HEARTBEAT={} must be >= 0 (seconds; 0 = off)", s);
  return s;
}

Result<std::unique_ptr<Watchdog>> Watchdog::start(std::unique_ptr<net::Store> store, Options o) {
  std::unique_ptr<Watchdog> w(new Watchdog());
  if (!o.stop)
    o.stop = [](const std::string& why) {
      SHOAL_LOG_ERROR("stopping: {}", why);
      std::fflush(nullptr);
      std::_Exit(1);  // the main thread may be blocked in a collective for minutes
    };
  w->store_ = std::move(store);
  w->o_ = std::move(o);
  // A store that stops answering (its host cut off) is named within the
  // deadline, not after the store client's 30 s.
  w->store_->set_io_timeout(
      std::chrono::milliseconds(static_cast<std::int64_t>(std::max(1.0, w->o_.deadline_s) * 1000)));
  w->next_changed_ = w->store_ok_ = Clock::now();
  SHOAL_RETURN_IF_ERROR(w->store_->set(beat_key(w->o_.prefix, w->o_.rank), "0"));
  w->thread_ = std::thread([p = w.get()] { p->loop(); });
  return w;
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  (void)store_->set(beat_key(o_.prefix, o_.rank), kDone);  // not frozen: finished
}

std::string Watchdog::tick() {
  const auto now = Clock::now();
  const auto since = [&](Clock::time_point t) {
    return std::chrono::duration<double>(now - t).count();
  };
  const int next = (o_.rank + 1) % o_.world;
  Status st = store_->set(beat_key(o_.prefix, o_.rank), std::to_string(++beats_));
  Result<std::string> seen = st.ok() ? store_->peek(beat_key(o_.prefix, next)) : st;
  Result<std::string> abort = seen.ok() ? store_->peek(abort_key(o_.prefix)) : seen.status();
  if (!abort.ok()) {
    // Closed or refused: the rank serving the store has exited, as it does
    // when the job ends; this rank's own collectives report a crash. Only
    // a store that stopped answering (a timeout) is a frozen server.
    if (abort.status().code() != StatusCode::kDeadlineExceeded) {
      watching_ = false;
      return "";
    }
    return fmt::format(
        "the job's store at {} answered no heartbeat of rank {} for {:.1f} s "
        "(SHOAL_HEARTBEAT={} s; {}): the process serving it is stopped, hung or unreachable",
        o_.store_where, o_.rank, std::chrono::duration<double>(Clock::now() - store_ok_).count(),
        o_.deadline_s, abort.status().message());
  }
  store_ok_ = now;
  if (!abort->empty()) return *abort;
  if (*seen == kDone) return "";  // finished cleanly
  if (*seen != next_seen_) {
    next_seen_ = *seen;
    next_changed_ = now;
    return "";
  }
  if (since(next_changed_) <= o_.deadline_s) return "";
  // Where it runs, from its claim "pid 41 on h2 (198.18.1.2:39017, ...)".
  const Result<std::string> claim = store_->peek(fmt::format("{}/claim/{}", o_.prefix, next));
  const std::string who =
      claim.ok() && !claim->empty()
          ? fmt::format("rank {} ({})", next, claim->substr(0, claim->find(" (")))
          : fmt::format("rank {}", next);
  const std::string why = fmt::format(
      "{} sent no heartbeat for {:.1f} s (SHOAL_HEARTBEAT={} s; noticed by rank {}): it is "
      "stopped, hung or unreachable",
      who, since(next_changed_), o_.deadline_s, o_.rank);
  (void)store_->set(abort_key(o_.prefix), why);  // every rank stops, saying why
  return why;
}

void Watchdog::loop() {
  const double every = std::clamp(o_.deadline_s / 5, 0.05, 1.0);
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, std::chrono::duration<double>(every), [&] { return stop_; })) {
    lk.unlock();
    const std::string why = watching_ ? tick() : "";
    lk.lock();
    if (!why.empty() && !stop_) {
      lk.unlock();
      o_.stop(why);
      return;
    }
  }
}

}  // namespace shoal::comm
