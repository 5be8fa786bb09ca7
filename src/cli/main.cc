// The `shoal` binary: dispatches to one subcommand per file.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "shoal/core/logging.h"
#include "shoal/launch/launcher.h"
#include "shoal/train/trainer.h"

namespace {

struct Cli {
  CLI::App app{"Shoal: distributed deep-learning training"};
  CLI::App* info = nullptr;
  CLI::App* example = nullptr;
  std::string which = "mlp", trace;
  int threads = 0, steps = 10;
  std::uint64_t seed = 1;
  shoal::cli::TrainCommand train;
  shoal::cli::PlanCommand plan;
  shoal::cli::EvalCommand eval;
  shoal::cli::SampleCommand sample;
  shoal::cli::PsCommand ps;
  shoal::cli::OnnxCommand onnx;
  shoal::cli::ClusterCommand cluster;
  CLI::App* run = nullptr;
  shoal::launch::LaunchOptions launch;
  std::string ps_roles;    // shoal run --ps S,W
  std::string ps_elastic;  // shoal run --ps-elastic MIN:MAX
  std::string elastic;     // shoal run --elastic MIN[:MAX]
  CLI::App* run_rank = nullptr;
  std::vector<std::string> run_rank_cmd;
  CLI::App* join = nullptr;
  shoal::cli::JoinFlags join_flags;
  CLI::App* bench = nullptr;
  CLI::App* bench_comm = nullptr;
  CLI::App* bench_peak = nullptr;
  int peak_n = 1024;
  shoal::cli::BenchCommOptions comm;
  double seconds = 0.3;  // bench peak

  Cli() {
    app.require_subcommand(1);
    info =
        app.add_subcommand("info", "Print version, build, oneDNN/BLAS versions and CPU features");
    example = app.add_subcommand("example", "Run a built-in example");
    example->add_option("name", which, "Example to run")->check(CLI::IsMember({"mlp"}));
    example->add_option("--threads", threads, "CPU threads (0 = all cores)")
        ->check(shoal::cli::non_negative());
    example->add_option("--steps", steps, "SGD steps")->check(shoal::cli::at_least_one());
    example->add_option("--seed", seed, "Random seed");
    example->add_option("--trace", trace, "Write Chrome trace JSON to FILE");
    train = shoal::cli::add_train_command(app);
    plan = shoal::cli::add_plan_command(app);
    eval = shoal::cli::add_eval_command(app);
    sample = shoal::cli::add_sample_command(app);
    ps = shoal::cli::add_ps_command(app);
    onnx = shoal::cli::add_onnx_command(app);
    cluster = shoal::cli::add_cluster_commands(app);
    run = app.add_subcommand("run", "Launch N ranks of a command (gang: one fails, all stop)");
    run->add_option("-n,--ranks", launch.ranks, "Number of ranks (required unless --ps)")
        ->check(CLI::Range(1, 4096));
    run->add_option("--ps", ps_roles,
                    "A parameter-server job: S servers and W workers running the command "
                    "(shoal train --dist ps), e.g. --ps 1,2");
    run->add_option("--ps-snapshots", launch.ps_snapshots,
                    "Parameter servers' directory: their snapshots and metrics (default "
                    "runs/ps-<job id>)");
    run->add_option("--ps-snapshot-every", launch.ps_snapshot_every,
                    "Parameter servers snapshot every K updates; a dead one restarts from its "
                    "snapshot (1: nothing is lost, at a cost per update; 0, the default: no "
                    "snapshots, a dead server stops the job)")
        ->check(CLI::Range(0, 1 << 30));
    run->add_option("--ps-server-restarts", launch.ps_server_restarts,
                    "Restart a dead parameter server from its snapshot up to K times")
        ->check(CLI::Range(0, 1000));
    run->add_option("--ps-elastic", ps_elastic,
                    "An async or bounded PS job whose workers come and go: MIN:MAX, a failed "
                    "worker is replaced while fewer than MIN train, and `shoal ps join --job "
                    "<ps dir>` adds workers up to MAX");
    run->add_option("--elastic", elastic,
                    "Data parallelism that survives its ranks: MIN[:MAX], a rank that dies, "
                    "freezes or is cut off leaves and the others train on in-process (same "
                    "global batch, no checkpoint read) while at least MIN remain; `shoal join "
                    "--job <job dir>` adds ranks up to MAX");
    run->add_option("--job-dir", launch.job_dir,
                    "An elastic job's directory: job.env there lets `shoal join` reach it "
                    "(default runs/job-<id>)");
    run->add_option("--engine", launch.engine,
                    "local (fork here), mpirun (OpenMPI), srun (a Slurm job step) or external "
                    "(--elastic only: something else starts the ranks, e.g. Kubernetes or "
                    "`shoal join --job DIR -- CMD` on each host; shoal run serves the store "
                    "and keeps the generations)")
        ->check(CLI::IsMember({"local", "mpirun", "srun", "external"}))
        ->capture_default_str();
    run->add_option("--timeout", launch.timeout_s,
                    "Stop all ranks after S seconds, per attempt (0 = none)")
        ->check(shoal::cli::non_negative());
    run->add_option("--max-restarts", launch.max_restarts,
                    "After a rank fails, restart all ranks up to K times (shoal train resumes "
                    "from its newest checkpoint)")
        ->check(CLI::Range(0, 1000));
    run->add_option("--restart-delay", launch.restart_delay_s,
                    "Wait S seconds before the first restart, twice as long before each next "
                    "(at most 30 s; 0 = none)")
        ->check(CLI::Range(0.0, 3600.0))
        ->capture_default_str();
    run->add_option("--trace", launch.trace,
                    "Merge every rank's Chrome trace (shoal train) into FILE and print the "
                    "exposed communication time per step");
    run->add_option("--store-host", launch.store_host,
                    "Address the rendezvous store listens on (ranks on other hosts need a "
                    "routable one)")
        ->capture_default_str();
    run->add_option("--store-port", launch.store_port, "Store port (0 = any free port)")
        ->check(CLI::Range(0, 65535));
    run->add_option("--bind", launch.bind,
                    "none; cores: bind each local rank to its block of this process's CPUs "
                    "(as mpirun --bind-to core; ranks beyond the CPUs go round them); layout: "
                    "shoal train binds each rank by its place in --dp/--tp/--pp")
        ->capture_default_str();
    // One value per occurrence: a vector option otherwise goes on taking
    // words, `--` among them, and the command's own flags land on `run`.
    run->add_option("--engine-arg", launch.engine_args,
                    "Extra argument for mpirun or srun (repeatable), e.g. --engine-arg=-N2")
        ->allow_extra_args(false);
    run->add_option("cmd", launch.cmd, "Command and its arguments (after --)");
    join = shoal::cli::add_join_command(app, join_flags);
    run_rank = app.add_subcommand("run-rank", "Run one rank of an mpirun job (used by shoal run)");
    run_rank->group("");  // hidden
    run_rank->add_option("cmd", run_rank_cmd, "Command")->required();
    bench = app.add_subcommand("bench", "Benchmarks");
    bench->require_subcommand(1);
    bench_comm = bench->add_subcommand(
        "comm", "All-reduce (or --op reduce_scatter, allgather) table, nccl-tests style");
    bench_comm
        ->add_option("-n,--ranks", comm.ranks, "Local ranks to fork (ignored under a launcher)")
        ->check(CLI::Range(1, 1024));
    bench_comm->add_option("--max-bytes", comm.max_bytes, "Largest message (bytes)")
        ->check(CLI::Range(std::size_t{4}, std::size_t{1} << 34));
    bench_comm->add_option("--seconds", comm.seconds, "Timed seconds per size")
        ->check(CLI::Range(0.001, 60.0));
    bench_comm
        ->add_option("--op", comm.op,
                     "The collective: allreduce, reduce_scatter (bytes: the whole input) or "
                     "allgather (bytes: the whole output), as nccl-tests' three")
        ->check(CLI::IsMember({"allreduce", "reduce_scatter", "allgather"}))
        ->capture_default_str();
    bench_comm->add_flag("--shared", comm.shared,
                         "Buffers in shared memory (Communicator::allocate_shared), as a "
                         "data-parallel arena: the direct all-reduce maps peers' buffers");
    bench_peak = bench->add_subcommand(
        "peak", "This host's f32/bf16 GEMM peak and memory bandwidth (what MFU is against)");
    bench_peak->add_option("--threads", threads, "CPU threads (0 = all cores)")
        ->check(shoal::cli::non_negative());
    bench_peak->add_option("--size", peak_n, "Matmul size N (N x N x N)")
        ->check(CLI::Range(64, 8192));
    bench_peak->add_option("--seconds", seconds, "Timed seconds per measurement")
        ->check(CLI::Range(0.001, 60.0));
  }
  // CLI11 wants the arguments reversed, without the program name.
  int parse(std::vector<std::string> args) {
    const std::vector<std::string> given = args;
    std::reverse(args.begin(), args.end());
    try {
      app.parse(args);
    } catch (const CLI::ParseError& e) {
      int rc = app.exit(e);
      if (rc != 0)
        if (std::string hint = shoal::cli::suggestion(app, given); !hint.empty())
          fmt::print(stderr, "{}\n", hint);
      // A usage error exits 2, as argparse and getopt programs do (CLI11's own
      // codes are 100 and up): `shoal run` does not restart it.
      return rc == 0 ? -1 : 2;
    }
    return 0;
  }
};

// OpenMP's threads spin 300,000 times before they sleep by default, which
// is ruinous when another process holds a core (--threads 2 beside two busy
// processes: a CNN at 459-524 img/s against 1,456-1,561 on one thread), and
// sleeping at once (passive) pays a futex wake per parallel region (idle:
// the CNN 3,891 against 4,912, the GPT 84k against 133k tok/s). A short spin
// (GOMP_SPINCOUNT=10000, then sleep) was the best or near it in every case
// measured on this host (docs/BENCHMARKS.md, bench/omp_wait.sh). libgomp
// reads its settings when it loads, before main, so the binary sets it and
// starts itself again, once; a policy the user set (OMP_WAIT_POLICY or
// GOMP_SPINCOUNT) is kept.
void spin_briefly_unless_told(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  setenv("GOMP_SPINCOUNT", "10000", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: libgomp's default
}

// Puts `extra` (flag tokens from a file) right after "train" in `args` and
// parses the whole line again, so every value meets the same checks.
int reparse(std::unique_ptr<Cli>& cli, std::vector<std::string>& args,
            const std::vector<std::string>& extra) {
  auto pos = std::find(args.begin(), args.end(), "train");
  args.insert(pos + 1, extra.begin(), extra.end());
  cli = std::make_unique<Cli>();
  return cli->parse(args);
}

}  // namespace

int main(int argc, char** argv) {
  spin_briefly_unless_told(argv);
  std::vector<std::string> args(argv + 1, argv + argc);
  auto cli = std::make_unique<Cli>();
  if (int rc = cli->parse(args); rc != 0) return rc < 0 ? 0 : rc;
  if (cli->train.app->parsed() && !cli->train.config->empty()) {
    // Options from the config file go in front of the command line's, and
    // the whole line is parsed again so every value meets the same checks.
    auto extra = shoal::cli::config_args(*cli->train.config, *cli->train.app, args);
    if (!extra.ok()) {
      SHOAL_LOG_ERROR("shoal train: {}", extra.status().to_string());
      return 2;
    }
    if (int rc = reparse(cli, args, *extra); rc != 0) return rc < 0 ? 0 : rc;
  }
  shoal::cli::PlanPrediction plan;
  if (cli->train.app->parsed() && !cli->train.plan->empty()) {
    // A plan file is a --config file with the prediction beside the flags.
    auto extra = shoal::cli::plan_file_args(*cli->train.plan, *cli->train.app, *cli->train.opts,
                                            args, &plan);
    if (!extra.ok()) {
      SHOAL_LOG_ERROR("shoal train: {}", extra.status().to_string());
      return 2;
    }
    if (int rc = reparse(cli, args, *extra); rc != 0) return rc < 0 ? 0 : rc;
  }
  if (cli->train.app->parsed() && cli->train.opts->resume && !cli->train.opts->out.empty()) {
    // A resumed run takes the flags it started with, unless given again.
    auto extra = shoal::cli::resume_args(cli->train.opts->out, *cli->train.app, args);
    if (!extra.ok()) {
      SHOAL_LOG_ERROR("shoal train: --resume: {}", extra.status().to_string());
      return 2;
    }
    if (!extra->empty()) {
      if (int rc = reparse(cli, args, *extra); rc != 0) return rc < 0 ? 0 : rc;
    }
  }
  if (cli->train.app->parsed())
    return shoal::cli::run_train(*cli->train.opts, *cli->train.dist,
                                 shoal::cli::given_flags_yaml(*cli->train.app),
                                 plan.step_s > 0 ? &plan : nullptr);
  if (cli->eval.app->parsed()) return shoal::cli::run_eval(*cli->eval.opts);
  if (cli->sample.app->parsed()) return shoal::cli::run_sample(*cli->sample.opts);
  if (cli->ps.scheduler->parsed()) return shoal::cli::run_ps_scheduler(*cli->ps.sched);
  if (cli->ps.join->parsed()) return shoal::cli::run_ps_join(*cli->ps.join_flags);
  if (cli->join->parsed()) return shoal::cli::run_join(cli->join_flags);
  if (cli->ps.server->parsed()) {
    auto* sv = cli->ps.server;
    cli->ps.opts->configured = false;
    for (const char* f :
         {"--mode", "--staleness", "--optimizer", "--lr", "--momentum", "--compress"})
      if (sv->get_option(f)->count() > 0) cli->ps.opts->configured = true;
    return shoal::cli::run_ps_server(*cli->ps.opts);
  }
  if (cli->info->parsed()) return shoal::cli::run_info();
  if (cli->plan.app->parsed()) return shoal::cli::run_plan(*cli->plan.flags);
  if (cli->cluster.simulate->parsed()) return shoal::cli::run_simulate(*cli->cluster.flags);
  if (cli->cluster.place->parsed()) return shoal::cli::run_place(*cli->cluster.flags);
  if (cli->cluster.submit->parsed()) return shoal::cli::run_submit(*cli->cluster.flags);
  if (cli->onnx.conformance->parsed()) return shoal::cli::run_onnx_conformance(*cli->onnx.flags);
  if (cli->run->parsed()) {
    auto& l = cli->launch;
    if (!cli->ps_roles.empty()) {
      char comma = 0, extra = 0;
      if (std::sscanf(cli->ps_roles.c_str(), "%d%c%d%c", &l.ps_servers, &comma, &l.ps_workers,
                      &extra) != 3 ||
          comma != ',') {
        fmt::print(stderr, "shoal run: --ps {}: expected SERVERS,WORKERS, e.g. --ps 1,2\n",
                   cli->ps_roles);
        return 2;
      }
      if (!cli->ps_elastic.empty() &&
          (std::sscanf(cli->ps_elastic.c_str(), "%d%c%d%c", &l.ps_elastic_min, &comma,
                       &l.ps_elastic_max, &extra) != 3 ||
           comma != ':' || l.ps_elastic_min < 1 || l.ps_elastic_min > l.ps_workers ||
           l.ps_elastic_max < l.ps_workers)) {
        fmt::print(stderr,
                   "shoal run: --ps-elastic {}: expected MIN:MAX with 1 <= MIN <= {} (the "
                   "workers of --ps) <= MAX\n",
                   cli->ps_elastic, l.ps_workers);
        return 2;
      }
    } else if (cli->run->count("-n") == 0) {
      fmt::print(stderr, "shoal run: give -n N (ranks) or --ps S,W (a parameter-server job)\n");
      return 2;
    }
    if (!cli->elastic.empty()) {
      char colon = 0, extra = 0;
      const int got = std::sscanf(cli->elastic.c_str(), "%d%c%d%c", &l.elastic_min, &colon,
                                  &l.elastic_max, &extra);
      if (!(got == 1 || (got == 3 && colon == ':')) || l.elastic_min < 1) {
        fmt::print(stderr, "shoal run: --elastic {}: expected MIN or MIN:MAX, e.g. --elastic 2\n",
                   cli->elastic);
        return 2;
      }
      if (got == 1) l.elastic_max = l.ranks;
    }
    return shoal::launch::launch(l);
  }
  if (cli->run_rank->parsed()) return shoal::launch::exec_rank(cli->run_rank_cmd);
  if (cli->bench_comm->parsed()) return shoal::cli::run_bench_comm(cli->comm);
  if (cli->bench_peak->parsed())
    return shoal::cli::run_bench_peak(cli->threads, cli->peak_n, cli->seconds);
  if (cli->example->parsed())
    return shoal::cli::run_example_mlp(cli->threads, cli->steps, cli->seed, cli->trace);
  return 1;
}
