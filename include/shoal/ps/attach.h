// Training through parameter servers, as a graph pass (issue 14). A
// worker's step graph keeps forward, loss and autodiff; the optimizer
// update moves to the servers. inject_push_pull() gives each parameter one
// "ps_push_pull" node in place of its update node: its async kernel sends
// the gradient to the key's server and receives the key's new value in the
// same round trip (sync: once every live worker's gradient for that step
// is in), on the job's client thread, while the backward pass goes on. The
// executor waits for it only at the end of the step.
//
// How a worker finds the job (the ps-lite/MXNet variables, so scripts
// written for them work; `shoal run --ps S,W` sets them):
//   DMLC_ROLE=worker, DMLC_PS_ROOT_URI + DMLC_PS_ROOT_PORT (the scheduler:
//   a rendezvous store; SHOAL_STORE also works), DMLC_NUM_SERVER,
//   DMLC_NUM_WORKER, SHOAL_JOB_TOKEN.
// Servers publish "host:port" under ps/server/<i>; a worker takes the next
// id from the counter ps/workers (so a worker that joins a running job
// gets a new one), joins every server and sends the job's options (the
// optimizer runs there). Sync jobs wait until all DMLC_NUM_WORKER workers
// have joined before the first push.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "shoal/net/store.h"
#include "shoal/ps/shard.h"
#include "shoal/ps/worker.h"
#include "shoal/train/trainer.h"

namespace shoal::ps {

// The DMLC_* (or SHOAL_*) variables of a parameter-server job. Errors name
// the variable and its value.
struct JobEnv {
  std::string role;  // DMLC_ROLE: worker, server, scheduler ("" = unset)
  std::string root;  // the scheduler's host:port
  int num_servers = 0, num_workers = 0;
  std::string token;       // SHOAL_JOB_TOKEN
  double timeout_s = 300;  // SHOAL_COMM_TIMEOUT: waits for other roles
  // SHOAL_PS_HEARTBEAT: servers drop a worker silent this long (0 = off)
  double heartbeat_s = 30;
  // MXNET_KVSTORE_BIGARRAY_BOUND: keys of at least this many elements are
  // sliced over all servers (0 = never)
  std::int64_t slice_bound = 1000000;
  // SHOAL_PS_SHM (default 1): push-pulls with servers on this host go
  // through shared memory (Worker::set_in_place); 0 = always TCP.
  bool in_place = true;
};
Result<std::int64_t> slice_bound_env();
Result<JobEnv> job_env();
// What a server reads of it, in a job or alone: the token, the heartbeat
// and the slice bound (job_env reads them too).
Status read_server_env(JobEnv& e);
// Where the scheduler and a server listen unless told (--host): 127.0.0.1
// when the scheduler's host (DMLC_PS_ROOT_URI; "" outside a job) is unset
// or loopback, else every interface, for the roles on other hosts.
std::string default_listen_host(const std::string& root_host);
// DMLC_NUM_SERVER or DMLC_NUM_WORKER: set, a number, >= 1; errors name it.
Result<int> role_count(const char* name);
// Connects to the job's scheduler (its store), retrying until the
// timeout while it is not up yet: roles started by hand start in any order.
// Refuses, by name, counts that differ from those of the job's first role.
Result<std::unique_ptr<net::Store>> connect_scheduler(const JobEnv& e);
// The first role to reach the store records DMLC_NUM_SERVER and
// DMLC_NUM_WORKER; every later one must agree (a role that counted
// differently would wait forever for a peer that never comes).
Status agree_on_counts(net::Store& s, int num_servers, int num_workers, std::string_view who);

// Whether DMLC_ROLE (or SHOAL_PS_ROLE) says this process is part of one.
bool in_ps_job();

// The servers' options for a trainer's: its optimizer and base lr.
ShardOptions shard_options(const train::TrainOptions& t, Mode mode, int staleness);

// Key under which server `i` publishes its address.
std::string server_key(int i);

// One worker process's part of a job: its store connection, its worker
// connections to the servers, and the client thread the push-pull kernels
// use. Outlives the trainer it is attached to.
class WorkerJob {
 public:
  static Result<std::unique_ptr<WorkerJob>> join(const JobEnv& e, const ShardOptions& o);
  ~WorkerJob();  // leaves the servers: sync rounds stop waiting for it

  int worker() const;
  int workers() const { return env_.num_workers; }
  const ShardOptions& options() const { return o_; }
  // Wire a trainer to this job: rank/world for its data shard, the update
  // pass, start-up (keys initialized, current values pulled) and Peers over
  // the store. Call before Trainer::create.
  Status attach(train::TrainOptions& t);

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  WorkerJob() = default;
  Status take_ranks(train::TrainOptions& t, int id);
  JobEnv env_;
  ShardOptions o_;
  std::unique_ptr<Impl> impl_;
};

// The update pass on its own (what attach installs): one ps_push_pull node
// per parameter, keys named after the parameters. `job` must outlive every
// executable built from the graph.
Result<train::OptimizerGraph> inject_push_pull(graph::Builder& b,
                                               const std::vector<train::ParamRef>& params,
                                               WorkerJob& job);

}  // namespace shoal::ps
