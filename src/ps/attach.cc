// A worker joining a parameter-server job and a trainer wired to it.
#include "shoal/ps/attach.h"

#include <chrono>
#include <thread>

#include "ps/residuals.h"
#include "ps/store_peers.h"
#include "ps/worker_job.h"
#include "shoal/comm/communicator.h"
#include "shoal/core/env.h"
#include "shoal/core/logging.h"
#include "shoal/core/ps_keys.h"
#include "shoal/net/interfaces.h"
#include "shoal/net/socket.h"

namespace shoal::ps {

std::string default_listen_host(const std::string& root_host) {
  return root_host.empty() || net::is_loopback_host(root_host) ? "127.0.0.1" : "0.0.0.0";
}

Result<int> role_count(const char* name) {
  SHOAL_ASSIGN_OR_RETURN(std::int64_t v, env::get_int(name, -1));
  if (v < 1)
    return invalid_argument("{}={} must be a number >= 1 in a parameter-server job", name,
                            env::get(name).value_or("(unset)"));
  return static_cast<int>(v);
}

Status agree_on_counts(net::Store& s, int num_servers, int num_workers, std::string_view who) {
  const std::string mine =
      fmt::format("DMLC_NUM_SERVER={} DMLC_NUM_WORKER={}", num_servers, num_workers);
  SHOAL_ASSIGN_OR_RETURN(std::string first,
                         s.compare_set(ps_keys::kCounts, "", fmt::format("{}|{}", mine, who)));
  const auto bar = first.find('|');
  const std::string theirs = first.substr(0, bar);
  if (theirs == mine) return ok_status();
  return failed_precondition(
      "{} has {}, but the job's first role ({}) has {}: every role of a parameter-server job "
      "must be started with the same counts",
      who, mine, bar == std::string::npos ? "?" : first.substr(bar + 1), theirs);
}

bool in_ps_job() { return env::get("DMLC_ROLE").has_value(); }

Result<std::unique_ptr<net::Store>> connect_scheduler(const JobEnv& e) {
  SHOAL_ASSIGN_OR_RETURN(auto hp, net::split_host_port(e.root, "the ps scheduler"));
  const Deadline dl = Deadline::after_seconds(e.timeout_s);
  for (int wait_ms = 10;; wait_ms = std::min(wait_ms * 2, 500)) {
    auto s = net::TcpStore::connect(hp.first, hp.second, dl, e.token);
    if (s.ok()) {
      std::unique_ptr<net::Store> store(std::move(s).value());
      SHOAL_RETURN_IF_ERROR(
          agree_on_counts(*store, e.num_servers, e.num_workers,
                          fmt::format("this {}", e.role.empty() ? "worker" : e.role)));
      return store;
    }
    if (s.status().code() != StatusCode::kUnavailable || dl.expired())
      return s.status().with_context("reaching the ps scheduler");
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
  }
}

ShardOptions shard_options(const train::TrainOptions& t, Mode mode, int staleness) {
  ShardOptions o;
  o.mode = mode;
  o.staleness = staleness;
  o.optimizer.name = t.optimizer;
  o.optimizer.momentum = t.momentum;
  o.optimizer.weight_decay = t.weight_decay;
  o.optimizer.trust = t.trust;
  o.lr = t.lr;
  return o;
}

std::string server_key(int i) { return ps_keys::server(i); }

Result<JobEnv> job_env() {
  JobEnv e;
  e.role = env::get("DMLC_ROLE").value_or("");
  if (!e.role.empty() && e.role != "worker" && e.role != "server" && e.role != "scheduler")
    return invalid_argument("DMLC_ROLE={} is not one of worker, server, scheduler", e.role);
  auto uri = env::get("DMLC_PS_ROOT_URI"), port = env::get("DMLC_PS_ROOT_PORT");
  if (uri.has_value() != port.has_value())
    return invalid_argument("DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT go together; only {} is set",
                            uri ? "DMLC_PS_ROOT_URI" : "DMLC_PS_ROOT_PORT");
  if (uri) {
    e.root = *uri + ":" + *port;
  } else if (auto s = env::get("SHOAL_STORE")) {
    e.root = *s;
  } else {
    return invalid_argument(
        "a parameter-server job needs its scheduler's address: DMLC_PS_ROOT_URI and "
        "DMLC_PS_ROOT_PORT (or SHOAL_STORE)");
  }
  SHOAL_RETURN_IF_ERROR(net::split_host_port(e.root, "the ps scheduler").status());
  SHOAL_ASSIGN_OR_RETURN(e.num_servers, role_count("DMLC_NUM_SERVER"));
  SHOAL_ASSIGN_OR_RETURN(e.num_workers, role_count("DMLC_NUM_WORKER"));
  SHOAL_ASSIGN_OR_RETURN(e.timeout_s, env::get_double("SHOAL_COMM_TIMEOUT", 300));
  SHOAL_RETURN_IF_ERROR(read_server_env(e));
  SHOAL_ASSIGN_OR_RETURN(e.in_place, env::get_bool("SHOAL_PS_SHM", true));
  return e;
}

Status read_server_env(JobEnv& e) {
  e.token = env::get("SHOAL_JOB_TOKEN").value_or("");
  SHOAL_ASSIGN_OR_RETURN(e.heartbeat_s, env::get_double("SHOAL_PS_HEARTBEAT", 30));
  if (e.heartbeat_s < 0)
    return invalid_argument("SHOAL_PS_HEARTBEAT={} must be >= 0 (0 = off)", e.heartbeat_s);
  SHOAL_ASSIGN_OR_RETURN(e.slice_bound, slice_bound_env());
  return ok_status();
}

Result<std::int64_t> slice_bound_env() {
  SHOAL_ASSIGN_OR_RETURN(std::int64_t b, env::get_int("MXNET_KVSTORE_BIGARRAY_BOUND", 1000000));
  if (b < 0)
    return invalid_argument("MXNET_KVSTORE_BIGARRAY_BOUND={} must be >= 0 (0 = never slice)", b);
  return b;
}

Result<std::unique_ptr<WorkerJob>> WorkerJob::join(const JobEnv& e, const ShardOptions& o) {
  std::unique_ptr<WorkerJob> j(new WorkerJob());
  j->env_ = e;
  j->o_ = o;
  j->impl_ = std::make_unique<Impl>();
  Impl& m = *j->impl_;
  m.mode = o.mode;
  SHOAL_ASSIGN_OR_RETURN(m.delay_ms, env::get_double("SHOAL_PS_DELAY_MS", 0));
  m.timeout_s = e.timeout_s;
  const Deadline dl = Deadline::after_seconds(e.timeout_s);
  SHOAL_ASSIGN_OR_RETURN(m.store, connect_scheduler(e));
  // The launcher reads the mode to decide what a failed worker means.
  SHOAL_RETURN_IF_ERROR(m.store->set(ps_keys::kMode, mode_name(o.mode)));
  // The id `shoal run --ps` chose (so that its labels match), else the
  // next from the job's counter (a worker started by hand, or joining late).
  SHOAL_ASSIGN_OR_RETURN(std::int64_t next, m.store->add(ps_keys::kWorkers, 1));
  SHOAL_ASSIGN_OR_RETURN(std::int64_t hint, env::get_int("SHOAL_PS_WORKER_ID", next - 1));
  const int id = static_cast<int>(hint);
  std::vector<std::string> servers;
  for (int i = 0; i < e.num_servers; ++i) {
    auto addr = m.store->get(server_key(i), dl);
    if (!addr.ok())
      return addr.status().with_context(fmt::format(
          "worker {}: waiting for parameter server {} of {} to register", id, i, e.num_servers));
    servers.push_back(*addr);
  }
  SHOAL_ASSIGN_OR_RETURN(m.worker, Worker::connect(servers, e.token, id, dl, &o));
  m.worker->set_in_place(e.in_place);
  int mapped = 0;
  for (int i = 0; i < e.num_servers; ++i) mapped += m.worker->in_place(i) ? 1 : 0;
  SHOAL_LOG_INFO("worker {}: push-pulls in shared memory with {} of {} parameter servers{}", id,
                 e.in_place ? mapped : 0, e.num_servers, e.in_place ? "" : " (SHOAL_PS_SHM=0)");
  // A server restarted from its snapshot registers its new address; the
  // client thread waits for it on a store connection of its own.
  m.worker->set_resolver([e](int i, const std::string& old) -> Result<std::string> {
    SHOAL_ASSIGN_OR_RETURN(auto store, connect_scheduler(e));
    const Deadline until = Deadline::after_seconds(e.timeout_s);
    while (!until.expired()) {
      SHOAL_ASSIGN_OR_RETURN(std::string addr, store->peek(server_key(i)));
      if (!addr.empty() && addr != old) return addr;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return deadline_exceeded("parameter server {} (was {}) did not come back within {} s", i, old,
                             e.timeout_s);
  });
  if (e.heartbeat_s > 0) {
    // Beating from the moment this worker is a member: waiting for the
    // quorum below is not silence (a worker started 40 s before its peer
    // was dropped as frozen, and the job blamed it). A restarted server
    // registers a new address: heartbeats go there too.
    auto lookup = [store = std::shared_ptr<net::Store>(), e](int i) mutable -> std::string {
      if (!store) {
        auto s = connect_scheduler(e);
        if (!s.ok()) return "";
        store = std::move(s).value();
      }
      auto addr = store->peek(server_key(i));
      return addr.ok() ? *addr : "";
    };
    SHOAL_ASSIGN_OR_RETURN(m.heartbeat, Heartbeat::start(servers, e.token, id, e.heartbeat_s / 4,
                                                         e.heartbeat_s, lookup));
    // A server that answers no heartbeat within the deadline a worker has
    // (SHOAL_PS_HEARTBEAT) is named, instead of the wait running out.
    m.worker->set_silence([hb = m.heartbeat.get()](std::size_t i) { return hb->silent(i); });
  }
  // Sync rounds count the workers live when they open: none may open
  // before the whole quorum has joined.
  if (o.mode == Mode::kSync && id < e.num_workers) {
    SHOAL_RETURN_IF_ERROR(m.store->set(ps_keys::joined(id), "1"));
    std::vector<std::string> all;
    for (int w = 0; w < e.num_workers; ++w) all.push_back(ps_keys::joined(w));
    SHOAL_RETURN_IF_ERROR(m.store->wait(all, dl).with_context(fmt::format(
        "worker {}: waiting for all {} workers to join the sync job", id, e.num_workers)));
  }
  m.peers = make_store_peers(*m.store, id, e.num_workers, o.mode == Mode::kSync, e.timeout_s);
  register_push_pull_op();
  m.id = register_job(&m);
  m.start_thread();
  SHOAL_LOG_INFO("worker {} joined {} parameter server{} ({}{})", id, servers.size(),
                 servers.size() == 1 ? "" : "s", mode_name(o.mode),
                 id >= e.num_workers ? ", beyond the first DMLC_NUM_WORKER: a late joiner" : "");
  return j;
}

WorkerJob::~WorkerJob() {
  if (!impl_) return;
  impl_->stop_thread();
  if (impl_->worker) impl_->worker->set_silence({});  // it asks the heartbeat
  impl_->heartbeat.reset();
  unregister_job(impl_->id);
  if (impl_->worker) (void)impl_->worker->leave();
  if (impl_->store && impl_->writer && impl_->worker)  // whoever joins next writes
    (void)impl_->store->compare_set(ps_keys::kWriter, std::to_string(impl_->worker->id()), "");
  if (impl_->store) (void)impl_->store->add(ps_keys::kLeft, 1);  // the scheduler counts
}

int WorkerJob::worker() const { return impl_->worker->id(); }

// The worker's share of the data (id mod DMLC_NUM_WORKER) and its rank.
// A job has one writer of checkpoints and reports, rank 0's duties
// (ps_keys::kWriter): worker 0, or, once it is gone, the first later worker
// (a replacement, or one asked for by `shoal ps join`, whose id would
// repeat a live worker's rank) to take the free duty; that one continues
// the job's checkpoints (their steps and data position, as --resume)
// where it would have refused their directory. Before, every later worker
// whose id came out as rank 0 wrote into the same --out and died.
Status WorkerJob::take_ranks(train::TrainOptions& t, int id) {
  Impl& m = *impl_;
  const int n = env_.num_workers;
  t.data_rank = id % n;
  t.data_world = n;
  t.rank = id % n;
  t.world = n;
  const std::string me = std::to_string(id);
  if (id == 0) {
    SHOAL_RETURN_IF_ERROR(m.store->set(ps_keys::kWriter, me));
    m.writer = true;
    return ok_status();
  }
  if (id < n) return ok_status();
  SHOAL_ASSIGN_OR_RETURN(std::string holder, m.store->compare_set(ps_keys::kWriter, "", me));
  if (holder == me) {
    SHOAL_LOG_INFO("worker {}: writes the job's checkpoints (no other worker does now)", id);
    m.writer = true;
    t.rank = 0;
    t.resume = true;
  } else if (t.rank == 0) {
    t.rank = 1;  // worker {holder} writes
    t.world = std::max(n, 2);
  }
  return ok_status();
}

Status WorkerJob::attach(train::TrainOptions& t) {
  Impl& m = *impl_;
  const int id = worker();
  SHOAL_RETURN_IF_ERROR(take_ranks(t, id));
  t.peers = m.peers;
  // The step's arena in shared memory: a server on this host reads each
  // gradient from it and writes each new value into it (Worker::set_in_place).
  if (env_.in_place) t.arena_allocator = comm::Communicator::shared_arena;
  t.update_pass = [this](graph::Builder& b, const std::vector<train::ParamRef>& params) {
    return inject_push_pull(b, params, *this);
  };
  // Every worker initializes every key (the first value a server receives
  // wins: in sync jobs all are worker 0's after the start-up broadcast),
  // then starts from the servers' current values: a worker that joins a
  // running job continues from there.
  t.on_start = [&m](std::map<std::string, Tensor>& params) -> Status {
    m.params = params.size();
    for (auto& [name, value] : params) {
      SHOAL_RETURN_IF_ERROR(m.worker->init(name, value));
      SHOAL_ASSIGN_OR_RETURN(auto cur,
                             m.worker->pull(name, 0, Deadline::after_seconds(m.timeout_s)));
      SHOAL_RETURN_IF_ERROR(value.copy_from(cur.second));
      m.next_step[name] = m.mode == Mode::kSync ? static_cast<std::int64_t>(cur.first) : 0;
    }
    return ok_status();
  };
  // Two-bit pushes leave residuals on this worker: they go with the
  // checkpoints, so a resumed job sends what it still owed.
  if (m.worker->feedback()) {
    const bool sync = m.mode == Mode::kSync;
    const int keep = t.keep_checkpoints;
    t.on_checkpoint = [&m, id, keep](const std::string& dir, std::int64_t step) {
      return save_residuals(*m.worker->feedback(), dir, id, step, keep);
    };
    t.on_resume = [&m, id, sync](const std::string& dir, std::int64_t step) {
      return load_residuals(*m.worker->feedback(), dir, id, step, sync);
    };
  }
  return ok_status();
}

}  // namespace shoal::ps
