// Trainer: what a run shows of itself: the epoch line and the metrics plot
// (gnuplot over metrics.jsonl).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shoal/core/file.h"
#include "shoal/core/logging.h"
#include "shoal/core/plot.h"
#include "shoal/graph/passes.h"
#include "shoal/train/trainer.h"
#include "train/trainer_impl.h"

namespace shoal::train {

namespace fs = std::filesystem;

std::string flops_str(double flops_per_s, double peak) {
  std::string s = fmt::format(" {:.1f} GFLOP/s", flops_per_s / 1e9);
  if (peak > 0) s += fmt::format(" MFU {:.0f}%", 100 * flops_per_s / peak);
  return s;
}

StepProfile Trainer::step_profile(std::size_t skip) const {
  const Impl& m = *impl_;
  StepProfile p;
  p.param_bytes = total_bytes(params_);
  p.param_tensors = static_cast<int>(params_.size());
  p.state_bytes = total_bytes(state_);
  p.buffer_bytes = total_bytes(buffers_);
  p.flops = m.step_flops;
  if (!m.exe) return p;
  p.arena_bytes = m.exe->arena_bytes();
  const graph::Graph& g = m.exe->graph();
  // Each part's median over the steps: one step a time slice of another
  // process fell into does not move it.
  std::vector<double> step, product, update, other, period, allreduce, transfer, shard;
  double last_start = -1;
  for (std::size_t s = skip; s < m.trace_steps.size(); ++s) {
    double st = 0, pr = 0, up = 0, ot = 0, ar = 0, tr = 0, sh = 0;
    for (const runtime::TraceEvent& e : m.trace_steps[s]) {
      const double sec = e.dur_us * 1e-6;
      if (e.node < 0) {
        if (std::string_view(e.name) != "train_step") continue;
        st += sec;
        if (last_start >= 0) period.push_back((e.start_us - last_start) * 1e-6);
        last_start = e.start_us;
        continue;
      }
      if (e.lane != 0) continue;  // the communication thread
      const graph::Node& n = g.nodes()[static_cast<std::size_t>(e.node)];
      if (n.op.ends_with("_update"))
        up += sec;
      else if (n.op == "allreduce_bucket" || n.op == "tp_allreduce" || n.op.starts_with("comm_"))
        ar += sec;
      else if (n.op == "pp_send" || n.op == "pp_recv")
        tr += sec;
      else if (n.op == "allgather" || n.op == "reduce_scatter")
        sh += sec;
      else if (graph::node_flops(g, n) > 0)
        pr += sec;
      else
        ot += sec;
    }
    step.push_back(st);
    product.push_back(pr);
    update.push_back(up);
    other.push_back(ot);
    allreduce.push_back(ar);
    transfer.push_back(tr);
    shard.push_back(sh);
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const std::size_t h = v.size() / 2;
    return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
  };
  p.steps = static_cast<int>(step.size());
  p.step_s = median(step);
  p.product_s = median(product);
  p.update_s = median(update);
  p.other_s = median(other);
  p.period_s = median(period);
  p.allreduce_s = median(allreduce);
  p.transfer_s = median(transfer);
  p.shard_s = median(shard);
  // Without a trace, the periods the loop measures (warm-up left out too).
  if (p.steps == 0 && m.periods.size() > skip)
    p.period_s = median(std::vector<double>(m.periods.begin() + static_cast<std::ptrdiff_t>(skip),
                                            m.periods.end()));
  return p;
}

void Trainer::print_epoch(const EpochMetrics& em) const {
  const bool text = impl_->train.tokens();
  // Text: the loss in bits per character too, and tokens (not images) per second.
  std::string bpc = text ? fmt::format(" ({:.3f} bits/char)", em.test_loss / std::log(2.0)) : "";
  fmt::print(
      "epoch {}/{}{}: train loss {:.4f} acc {:.2f}%  test loss {:.4f}{} acc {:.2f}%  "
      "{:.0f} {}{}  {:.1f} s\n",
      em.epoch, o_.epochs,
      em.partial ? fmt::format(" (ended at step {} by --max-steps)", em.step) : "", em.train_loss,
      100 * em.train_acc, em.test_loss, bpc, 100 * em.test_acc, em.images_per_s,
      text ? "tok/s" : "img/s", flops_str(em.model_flops_per_s, impl_->peak_flops),
      em.wall_seconds);
}

Status Trainer::write_plot() const {
  // gnuplot reads metrics.jsonl through a small TSV it is given.
  std::string tsv_train, tsv_epoch;
  std::ifstream in(fs::path(dir_) / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.value("kind", "") == "train")
      tsv_train += fmt::format("{}\t{}\n", j.value("step", 0), j.value("loss", 0.0));
    else if (j.value("kind", "") == "epoch")
      tsv_epoch += fmt::format("{}\t{}\t{}\n", j.value("step", 0), 100 * j.value("test_acc", 0.0),
                               100 * j.value("train_acc", 0.0));
  }
  SHOAL_RETURN_IF_ERROR(check_gnuplot());  // before any file is written
  std::string base = (fs::path(dir_) / ".plot").string();
  SHOAL_RETURN_IF_ERROR(write_file_atomic(base + ".train.tsv", tsv_train));
  SHOAL_RETURN_IF_ERROR(write_file_atomic(base + ".epoch.tsv", tsv_epoch));
  std::string png = (fs::path(dir_) / "metrics.png").string();
  std::string script = fmt::format(
      "set terminal pngcairo size 1000,420 noenhanced\n"
      "set output '{0}.tmp'\n"
      "set multiplot layout 1,2 title 'shoal train: {1} ({2})'\n"
      "set xlabel 'step'; set ylabel 'train loss'; set grid\n"
      "plot '{3}.train.tsv' using 1:2 with lines lw 2 title 'train loss'\n"
      "set ylabel 'accuracy (%)'; set key bottom right\n"
      "plot '{3}.epoch.tsv' using 1:2 with linespoints lw 2 title 'test', "
      "'{3}.epoch.tsv' using 1:3 with linespoints lw 2 title 'train'\n"
      "unset multiplot\n",
      png, o_.model, o_.optimizer, base);
  return render_gnuplot(script, png, base);
}

// Tokens for text, images otherwise: a GPT's rate stored as images per
// second read as a 20x faster image model.
const char* Trainer::rate_key() const {
  return impl_->train.tokens() ? "tokens_per_s" : "images_per_s";
}

// One "train" record: the mean loss of the `steps` steps since the last
// (named, so a plot knows its window; a running mean over the epoch drew a
// cliff at every epoch boundary).
void Trainer::log_train_record(int epoch, double loss, std::int64_t steps, double rate,
                               double flops) {
  nlohmann::json j = {{"kind", "train"},     {"epoch", epoch},
                      {"step", step_},       {"loss", loss},
                      {"loss_steps", steps}, {"lr", impl_->lr.data<float>()[0]},
                      {rate_key(), rate},    {"model_flops_per_s", flops}};
  if (impl_->peak_flops > 0) j["mfu"] = flops / impl_->peak_flops;
  impl_->metrics << j.dump() << "\n" << std::flush;
}

// The lead's run directory at the start of run(): created, its metrics
// opened, what a checkpoint writer killed mid-write left removed.
Status Trainer::open_run_dir() {
  namespace fs = std::filesystem;
  Impl& m = *impl_;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return unavailable("creating run directory {}: {}", dir_, ec.message());
  // A resumed run appends to its metrics, after dropping what the run
  // before it logged past the checkpoint it resumes from (else steps go
  // backwards); a fresh one starts them (a second run() on this trainer
  // continues the open file).
  const std::string metrics = (fs::path(dir_) / "metrics.jsonl").string();
  if (!m.metrics.is_open() && o_.resume) SHOAL_RETURN_IF_ERROR(keep_metrics_until(metrics, step_));
  if (!m.metrics.is_open()) m.metrics.open(metrics, o_.resume ? std::ios::app : std::ios::trunc);
  if (!m.metrics) return unavailable("opening {}/metrics.jsonl for append", dir_);
  if (!o_.metrics_note.empty()) m.metrics << o_.metrics_note << '\n' << std::flush;
  checkpoint_dir().clean();
  return ok_status();
}

// The lead's "epoch" record, line and plot.
void Trainer::log_epoch_record(const EpochMetrics& em, double elapsed_s) {
  Impl& m = *impl_;
  nlohmann::json j = {{"kind", "epoch"},
                      {"epoch", em.epoch},
                      {"partial", em.partial},
                      {"step", step_},
                      {"train_loss", em.train_loss},
                      {"train_acc", em.train_acc},
                      {"test_loss", em.test_loss},
                      {"test_acc", em.test_acc},
                      {rate_key(), em.images_per_s},
                      {"model_flops_per_s", em.model_flops_per_s},
                      {"train_seconds", em.train_seconds},
                      {"elapsed_seconds", elapsed_s}};
  if (m.train.tokens()) j["test_bits_per_char"] = em.test_loss / std::log(2.0);
  if (m.peak_flops > 0) j["mfu"] = em.mfu;
  m.metrics << j.dump() << "\n" << std::flush;
  if (!o_.quiet) print_epoch(em);
  if (o_.plot) {
    Status st = write_plot();
    if (!st.ok()) SHOAL_LOG_WARN("plot skipped: {}", st.to_string());
  }
}

Status keep_metrics_until(const std::string& path, std::int64_t step) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return ok_status();
  SHOAL_ASSIGN_OR_RETURN(std::string text, read_file(path));
  std::string kept;
  std::size_t start = 0, dropped = 0;
  while (start < text.size()) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.value("step", std::int64_t{0}) > step) {
      ++dropped;
      continue;
    }
    kept += line + "\n";
  }
  if (dropped == 0) return ok_status();
  return write_file_atomic(path, kept).with_context("dropping metrics past the resumed step");
}

}  // namespace shoal::train
