// Subcommands of the `shoal` binary, one file each.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "shoal/cluster/sim.h"
#include "shoal/core/status.h"
#include "shoal/dist/plan.h"
#include "shoal/train/sample.h"

namespace CLI {
class App;
}
namespace YAML {
class Node;
}
namespace shoal::train {
struct TrainOptions;
class Trainer;
}  // namespace shoal::train

namespace shoal::cli {
int run_info();
// After a parse error: the nearest subcommand or flag to what `args` (the
// command line, program name left out) got wrong, as a sentence; or "".
std::string suggestion(const CLI::App& app, const std::vector<std::string>& args);
int run_example_mlp(int threads, int steps, std::uint64_t seed, const std::string& trace);
std::string cpu_features();

// Data-parallel flags of `shoal train` (used when the environment names
// more than one rank: shoal run, mpirun, srun, torchrun).
struct DistFlags {
  std::string wire;  // "": f32, or bf16 under --precision bf16
  double bucket_mb = 25, first_bucket_mb = 1, zero_bucket_mb = 1;
  std::string overlap = "auto";
  std::string dist = "auto";  // auto, allreduce, ps
  std::string ps_mode = "sync";
  int staleness = 2;
  std::string ps_compress;  // "": follows --precision (dist::JoinOptions)
  bool ps_stale_lr = false;
  int zero = 0;
  int tp = 1;
  bool sequence_parallel = false;
  int dp = 0;
  int pp = 1;
  int micro_batches = 0;  // 0: 4 with --pp, else 1 (no accumulation)
  std::string pp_schedule = "1f1b";
  int pp_virtual = 1;
  std::vector<std::size_t> pp_cuts;
};
struct TrainCommand {
  CLI::App* app = nullptr;
  std::shared_ptr<train::TrainOptions> opts;
  std::shared_ptr<DistFlags> dist;
  std::shared_ptr<std::string> config;
  std::shared_ptr<std::string> plan;  // --plan FILE (shoal plan's)
};
TrainCommand add_train_command(CLI::App& app);
// --model: a built-in model's name or a path ending in .onnx.
std::function<std::string(const std::string&)> model_name_check();
// Flag tokens from a --config file for the train subcommand `t`; `cli` is
// the command line (its flags win).
Result<std::vector<std::string>> config_args(const std::string& path, CLI::App& t,
                                             const std::vector<std::string>& cli);
// A YAML (or JSON) file given as `flag`; the error names both and the
// place a parse failed.
Result<YAML::Node> load_yaml_file(const std::string& flag, const std::string& path);
// The same from a YAML mapping already read; `where` names it in errors.
Result<std::vector<std::string>> config_node_args(const YAML::Node& root, const std::string& where,
                                                  CLI::App& t, const std::vector<std::string>& cli);
// What a plan file (shoal plan --out) predicted for the run.
// A plan file's prediction: its plan-* keys (dist::plan_keys; a key an
// older file lacks stays 0) and the ranks it was made for.
struct PlanPrediction : dist::Candidate {
  int ranks = 0;
};
// `shoal train --plan FILE`: the file's flags as --config's, and its
// prediction in `p`.
Result<std::vector<std::string>> plan_args(const std::string& path, CLI::App& t,
                                           const std::vector<std::string>& cli, PlanPrediction* p);
// `--plan FILE` as plan_args; `--plan auto`: dist::auto_plan's plan for
// this job (and --batch taken out of `cli`: the plan's share replaces it).
Result<std::vector<std::string>> plan_file_args(const std::string& plan, CLI::App& t,
                                                const train::TrainOptions& o,
                                                std::vector<std::string>& cli, PlanPrediction* p);
// After training: the measured step time and memory against `p`, logged;
// a gap over 25% warns and names the estimate that was off.
void check_plan(const PlanPrediction& p, const train::Trainer& tr, int rank, int world);
// `shoal plan`.
struct PlanFlags {
  int ranks = 0;  // 0: the job's ranks (under a launcher)
  int hosts = 0;  // 0: wherever the ranks are
  std::int64_t global_batch = 0;
  double mem_gb = 0;
  std::string out = "plan.yaml";
  std::string calibration, save_calibration;
  std::string json;                            // every candidate, as JSON
  std::string recompute = "auto";              // none, selective, full or auto (all three)
  std::shared_ptr<train::TrainOptions> train;  // the model, data and precision
};
struct PlanCommand {
  CLI::App* app = nullptr;
  std::shared_ptr<PlanFlags> flags;
};
PlanCommand add_plan_command(CLI::App& app);
int run_plan(PlanFlags& f);
// The flags the train subcommand `t` was given (on the command line or by
// --config), as a --config file, without --resume, --out and --config: a
// run keeps it as RUN/options.yaml, and `--resume` reads it back so a
// resumed run takes every setting it started with unless given again.
std::string given_flags_yaml(const CLI::App& t);
// `--resume --out DIR`: the flag tokens of DIR/options.yaml that `cli`
// (the command line) does not give; none when the run kept no such file.
Result<std::vector<std::string>> resume_args(const std::string& out, CLI::App& t,
                                             const std::vector<std::string>& cli);
// `flags_yaml` (given_flags_yaml) is written into the run directory.
// `plan`: what `shoal train --plan` checks the run against (none: null).
int run_train(train::TrainOptions o, const DistFlags& d, const std::string& flags_yaml,
              const PlanPrediction* plan = nullptr);
// `shoal eval`: evaluates weights (a checkpoint or a state_dict) on a
// dataset's test split and prints loss and accuracy.
struct EvalCommand {
  CLI::App* app = nullptr;
  std::shared_ptr<train::TrainOptions> opts;
};
EvalCommand add_eval_command(CLI::App& app);
int run_eval(const train::TrainOptions& o);
// `shoal sample`: text from a GPT checkpoint (train/sample.h).
struct SampleFlags {
  std::string weights;
  train::SampleOptions sample;
  int threads = 0;
};
struct SampleCommand {
  CLI::App* app = nullptr;
  std::shared_ptr<SampleFlags> opts;
};
SampleCommand add_sample_command(CLI::App& app);
int run_sample(const SampleFlags& f);
// `shoal ps server`: one parameter server until SIGTERM (ps/server.h).
struct PsServerFlags {
  std::string host;  // "": by DMLC_PS_ROOT_URI (ps::ServerJob::run)
  int port = 0;
  std::string mode = "sync";
  int staleness = 2;
  std::string optimizer = "sgd";
  double lr = 0.01, momentum = 0.9;
  std::string snapshot;
  std::uint64_t snapshot_every = 0;
  std::string compress = "none";
  bool stale_lr = false;
  std::string metrics;  // JSONL, a line per second ("" = none)
  // Set when the command line gives the optimizer or mode; otherwise the
  // server adopts the first worker's options.
  bool configured = true;
};
// `shoal ps scheduler`: the job's rendezvous point (ps/attach.h).
struct PsSchedulerFlags {
  std::string host;  // "": by DMLC_PS_ROOT_URI (ps::Scheduler::run)
  int port = -1;     // -1: DMLC_PS_ROOT_PORT
};
// `shoal join` (cli/join.cc): more ranks for an elastic data-parallel job.
struct JoinFlags {
  std::string job;  // the job's --job-dir
  int ranks = 1;
  std::vector<std::string> cmd;  // a rank to run here (after --), instead of asking
};
CLI::App* add_join_command(CLI::App& app, JoinFlags& f);
int run_join(const JoinFlags& f);

// `shoal ps join`: more workers for an elastic job (ps_join.cc).
struct PsJoinFlags {
  std::string job;  // the job's --ps-snapshots directory
  int workers = 1;
};
struct PsCommand {
  CLI::App* server = nullptr;
  CLI::App* scheduler = nullptr;
  CLI::App* join = nullptr;
  std::shared_ptr<PsServerFlags> opts;
  std::shared_ptr<PsSchedulerFlags> sched;
  std::shared_ptr<PsJoinFlags> join_flags;
};
CLI::App* add_ps_join_command(CLI::App& ps, PsJoinFlags& f);
int run_ps_join(const PsJoinFlags& f);
PsCommand add_ps_command(CLI::App& app);
int run_ps_server(const PsServerFlags& f);
int run_ps_scheduler(const PsSchedulerFlags& f);
// `shoal onnx conformance`.
struct OnnxFlags {
  std::string data;  // default: onnx::kNodeTestDir
  std::vector<std::string> ops;
  bool verbose = false;
};
struct OnnxCommand {
  CLI::App* conformance = nullptr;
  std::shared_ptr<OnnxFlags> flags;
};
OnnxCommand add_onnx_command(CLI::App& app);
int run_onnx_conformance(const OnnxFlags& f);
// `shoal simulate` and `shoal place` (cluster.cc).
struct ClusterFlags {
  std::string cluster;
  int nodes = 1000, per_switch = 32, accels = 8, cpus = 64;
  std::int64_t mem_mb = 512000;
  std::string chip_links = "ring";
  std::string pai;
  int jobs = 10000;
  cluster::SyntheticOptions synth;
  std::vector<std::string> policies = {"fifo-first-fit", "backfill", "backfill-topo", "shoal"};
  cluster::SimOptions sim;
  std::vector<std::string> job_files;
  std::string topology_conf;
  // shoal place --serve (kube-scheduler's extender)
  std::string serve, url_prefix;
  double hold_seconds = 600;
  // shoal simulate --project
  bool project = false;
  std::string png;
  int ranks_per_node = 8;
  std::vector<int> project_ranks = {8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
  std::vector<double> project_bytes = {1e6, 25e6, 100e6};
  double host_alpha_us = -1, host_gbit_s = -1, net_alpha_us = -1, net_gbit_s = -1;
  double spine_alpha_us = -1, spine_gbit_s = -1, compute_ms = 0;
  // shoal submit
  std::string job, engine = "slurm", dir, live_chip_links = "none";
  bool dry_run = false, wait = false, pin = false;
  double wait_s = 3600, rank_timeout_s = 0;
  std::vector<std::string> cmd;
  std::string image = "shoal:latest", k8s_kind = "job", k8s_namespace = "default";
  bool no_volcano = false;
  int k8s_port = 29500;  // rank 0's store in the pods
};
struct ClusterCommand {
  CLI::App* simulate = nullptr;
  CLI::App* place = nullptr;
  CLI::App* submit = nullptr;
  std::shared_ptr<ClusterFlags> flags;
};
ClusterCommand add_cluster_commands(CLI::App& app);
int run_simulate(const ClusterFlags& f);
int run_place(const ClusterFlags& f);
int run_place_serve(const ClusterFlags& f);  // place_serve.cc
int run_submit(const ClusterFlags& f);
struct BenchCommOptions {
  int ranks = 2;  // local ranks forked when not under a launcher
  std::size_t max_bytes = std::size_t{256} << 20;
  double seconds = 0.3;          // timed per size
  bool shared = false;           // buffers in shared memory
  std::string op = "allreduce";  // or reduce_scatter, allgather (as nccl-tests' three)
};
int run_bench_comm(const BenchCommOptions& o);
// `shoal bench peak` (bench_peak.cc): threads 0 = all cores.
int run_bench_peak(int threads, int n, double seconds);
}  // namespace shoal::cli
