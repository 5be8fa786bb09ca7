// `shoal train`: flags (and --config FILE in YAML or JSON) into
// TrainOptions, then train::Trainer. Unknown or invalid options in either
// place are refused with a message that names them.
#include <sys/resource.h>
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "cli/train_generations.h"
#include "shoal/core/env.h"
#include "shoal/core/file.h"
#include "shoal/core/logging.h"
#include "shoal/core/stop.h"
#include "shoal/dist/elastic.h"
#include "shoal/dist/job.h"
#include "shoal/dp/data_parallel.h"
#include "shoal/train/model.h"
#include "shoal/train/text.h"
#include "shoal/train/trainer.h"

namespace shoal::cli {

std::function<std::string(const std::string&)> model_name_check() {
  return [](const std::string& v) -> std::string {
    if (train::is_model_name(v)) return "";
    return fmt::format("{} is not one of {}, resnet20, nor a path ending in .onnx", v,
                       fmt::join(train::model_names(), ", "));
  };
}

// Reads --config FILE (YAML, or JSON, which YAML contains) into flag
// tokens: "key: value" -> "--key value", lists -> repeated values, a true
// flag -> "--key". Keys may use '-' or '_'. A key the command line also
// sets is skipped (the command line wins); an unknown key is an error.
Result<YAML::Node> load_yaml_file(const std::string& flag, const std::string& path) {
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return not_found("{} {}: cannot open the file", flag, path);
  } catch (const YAML::Exception& e) {
    return invalid_argument("{} {}: not valid YAML/JSON at line {}, column {}: {}", flag, path,
                            e.mark.line + 1, e.mark.column + 1, e.msg);
  }
}

Result<std::vector<std::string>> config_args(const std::string& path, CLI::App& t,
                                             const std::vector<std::string>& cli) {
  SHOAL_ASSIGN_OR_RETURN(YAML::Node root, load_yaml_file("--config", path));
  return config_node_args(root, "--config " + path, t, cli);
}

Result<std::vector<std::string>> config_node_args(const YAML::Node& root, const std::string& path,
                                                  CLI::App& t,
                                                  const std::vector<std::string>& cli) {
  std::vector<std::string> out;
  if (root.IsNull()) return out;
  if (!root.IsMap())
    return invalid_argument("{}: the file must hold a mapping of option: value", path);
  for (const auto& kv : root) {
    std::string key = kv.first.as<std::string>();
    std::string name = key;
    std::replace(name.begin(), name.end(), '_', '-');
    CLI::Option* opt = t.get_option_no_throw("--" + name);
    if (opt == nullptr || name == "config" || name == "plan")
      return invalid_argument("{}: unknown option '{}' (see `shoal train --help`)", path, key);
    bool on_cli = false;
    for (const auto& a : cli) on_cli |= a == "--" + name || a.rfind("--" + name + "=", 0) == 0;
    if (on_cli) continue;
    const YAML::Node& v = kv.second;
    std::vector<std::string> vals;
    if (v.IsScalar()) {
      vals.push_back(v.as<std::string>());
    } else if (v.IsSequence()) {
      for (const auto& e : v) {
        if (!e.IsScalar())
          return invalid_argument("{}: option '{}' holds a nested value", path, key);
        vals.push_back(e.as<std::string>());
      }
    } else {
      return invalid_argument("{}: option '{}' must be a scalar or a list", path, key);
    }
    if (opt->get_expected_min() == 0) {  // a flag
      bool on = false;
      if (vals.size() != 1 || !YAML::convert<bool>::decode(v, on))
        return invalid_argument("{}: option '{}' is a flag and needs true or false", path, key);
      if (on) out.push_back("--" + name);
      continue;
    }
    for (const auto& val : vals) {
      out.push_back("--" + name);
      out.push_back(val);
    }
  }
  return out;
}

// Flags a run does not keep for --resume: where its files go, and how
// this launch lays the run out over ranks and cores (a checkpoint moves
// between layouts; the layout flags come from the new command line).
// clang-format off
const std::set<std::string> kNotKept = {
    "resume", "out", "config", "plan", "help", "threads", "trace", "dump-graph",
    "wire", "bucket-mb", "first-bucket-mb", "overlap", "dist", "ps-mode", "staleness",
    "ps-stale-lr", "ps-compress", "zero", "zero-bucket-mb", "sequence-parallel", "tp", "dp",
    "pp", "micro-batches", "pp-schedule", "pp-virtual", "pp-cuts"};
// clang-format on

std::string given_flags_yaml(const CLI::App& t) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  for (const CLI::Option* opt : t.get_options()) {
    const std::string& name = opt->get_single_name();
    if (opt->count() == 0 || kNotKept.count(name)) continue;
    e << YAML::Key << name << YAML::Value;
    if (opt->get_expected_min() == 0) {
      e << true;  // a flag given
    } else if (opt->results().size() == 1) {
      e << YAML::DoubleQuoted << opt->results()[0];
    } else {
      e << YAML::Flow << YAML::BeginSeq;
      for (const auto& v : opt->results()) e << YAML::DoubleQuoted << v;
      e << YAML::EndSeq;
    }
  }
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

Result<std::vector<std::string>> resume_args(const std::string& out, CLI::App& t,
                                             const std::vector<std::string>& cli) {
  const std::string saved = out + "/options.yaml";
  std::error_code ec;
  if (!std::filesystem::exists(saved, ec)) return std::vector<std::string>{};
  return config_args(saved, t, cli);
}

namespace {
const CLI::Validator kPositive = positive();
const CLI::Validator kNonNegative = non_negative();
}  // namespace

TrainCommand add_train_command(CLI::App& app) {
  TrainCommand c;
  c.config = std::make_shared<std::string>();
  c.opts = std::make_shared<train::TrainOptions>();
  c.dist = std::make_shared<DistFlags>();
  auto& o = *c.opts;
  CLI::App* t =
      app.add_subcommand("train", "Train a model on Fashion-MNIST, NumPy arrays or image folders");
  c.app = t;
  t->add_option("--model", o.model,
                "mlp, cnn, resnet (ResNet-20), gpt (a decoder-only transformer for --data "
                "text:PATH), or an ONNX file (path ending in .onnx)")
      ->check(model_name_check())
      ->capture_default_str();
  t->add_option("--data", o.data,
                "fashion-mnist, mnist, a .npz file (x_train, y_train, x_test, y_test), a "
                "directory of IDX files, of those arrays as .npy, or of train/ and test/ image "
                "folders (one subfolder per class), or text:PATH[,PATH] (text files or "
                "directories of them; characters are the tokens)")
      ->capture_default_str();
  t->add_option("--layers", o.gpt.layers, "--model gpt: transformer blocks")
      ->check(kPositive)
      ->capture_default_str();
  t->add_option("--heads", o.gpt.heads, "--model gpt: attention heads (must divide --dim)")
      ->check(kPositive)
      ->capture_default_str();
  t->add_option("--dim", o.gpt.dim, "--model gpt: embedding width")
      ->check(kPositive)
      ->capture_default_str();
  t->add_option("--context", o.gpt.context,
                "--model gpt: tokens per sample (text data is cut into windows of this length)")
      ->check(kPositive)
      ->capture_default_str();
  t->add_flag("!--untied", o.gpt.tied, "--model gpt: an output head of its own, not wte^T");
  t->add_flag("--onnx-tied", o.onnx_tied,
              "An ONNX model: an initializer several nodes read trains as one parameter (weights "
              "tied on purpose); by default each node gets its own, since torch.onnx.export "
              "merges initializers of equal value");
  t->add_option("--epochs", o.epochs, "Epochs")->check(kPositive)->capture_default_str();
  auto* per_rank = t->add_option("--batch", o.batch, "Batch size per rank")
                       ->check(kPositive)
                       ->capture_default_str();
  t->add_option("--global-batch", o.global_batch,
                "Samples per step over all data-parallel ranks, instead of --batch: split as "
                "evenly as it goes (the first G mod ranks take one more), each share's gradient "
                "weighted so the step is the mean over the G samples")
      ->check(kPositive)
      ->excludes(per_rank);
  t->add_option("--optimizer", o.optimizer, "sgd, momentum, nesterov, adam, adamw, lars, lamb")
      ->check(CLI::IsMember({"sgd", "momentum", "nesterov", "adam", "adamw", "lars", "lamb"}))
      ->capture_default_str();
  t->add_option("--lr", o.lr, "Learning rate")->check(kPositive)->capture_default_str();
  t->add_option("--momentum", o.momentum, "Momentum (momentum, nesterov, lars)")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  t->add_option("--weight-decay", o.weight_decay, "Weight decay")
      ->check(kNonNegative)
      ->capture_default_str();
  t->add_option("--trust", o.trust, "LARS trust coefficient (eta)")
      ->check(kPositive)
      ->capture_default_str();
  t->add_option("--schedule", o.schedule, "LR schedule: constant, step, cosine")
      ->check(CLI::IsMember({"constant", "step", "cosine"}))
      ->capture_default_str();
  t->add_option("--warmup-epochs", o.warmup_epochs, "Linear LR warmup (epochs, may be fractional)")
      ->check(kNonNegative);
  t->add_option("--step-epochs", o.step_epochs, "Step schedule: epochs between decays")
      ->check(kPositive);
  t->add_option("--gamma", o.gamma, "Step schedule: decay factor")->check(kPositive);
  t->add_flag("--linear-scaling", o.linear_scaling, "lr *= global batch / 256 (Goyal et al.)");
  t->add_option("--threads", o.threads,
                "CPU threads (0 = the cores divided among this host's ranks)")
      ->check(kNonNegative);
  t->add_option("--seed", o.seed, "Random seed (weights, shuffling, augmentation)");
  t->add_option("--out", o.out, "Run directory (default runs/<model>)");
  t->add_flag("--augment", o.augment, "Random crop (pad 2) and horizontal flip");
  t->add_option("--precision", o.precision,
                "f32, or bf16: matmuls and convolutions read bf16 operands and accumulate in f32 "
                "(weights, optimizer state, norms and the loss stay f32); needs AVX-512 BF16 or "
                "AMX")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  t->add_option("--recompute", o.recompute,
                "Activation recomputation: none; selective (attention's softmax region is "
                "computed again in the backward instead of kept, as Megatron does); full (only "
                "the inputs of the norm layers are kept, the rest computed again)")
      ->check(CLI::IsMember({"none", "selective", "full"}))
      ->capture_default_str();
  t->add_flag("--deterministic", o.deterministic,
              "Bit-identical reruns: fixed all-reduce algorithms (SHOAL_DETERMINISTIC=1); refuse "
              "to resume with a different thread count");
  t->add_option("--keep-checkpoints", o.keep_checkpoints, "Checkpoints kept in <out>/checkpoints")
      ->check(kPositive);
  t->add_option("--checkpoint-every", o.checkpoint_every, "Steps between checkpoints (0 = epoch)")
      ->check(kNonNegative);
  t->add_flag("!--no-checkpoints", o.checkpoints, "Write no checkpoints");
  t->add_flag("--sharded-checkpoints", o.sharded_checkpoints,
              "Every rank writes its share of each checkpoint: ckpt-<step>/ with one "
              "safetensors file per rank and a Hugging Face index (model.safetensors.index.json)");
  t->add_flag("--resume", o.resume, "Continue from the newest loadable checkpoint in <out>");
  t->add_option("--init-from", o.init_from,
                "Start from these weights: a Shoal checkpoint or a safetensors state_dict "
                "(PyTorch names) that another tool wrote");
  t->add_option("--max-steps", o.max_steps, "Stop after this many steps in all")
      ->check(kNonNegative);
  t->add_option("--limit-train", o.limit_train, "Use only the first N training samples")
      ->check(kNonNegative);
  t->add_option("--limit-test", o.limit_test, "Use only the first N test samples")
      ->check(kNonNegative);
  t->add_option("--classes", o.classes,
                "Number of classes (default: one more than the largest label); a label "
                "outside [0, N) is refused")
      ->check(kPositive);
  t->add_option("--eval-batch", o.eval_batch, "Evaluation batch")->check(kPositive);
  t->add_flag("!--no-plot", o.plot, "Do not write metrics.png");
  t->add_flag("--quiet", o.quiet, "No progress output");
  t->add_option("--dump-graph", o.dump_graph,
                "Write the training step's graph as JSON after every pass (where --precision put "
                "its casts, what --recompute copied); with several ranks each writes "
                "FILE.rank<r>.json");
  t->add_option("--trace", o.trace,
                "Write a Chrome trace of the last 10 steps (each epoch); with several ranks "
                "each writes FILE.rank<r>.json");
  auto& d = *c.dist;
  t->add_option("--wire", d.wire,
                "Data parallel: gradient dtype on the wire, for the all-reduce and ZeRO-1/2's "
                "reduce-scatter (f32, f16, bf16; default f32, bf16 under --precision bf16)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  t->add_option("--bucket-mb", d.bucket_mb, "Data parallel: gradient bucket cap (MiB)")
      ->check(kPositive)
      ->capture_default_str();
  t->add_option("--first-bucket-mb", d.first_bucket_mb,
                "Data parallel: cap of the first bucket (MiB), small so sending starts early")
      ->check(kPositive)
      ->capture_default_str();
  t->add_option("--overlap", d.overlap,
                "Data parallel: all-reduce buckets on a progress thread during the backward pass "
                "(on), on the compute thread (off), or off only when the host's ranks x threads "
                "fill its cores (auto)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  t->add_option("--dist", d.dist,
                "How several processes train: allreduce (data parallel over the job's ranks), ps "
                "(workers of a parameter-server job: shoal run --ps S,W, or DMLC_* variables), or "
                "auto (ps when DMLC_ROLE is set)")
      ->check(CLI::IsMember({"auto", "allreduce", "ps"}))
      ->capture_default_str();
  t->add_option("--ps-mode", d.ps_mode,
                "Parameter server: sync (every worker in every step), async (updates as they "
                "arrive) or bounded (async, at most --staleness steps ahead of the slowest)")
      ->check(CLI::IsMember({"sync", "async", "bounded"}))
      ->capture_default_str();
  t->add_option("--staleness", d.staleness, "Parameter server, bounded: steps ahead of the slowest")
      ->check(kNonNegative)
      ->capture_default_str();
  t->add_flag("--ps-stale-lr", d.ps_stale_lr,
              "Parameter server, async/bounded: divide each push's learning rate by its "
              "staleness (updates since the worker was sent the weights it computed on)");
  t->add_option("--ps-compress", d.ps_compress,
                "Parameter server: how pushes and pulls travel: none, f16, bf16 (both ways), or "
                "2bit:THRESHOLD[,f16|bf16] (gradients as -t/0/+t with error feedback; pulls f32 or "
                "the half type given); default bf16 under --precision bf16, else none");
  t->add_option("--zero", d.zero,
                "Data parallel: 1 shards the optimizer state over the ranks (ZeRO-1: gradients "
                "reduce-scattered, each rank updates its shard, parameters all-gathered); 2 "
                "the gradients too (each bucket reduce-scattered as soon as the backward pass "
                "has it); 3 the parameters too (each gathered where the step uses it); 0 "
                "all-reduces gradients")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  t->add_option("--zero-bucket-mb", d.zero_bucket_mb,
                "--zero 2: gradient bucket cap (MiB): smaller buckets free gradients sooner")
      ->check(positive())
      ->capture_default_str();
  t->add_flag("--sequence-parallel", d.sequence_parallel,
              "With --tp: layer norms and residual adds on 1/T of the rows each, between a "
              "reduce-scatter and an all-gather (Megatron's sequence parallelism)");
  t->add_option("--tp", d.tp,
                "Tensor parallelism over this many ranks (the job's ranks, all on the same "
                "batches): attention heads and MLP units split Megatron's way")
      ->check(at_least_one())
      ->capture_default_str();
  t->add_option("--dp", d.dp,
                "With --tp or --pp: data-parallel groups (checked: --dp x --tp x --pp must be "
                "the job's ranks; 0 = the ranks / (--tp x --pp))")
      ->check(non_negative())
      ->capture_default_str();
  t->add_option("--pp", d.pp,
                "Pipeline parallelism over this many ranks: the model's layers cut into stages "
                "(balanced by estimated cost), each batch run as --micro-batches")
      ->check(at_least_one())
      ->capture_default_str();
  t->add_option("--micro-batches", d.micro_batches,
                "Micro-batches per batch (must divide --batch): with --pp the pipeline's "
                "(default 4); without, gradient accumulation (one micro-batch's activations "
                "alive at a time, one update per batch; default 1: none)")
      ->check(at_least_one());
  t->add_option("--pp-schedule", d.pp_schedule,
                "With --pp: 1f1b (one forward, one backward in turn: at most --pp micro-batches' "
                "activations alive) or gpipe (all forwards, then all backwards)")
      ->check(CLI::IsMember({"1f1b", "gpipe"}))
      ->capture_default_str();
  t->add_option("--pp-virtual", d.pp_virtual,
                "With --pp: model chunks per rank (interleaved, Megatron's virtual stages): the "
                "model cut into --pp x this many pieces, rank s holding pieces s, s + --pp, ...; "
                "a smaller bubble for more sends (--micro-batches a multiple of --pp)")
      ->check(at_least_one())
      ->capture_default_str();
  t->add_option("--pp-cuts", d.pp_cuts,
                "With --pp: where to cut, as indices of the model's cut places (the log lists "
                "them); default: balanced by estimated cost")
      ->delimiter(',');
  t->add_option("--config", *c.config, "YAML or JSON file with the same options (flags win)");
  c.plan = std::make_shared<std::string>();
  t->add_option("--plan", *c.plan,
                "A plan file (shoal plan --out): its flags as --config's (flags win), and at the "
                "end the measured step time and memory against its prediction; auto: rank 0 "
                "plans now for the job's ranks (on one host) and --batch x ranks per step");
  return c;
}

namespace {

// --wire follows --precision unless given (dp::wire_for).
dist::JoinOptions join_options(const DistFlags& d, const std::string& precision) {
  dist::JoinOptions jo;
  jo.dist = d.dist;
  jo.dp.wire = *dp::wire_for(d.wire, precision, d.zero);
  jo.dp.bucket_mb = d.bucket_mb;
  jo.dp.first_bucket_mb = d.first_bucket_mb;
  jo.dp.zero_bucket_mb = d.zero_bucket_mb;
  jo.dp.overlap = *dp::parse_overlap(d.overlap);
  jo.dp.zero = d.zero;
  jo.layout.tp = d.tp;
  jo.layout.sequence_parallel = d.sequence_parallel;
  jo.layout.dp = d.dp;
  jo.layout.pp = d.pp;
  jo.layout.micro_batches = d.micro_batches;  // 0: dist's default
  jo.layout.pp_schedule = d.pp_schedule;
  jo.layout.pp_cuts = d.pp_cuts;
  jo.layout.pp_virtual = d.pp_virtual;
  jo.ps_mode = d.ps_mode;
  jo.staleness = d.staleness;
  jo.ps_compress = d.ps_compress;
  jo.ps_stale_lr = d.ps_stale_lr;
  return jo;
}

}  // namespace

// cli/train_generations.h.
Ended train_once(train::TrainOptions o, const dist::JoinOptions& jo, const std::string& flags_yaml,
                 const PlanPrediction* plan) {
  auto job = dist::Job::join(o, jo);
  if (!job.ok()) {
    SHOAL_LOG_ERROR("shoal train: {}", job.status().to_string());
    return {2, job.status(), nullptr, 0};
  }
  const bool ps_job = (*job)->parameter_server();
  auto t = train::Trainer::create(o);
  if (!t.ok()) {
    SHOAL_LOG_ERROR("shoal train: {}", t.status().to_string());
    return {2, t.status(), nullptr, 0};
  }
  auto& tr = **t;
  if (o.rank == 0 && !flags_yaml.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(tr.run_dir(), ec);  // an error shows in the write
    if (Status w = write_file_atomic(tr.run_dir() + "/options.yaml", flags_yaml); !w.ok())
      SHOAL_LOG_WARN(
          "shoal train: the run's flags were not kept ({}): --resume will need them "
          "given again",
          w.message());
  }
  // Ranks that split the model (--tp, --pp) share their group's batch.
  std::string each;
  if (ps_job && o.world > 1)
    each = fmt::format(" per worker x {} workers", o.world);
  else if (o.global_batch > 0 && o.global_batch % o.data_shards() != 0)
    each = fmt::format(" or {} (a global {} over {} data-parallel ranks, weighted)",
                       o.global_batch / o.data_shards(), o.global_batch, o.data_shards());
  else if (o.world > 1 && o.data_shards() == o.world)
    each = fmt::format(" per rank x {} ranks", o.world);
  else if (o.world > 1)
    each = fmt::format(" per data-parallel group x {} group{} of {} ranks", o.data_shards(),
                       o.data_shards() > 1 ? "s" : "", o.world / o.data_shards());
  if (o.rank == 0 && !o.quiet)
    fmt::print("shoal train: {} on {} ({} steps/epoch, batch {}{}), {} lr {}, run dir {}\n",
               o.model, o.data, tr.steps_per_epoch(), o.share_size(0), each, o.optimizer, o.lr,
               tr.run_dir());
  // From here a Ctrl-C or SIGTERM ends the run at a step boundary with a
  // checkpoint (before, the steps since the last one were lost). Not for a
  // parameter-server worker: a launcher stops those when another failed,
  // and a sync worker waiting on its round would not reach a boundary.
  if (!ps_job) catch_stop_signals();
  Status st = tr.run();
  if (!st.ok()) {
    // A regroup (ranks joining an elastic job) is no error: it is said there.
    if (st.code() != StatusCode::kCancelled) SHOAL_LOG_ERROR("shoal train: {}", st.to_string());
    return {1, st, tr.committed(), tr.global_step()};
  }
  if (tr.stopped_by() != 0)
    return {128 + tr.stopped_by(), ok_status(), nullptr, 0};  // as a shell reports the signal
  // What the rank held at most, as the kernel counts it (ZeRO's stages
  // are judged by it, not by the planner's figures).
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) == 0)
    SHOAL_LOG_INFO("peak resident memory of rank {}: {:.0f} MB (getrusage)", o.rank,
                   static_cast<double>(ru.ru_maxrss) / 1024.0);
  if (plan != nullptr && !ps_job) check_plan(*plan, tr, o.rank, o.world);
  // The result line is printed under --quiet too: it is what a script reads.
  // Each worker of a parameter-server job has its own (async: they differ).
  if (!tr.history().empty() && (o.rank == 0 || ps_job)) {
    const auto& last = tr.history().back();
    double secs = 0;
    for (const auto& e : tr.history()) secs += e.wall_seconds;
    std::string when = last.partial
                           ? fmt::format("{} steps (epoch {}, partial)", last.step, last.epoch)
                           : fmt::format("{} epochs", last.epoch);
    if (train::is_text_data(o.data))
      fmt::print(
          "final: validation {:.3f} bits/char, accuracy {:.2f}% after {}, {:.0f} tok/s, "
          "{:.1f} s\n",
          last.test_loss / std::log(2.0), 100 * last.test_acc, when, last.images_per_s, secs);
    else
      fmt::print("final: test accuracy {:.2f}% after {}, {:.0f} img/s, {:.1f} s\n",
                 100 * last.test_acc, when, last.images_per_s, secs);
  }
  return {0, ok_status(), nullptr, 0};
}

int run_train(train::TrainOptions o, const DistFlags& d, const std::string& flags_yaml,
              const PlanPrediction* plan) {
  const dist::JoinOptions jo = join_options(d, o.precision);
  auto el = dist::elastic_env();
  if (!el.ok()) {
    SHOAL_LOG_ERROR("shoal train: {}", el.status().message());
    return 2;
  }
  if (*el) return train_elastic(std::move(o), jo, flags_yaml, **el);
  return train_once(std::move(o), jo, flags_yaml, plan).code;
}

}  // namespace shoal::cli
