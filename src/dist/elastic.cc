#include "shoal/dist/elastic.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <numeric>
#include <thread>

#include "dist/job_store.h"
#include "shoal/core/elastic_keys.h"
#include "shoal/core/env.h"
#include "shoal/core/launch_env.h"
#include "shoal/core/logging.h"
#include "shoal/dist/job.h"
#include "shoal/net/retry.h"
#include "shoal/net/store.h"

namespace shoal::dist {

namespace keys = elastic_keys;

namespace {

Result<std::unique_ptr<net::Store>> connect_store() { return connect_job_store(10); }

// SHOAL_ELASTIC=join: an id from the store's counter, and the job's sizes.
Result<std::optional<ElasticEnv>> claim_place() {
  // The launcher may start after the ranks (a Kubernetes pod before another):
  // a refused connection is tried again for 120 s.
  SHOAL_ASSIGN_OR_RETURN(LaunchEnv le, launch_env());
  auto store = net::connect_with_retries(le.store, 120, "SHOAL_ELASTIC=join",
                                         [] { return connect_job_store(10); });
  if (!store.ok()) return store.status();
  const auto read = [&](const std::string& key) -> Result<std::int64_t> {
    SHOAL_ASSIGN_OR_RETURN(std::string v, (*store)->peek(key));
    if (v.empty())
      return failed_precondition(
          "SHOAL_ELASTIC=join: the store holds no elastic job ('{}' is unset): is it served by "
          "`shoal run --engine external --elastic MIN[:MAX]`?",
          key);
    return env::parse_int(v, key.c_str());
  };
  // Only a launcher that starts no rank takes ranks that claim their ids.
  // Its store answers a moment before it has written the job's keys
  // (`claims` last): a rank that came in between waited for nobody and
  // left with code 2 (seen under load: the pods then formed a generation
  // with a dead member). So `claims` is waited for, 15 s (a get that runs
  // out closes the connection: nothing is read from it after that).
  auto got = (*store)->get(keys::claims(), Deadline::after_seconds(15));
  if (!got.ok() && got.status().code() == StatusCode::kDeadlineExceeded)
    return failed_precondition(
        "SHOAL_ELASTIC=join: the store holds no elastic job (waited 15 s for '{}'): is it "
        "served by `shoal run --engine external --elastic MIN[:MAX]`?",
        keys::claims());
  if (!got.ok()) return got.status();
  const std::string& claims = *got;
  if (claims != "yes")
    return failed_precondition(
        "SHOAL_ELASTIC=join: this job's launcher starts its own ranks (shoal run's local or "
        "srun engine), so a rank started elsewhere has no place in it: ask the launcher for "
        "more with `shoal join --job DIR --ranks K`, or run the job with --engine external");
  ElasticEnv e;
  SHOAL_ASSIGN_OR_RETURN(std::int64_t min, read(keys::min()));
  SHOAL_ASSIGN_OR_RETURN(std::int64_t max, read(keys::max()));
  SHOAL_ASSIGN_OR_RETURN(std::int64_t world, read(keys::world()));
  SHOAL_ASSIGN_OR_RETURN(std::int64_t next, (*store)->add(keys::ids(), 1));
  e.min = static_cast<int>(min);
  e.max = static_cast<int>(max);
  e.world = static_cast<int>(world);
  e.id = static_cast<int>(next - 1);
  e.joining = e.id >= e.world;
  e.rank = e.joining ? 0 : e.id;
  e.claimed = true;
  // The variables every later reader of the rank takes (launch_env); a
  // Kubernetes pod's own RANK says nothing here.
  setenv("SHOAL_RANK", std::to_string(e.rank).c_str(), 1);
  setenv("SHOAL_WORLD_SIZE", std::to_string(e.world).c_str(), 1);
  unsetenv("SHOAL_LOCAL_RANK");
  unsetenv("SHOAL_LOCAL_WORLD_SIZE");
  SHOAL_LOG_INFO("elastic rank id {} claimed: {}", e.id,
                 e.joining ? std::string("a newcomer, admitted at a step boundary")
                           : fmt::format("rank {} of the first {}", e.rank, e.world));
  return std::optional<ElasticEnv>(e);
}

}  // namespace

Result<std::optional<ElasticEnv>> elastic_env() {
  const auto min = env::get("SHOAL_ELASTIC");
  if (!min) return std::optional<ElasticEnv>{};
  if (*min == "join") return claim_place();
  ElasticEnv e;
  SHOAL_ASSIGN_OR_RETURN(std::int64_t m, env::get_int("SHOAL_ELASTIC", 0));
  SHOAL_ASSIGN_OR_RETURN(std::int64_t g, env::get_int("SHOAL_ELASTIC_GENERATION", 0));
  SHOAL_ASSIGN_OR_RETURN(LaunchEnv le, launch_env());
  if (m < 1 || m > le.world)
    return invalid_argument("SHOAL_ELASTIC={} must be in [1, {}] (the job's ranks)", m, le.world);
  // shoal run's store (its local or srun engine) comes with the job's token.
  if (le.store.empty() || !env::get("SHOAL_JOB_TOKEN"))
    return failed_precondition(
        "SHOAL_ELASTIC is set, but not by `shoal run --elastic`: an elastic job's membership is "
        "kept by shoal run's store (srun, mpirun and torchrun restart the whole job instead)");
  e.min = static_cast<int>(m);
  SHOAL_ASSIGN_OR_RETURN(std::int64_t most, env::get_int("SHOAL_ELASTIC_MAX", le.world));
  if (most < le.world || most > 65535)
    return invalid_argument("SHOAL_ELASTIC_MAX={} must be in [{}, 65535] (the job's ranks)", most,
                            le.world);
  e.max = static_cast<int>(most);
  SHOAL_ASSIGN_OR_RETURN(std::int64_t id, env::get_int("SHOAL_ELASTIC_ID", le.rank));
  SHOAL_ASSIGN_OR_RETURN(e.joining, env::get_bool("SHOAL_ELASTIC_JOIN", false));
  e.id = static_cast<int>(id);
  e.generation = static_cast<int>(g);
  e.one_host = env::get("SHOAL_LOCAL_WORLD_SIZE").has_value();
  e.rank = le.rank;
  e.world = le.world;
  return std::optional<ElasticEnv>(e);
}

Status check_elastic(const ElasticEnv& e, const JoinOptions& j, std::int64_t global) {
  if (j.dist == "ps")
    return invalid_argument(
        "--elastic is data parallelism's (a parameter-server job tolerates workers that come "
        "and go with --ps-elastic)");
  if (j.dp.zero > 2 || j.layout.tp > 1 || j.layout.pp > 1)
    return invalid_argument(
        "--elastic keeps whole copies of the parameters on every rank: {} not built for it yet "
        "(--zero 1 and 2 are; or use --max-restarts, which resumes any layout)",
        j.dp.zero > 2 ? "--zero 3 (parameters in shards) is" : "--tp and --pp are");
  const int most = std::max(e.max, e.world);
  // Micro-batches need every world's share to split into them: even shares
  // (uneven ones are weighted per rank, not per micro-batch).
  if (const int mb = micro_batches(j.layout); mb > 1) {
    std::vector<int> bad;
    std::int64_t every = mb;  // the least global batch that works for every size
    for (int w = e.min; w <= most; ++w) {
      if (global % w != 0 || (global / w) % mb != 0) bad.push_back(w);
      every = std::lcm(every, static_cast<std::int64_t>(w) * mb);
    }
    if (!bad.empty())
      return invalid_argument(
          "--elastic {}:{} with --micro-batches {}: the global batch {} does not split into "
          "{} equal micro-batches on each of {} ranks; choose a global batch that is a multiple "
          "of {}",
          e.min, most, mb, global, mb, keys::join_ids(bad), every);
  }
  if (global < most)
    return invalid_argument(
        "--elastic {}:{}: the global batch {} is fewer samples than the {} ranks the job may "
        "grow to (each trains on at least one)",
        e.min, most, global, most);
  return ok_status();
}

namespace {

// Enters generation `g` as rank `rank` of `world`. Under shoal run's local
// engine every rank is on this host; under srun they may be anywhere, and
// the communicator finds which share a host.
void enter(ElasticEnv& e, int g, int rank, int world) {
  setenv("SHOAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("SHOAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
  if (e.one_host) {
    setenv("SHOAL_LOCAL_RANK", std::to_string(rank).c_str(), 1);
    setenv("SHOAL_LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
  }
  setenv("SHOAL_ELASTIC_GENERATION", std::to_string(g).c_str(), 1);
  setenv("SHOAL_COMM_PREFIX", fmt::format("shoal/g{}", g).c_str(), 1);
  log::set_identity(rank, world, "comm");
  e.generation = g;
  e.rank = rank;
  e.world = world;
}

}  // namespace

namespace {

// Waits for a generation after `after` that lists e.id, and enters it.
// `step`: the state this rank holds (-1: none, a newcomer).
Result<std::string> await_generation(net::Store& store, ElasticEnv& e, int after, std::int64_t step,
                                     double wait_s) {
  const Deadline dl = Deadline::after_seconds(wait_s);
  int seen = after;
  while (true) {
    if (dl.expired())
      return deadline_exceeded(
          "rank id {} waited {} s for a generation after {} that lists it; the launcher formed "
          "none",
          e.id, wait_s, after);
    SHOAL_ASSIGN_OR_RETURN(std::string now, store.peek(keys::key("gen")));
    if (now == "end") {
      auto why = store.peek(keys::key("end_why"));
      return aborted("the launcher ended the job: {}", why.ok() ? *why : "(no reason stored)");
    }
    const int g = now.empty() ? seen : std::atoi(now.c_str());
    if (g <= seen) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    seen = g;
    SHOAL_ASSIGN_OR_RETURN(std::string listed, store.peek(keys::members(g)));
    SHOAL_ASSIGN_OR_RETURN(std::vector<int> ids, keys::parse_ids(listed));
    const auto me = std::find(ids.begin(), ids.end(), e.id);
    if (me == ids.end()) {
      if (step < 0) continue;  // a newcomer not admitted yet
      return aborted(
          "rank id {} was dropped from the job at generation {} (its members: {}): it is stale "
          "and writes nothing more",
          e.id, g, listed);
    }
    const int rank = static_cast<int>(me - ids.begin());
    auto read_note = store.peek(keys::note(g));
    const std::string note = read_note.ok() ? *read_note : "";
    if (step >= 0)
      SHOAL_LOG_WARN("generation {}: continuing as rank {} of {} from step {} ({})", g, rank,
                     ids.size(), step, note);
    else
      SHOAL_LOG_WARN("generation {}: joining as rank {} of {} ({})", g, rank, ids.size(), note);
    enter(e, g, rank, static_cast<int>(ids.size()));
    nlohmann::json rec = {{"kind", "membership"}, {"generation", g}, {"world", ids.size()},
                          {"members", ids},       {"step", step},    {"why", note}};
    // Who left and who joined: the ids of the generation before, compared.
    auto before = store.peek(keys::members(g - 1));
    auto was = before.ok() && !before->empty() ? keys::parse_ids(*before)
                                               : Result<std::vector<int>>(std::vector<int>());
    if (was.ok() && !was->empty()) {
      std::vector<int> left, joined;
      for (int id : *was)
        if (std::find(ids.begin(), ids.end(), id) == ids.end()) left.push_back(id);
      for (int id : ids)
        if (std::find(was->begin(), was->end(), id) == was->end()) joined.push_back(id);
      rec["left"] = left;
      rec["joined"] = joined;
    }
    return rec.dump();
  }
}

}  // namespace

Result<std::string> next_generation(ElasticEnv& e, std::int64_t step, double wait_s) {
  SHOAL_ASSIGN_OR_RETURN(auto store, connect_store());
  SHOAL_RETURN_IF_ERROR(store->set(keys::check_in(e.generation, e.id), std::to_string(step))
                            .with_context("checking in"));
  return await_generation(*store, e, e.generation, step, wait_s);
}

Result<std::string> admit(ElasticEnv& e, double wait_s) {
  SHOAL_ASSIGN_OR_RETURN(auto store, connect_store());
  SHOAL_ASSIGN_OR_RETURN(std::string now, store->peek(keys::key("gen")));
  SHOAL_RETURN_IF_ERROR(store->set(keys::join(e.id), "ready").with_context("announcing"));
  SHOAL_LOG_INFO("rank id {} waits to join the job (generation {} trains)", e.id, now);
  return await_generation(*store, e, now.empty() ? 0 : std::atoi(now.c_str()), -1, wait_s);
}

Result<std::unique_ptr<RegroupWatch>> RegroupWatch::start(int generation) {
  std::unique_ptr<RegroupWatch> w(new RegroupWatch());
  SHOAL_ASSIGN_OR_RETURN(w->store_, connect_store());
  w->generation_ = generation;
  w->thread_ = std::thread([p = w.get()] { p->loop(); });
  return w;
}

RegroupWatch::~RegroupWatch() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RegroupWatch::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, std::chrono::milliseconds(200), [&] { return stop_; })) {
    lk.unlock();
    auto v = store_->peek(keys::regroup(generation_));
    if (v.ok() && !v->empty()) asked_.store(true, std::memory_order_relaxed);
    lk.lock();
    if (asked_.load(std::memory_order_relaxed)) return;  // asked once is enough
  }
}

Result<std::unique_ptr<ElasticLease>> ElasticLease::start(int id) {
  std::unique_ptr<ElasticLease> l(new ElasticLease());
  SHOAL_ASSIGN_OR_RETURN(l->store_, connect_store());
  // A store that stops answering (its host cut off) must not hold the
  // thread, and so the rank's exit, for the client's 30 s.
  l->store_->set_io_timeout(std::chrono::seconds(2));
  l->id_ = id;
  SHOAL_RETURN_IF_ERROR(l->store_->add(keys::alive(id), 1).status().with_context("the lease"));
  l->thread_ = std::thread([p = l.get()] { p->loop(); });
  return l;
}

void ElasticLease::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

ElasticLease::~ElasticLease() { stop(); }

void ElasticLease::end(int code) {
  stop();
  (void)store_->set(keys::exit(id_), std::to_string(code));
}

void ElasticLease::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, std::chrono::milliseconds(500), [&] { return stop_; })) {
    lk.unlock();
    (void)store_->add(keys::alive(id_), 1);  // unreachable: the launcher sees it stop
    lk.lock();
  }
}

}  // namespace shoal::dist
