// The cost model of dist/plan.h: each layout's step time and memory per
// rank from a calibration, the layouts a job allows, and how the plan is
// shown and written.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>

#include "dist/plan_internal.h"

namespace shoal::dist {
namespace {

double lerp(double a, double b, double t) { return a + (b - a) * t; }

// The profile at `rows`, linear between the measured sizes (and beyond
// them along the nearest two; one size alone scales in proportion).
train::StepProfile profile_at(const Calibration& c, std::int64_t rows) {
  const auto& s = c.steps;
  if (s.empty()) return {};
  if (auto it = s.find(rows); it != s.end()) return it->second;
  auto hi = s.lower_bound(rows);
  if (s.size() == 1) hi = s.begin();
  if (hi == s.end()) --hi;
  auto lo = hi == s.begin() ? std::next(hi) : std::prev(hi);
  if (lo == s.end()) lo = hi;
  train::StepProfile p = hi->second;
  const double x0 = static_cast<double>(lo->first), x1 = static_cast<double>(hi->first);
  const double t = x0 == x1 ? 0 : (static_cast<double>(rows) - x0) / (x1 - x0);
  const train::StepProfile &a = lo->second, &b = hi->second;
  if (x0 == x1) {  // one size: in proportion to the rows
    const double k = static_cast<double>(rows) / x1;
    p.product_s *= k;
    p.other_s *= k;
    p.step_s *= k;
    p.arena_bytes = static_cast<std::size_t>(static_cast<double>(p.arena_bytes) * k);
    return p;
  }
  p.product_s = std::max(0.0, lerp(a.product_s, b.product_s, t));
  p.other_s = std::max(0.0, lerp(a.other_s, b.other_s, t));
  p.update_s = std::max(0.0, lerp(a.update_s, b.update_s, t));
  p.step_s = std::max(0.0, lerp(a.step_s, b.step_s, t));
  p.arena_bytes = static_cast<std::size_t>(std::max(
      0.0, lerp(static_cast<double>(a.arena_bytes), static_cast<double>(b.arena_bytes), t)));
  return p;
}

// The group's own measurement; else (a calibration made for other
// layouts) the nearest group of at least its size, the widest stride first.
template <typename V>
const V* nearest(const std::map<Group, V>& m, Group g) {
  if (g.size < 2 || m.empty()) return nullptr;
  if (auto it = m.find(g); it != m.end()) return &it->second;
  int size = 0;  // the smallest measured size >= g's (else the largest)
  for (const auto& [k, v] : m)
    if (size == 0 && k.size >= g.size) size = k.size;
  if (size == 0) size = m.rbegin()->first.size;
  const V* best = nullptr;
  for (const auto& [k, v] : m)
    if (k.size == size) best = &v;  // ordered by stride: the widest last
  return best;
}

// An all-reduce of `bytes` among the group's ranks.
double allreduce_s(const Calibration& c, Group g, double bytes) {
  const LinkFit* f = bytes > 0 ? nearest(c.allreduce, g) : nullptr;
  return f != nullptr ? f->time(bytes) : 0;
}

// A reduce-scatter then an all-gather of `bytes` within one group, where
// the calibration measured that group's (else as its all-reduce).
double shard_pair_s(const Calibration& c, Group g, double bytes) {
  if (bytes <= 0) return 0;
  auto it = c.shard.find(g);
  return it != c.shard.end() ? it->second.time(bytes) : allreduce_s(c, g, bytes);
}

// What one collective inside the step adds beyond its transfer (waiting
// for the group while every rank computes).
double sync_s(const Calibration& c, Group g) {
  const double* s = nearest(c.sync_s, g);
  return s != nullptr ? *s : 0;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int k = 1; k <= n; ++k)
    if (n % k == 0) d.push_back(k);
  return d;
}

std::string mb(double bytes) { return fmt::format("{:.1f}", bytes / 1e6); }

// The base profile at `rows` under another precision or recomputation:
// each part scaled by what the variant measured against the base at the
// calibration's variant size; its bytes as the variant holds them.
train::StepProfile variant_at(const Calibration& c, std::int64_t rows, const std::string& key) {
  train::StepProfile p = profile_at(c, rows);
  auto it = c.variants.find(key);
  if (it == c.variants.end()) return p;
  const train::StepProfile& v = it->second;
  const train::StepProfile b = profile_at(c, c.variant_rows);
  // Recomputing never makes a step faster: a run that says so measured
  // the host's noise (seen: ResNet-20 "5% faster" with --recompute full).
  const double floor = key.ends_with("/none") ? 0.0 : 1.0;
  auto ratio = [](double x, double y) { return y > 0 ? x / y : 1.0; };
  auto slower = [&](double x, double y) { return std::max(floor, ratio(x, y)); };
  p.product_s *= slower(v.product_s, b.product_s);
  p.other_s *= slower(v.other_s, b.other_s);
  p.update_s *= slower(v.update_s, b.update_s);
  p.step_s *= slower(v.step_s, b.step_s);
  p.arena_bytes = static_cast<std::size_t>(
      static_cast<double>(p.arena_bytes) *
      ratio(static_cast<double>(v.arena_bytes), static_cast<double>(b.arena_bytes)));
  p.param_bytes = v.param_bytes;
  p.state_bytes = v.state_bytes;
  p.buffer_bytes = v.buffer_bytes;
  return p;
}

}  // namespace

double LinkFit::time(double bytes) const {
  if (bytes <= 0) return 0;
  if (points.size() < 2) return alpha + bytes * beta;
  std::size_t i = 1;
  while (i + 1 < points.size() && points[i].first < bytes) ++i;
  const auto& [x0, y0] = points[i - 1];
  const auto& [x1, y1] = points[i];
  const double t = y0 + (bytes - x0) * (y1 - y0) / std::max(x1 - x0, 1.0);
  return std::max(t, std::min(y0, y1) * std::min(1.0, bytes / std::max(x0, 1.0)));
}

const std::vector<PlanKey>& plan_keys() {
  // The step and its two halves, then each class apart (for the check to
  // name the one that was off), then the largest rank's memory.
  static const std::vector<PlanKey> keys = {{"plan-step-seconds", &Candidate::step_s},
                                            {"plan-compute-seconds", &Candidate::compute_s},
                                            {"plan-comm-seconds", &Candidate::comm_s},
                                            {"plan-products-seconds", &Candidate::product_s},
                                            {"plan-other-seconds", &Candidate::other_s},
                                            {"plan-update-seconds", &Candidate::update_s},
                                            {"plan-allreduce-seconds", &Candidate::allreduce_s},
                                            {"plan-transfer-seconds", &Candidate::transfer_s},
                                            {"plan-shard-seconds", &Candidate::shard_s},
                                            {"plan-memory-bytes", &Candidate::memory_bytes}};
  return keys;
}

std::string variant_key(const std::string& precision, const std::string& recompute) {
  return precision + "/" + recompute;
}

std::string Candidate::flags() const {
  std::string s = fmt::format("--dp {} --tp {} --pp {}", dp, layout.tp, layout.pp);
  if (layout.sequence_parallel) s += " --sequence-parallel";
  if (zero > 0) s += fmt::format(" --zero {}", zero);
  s += fmt::format(" --micro-batches {} --batch {}", micro_batches(layout), batch);
  if (layout.pp_schedule != "1f1b") s += " --pp-schedule " + layout.pp_schedule;
  if (layout.pp_virtual > 1) s += fmt::format(" --pp-virtual {}", layout.pp_virtual);
  if (precision != "f32") s += " --precision " + precision;
  if (recompute != "none") s += " --recompute " + recompute;
  return s;
}

std::vector<std::pair<Layout, int>> job_layouts(const PlanRequest& r) {
  std::vector<std::pair<Layout, int>> out;
  for (int T : divisors(r.ranks)) {
    for (int P : divisors(r.ranks / T)) {
      const int D = r.ranks / (T * P);
      if (r.global_batch % D != 0) continue;
      const std::int64_t b = r.global_batch / D;
      for (int k : {1, 2, 4}) {
        Layout l;
        l.tp = T;
        l.pp = P;
        l.micro_batches = P > 1 ? P * k : k;
        if (b % l.micro_batches != 0) continue;
        // A pipeline also as GPipe (every forward first) and interleaved
        // (v pieces a rank, Megatron's 1F1B over them); tensor parallelism
        // each of those also with sequence parallelism.
        std::vector<Layout> ways = {l};
        if (P > 1) {
          ways.push_back(l);
          ways.back().pp_schedule = "gpipe";
          for (int v : kPpVirtual) {
            ways.push_back(l);
            ways.back().pp_virtual = v;
          }
        }
        if (T > 1)
          for (std::size_t i = 0, n = ways.size(); i < n; ++i) {
            ways.push_back(ways[i]);
            ways.back().sequence_parallel = true;
          }
        for (const Layout& w : ways)
          for (int zero = 0; zero <= (D > 1 ? 3 : 0); ++zero) {
            dp::DpOptions d;
            d.zero = zero;
            if (!check_layout(w, d, r.ranks).ok()) continue;
            if (zero == 3 && (P > 1 || w.micro_batches > 1)) continue;  // refused by attach
            out.emplace_back(w, zero);
          }
      }
    }
  }
  return out;
}

namespace {

// The distinct groups `add` names for each layout of the job (with its
// ZeRO stage and data-parallel ranks), in order.
std::vector<Group> distinct_groups(
    const PlanRequest& r,
    const std::function<void(const Layout&, int zero, int D, std::vector<Group>&)>& add) {
  std::vector<Group> g;
  for (const auto& [l, zero] : job_layouts(r)) add(l, zero, r.ranks / (l.tp * l.pp), g);
  std::sort(g.begin(), g.end());
  g.erase(std::unique(g.begin(), g.end()), g.end());
  return g;
}

}  // namespace

std::vector<Group> job_groups(const PlanRequest& r) {
  return distinct_groups(r, [](const Layout& l, int, int D, std::vector<Group>& g) {
    if (l.tp > 1) g.push_back({l.tp, 1});
    if (l.pp > 1) g.push_back({2, l.tp, 0, l.tp * l.pp});
    if (l.pp > 2) g.push_back({2, l.tp, 1, l.tp * l.pp});  // the hops between the pairs
    if (D > 1) g.push_back({D, l.tp * l.pp});
  });
}

std::vector<Group> job_shard_groups(const PlanRequest& r) {
  return distinct_groups(r, [](const Layout& l, int zero, int D, std::vector<Group>& g) {
    if (l.tp > 1 && l.sequence_parallel) g.push_back({l.tp, 1});
    if (D > 1 && zero >= 1) g.push_back({D, l.tp * l.pp});
  });
}

std::vector<std::int64_t> micro_batch_rows(const PlanRequest& r) {
  std::vector<std::int64_t> rows;
  for (const auto& [l, zero] : job_layouts(r))
    rows.push_back(r.global_batch / (r.ranks / (l.tp * l.pp)) / micro_batches(l));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

namespace {

// What a layout leaves one rank: its groups' sizes, rows and shares.
struct Split {
  int T = 1, P = 1, D = 1, m = 1, v = 1;  // v: pieces a pipeline rank holds
  std::int64_t rows = 0;
  double share = 1;  // of the parameters a rank holds
  TpShape tp;
  PpShape pp;
  train::StepProfile p;  // the model's step at `rows` (precision, recompute)
};

// Data parallelism's sums over the D ranks of a group (ZeRO's
// reduce-scatters and gathers), what the step's compute leaves showing.
double data_parallel_s(const Calibration& c, const Split& s, const Candidate& k) {
  const int zero = k.zero;
  const Group dp_group{s.D, s.T * s.P};
  const double wire = k.precision == "bf16" && zero < 3 ? 2.0 : 4.0;  // dp::wire_dtype
  const double grads = static_cast<double>(s.p.param_bytes) / 4.0 * wire * s.share;
  // ZeRO reduce-scatters the gradients and all-gathers the parameters;
  // ZeRO-3 gathers them for the forward and again for the backward: 1.5
  // pairs. Two collectives, not one: a second wait for the group (and
  // the second's latency where the pair was not measured).
  const bool pair = zero >= 1 && c.shard.count(dp_group) > 0;
  double dp = (zero >= 1 ? shard_pair_s(c, dp_group, grads) : allreduce_s(c, dp_group, grads)) *
                  (zero == 3 ? 1.5 : 1.0) +
              sync_s(c, dp_group);
  if (zero >= 1) dp += (pair ? 0.0 : allreduce_s(c, dp_group, 1)) + sync_s(c, dp_group);
  // ZeRO-3 gathers each parameter where the forward uses it and again in
  // the backward: two collectives inside the step per tensor.
  if (zero == 3) dp += 2.0 * s.p.param_tensors * s.share * sync_s(c, dp_group);
  // Overlapped with the backward (about 2/3 of the compute) where a
  // core is free for it; what is left shows.
  if (c.overlap) dp = std::max(0.1 * dp, dp - 2.0 / 3.0 * k.compute_s);
  return dp;
}

// The step's compute and collectives, each class apart.
void price_step(const Calibration& c, const Split& s, Candidate& k) {
  const int T = s.T, P = s.P, D = s.D, m = s.m, zero = k.zero;
  const train::StepProfile& p = s.p;
  const Group tp_group{T, 1}, pp_group{2, T, 0, T * P};
  const double rows = static_cast<double>(s.rows);
  double tp_mb = 0;
  for (double b : s.tp.collective_bytes_per_row)
    tp_mb += allreduce_s(c, tp_group, b * rows) + sync_s(c, tp_group);
  // A reduce-scatter or an all-gather of the forward, and its gradient's
  // opposite in the backward: one measured pair, two waits.
  for (double b : s.tp.shard_bytes_per_row)
    tp_mb += shard_pair_s(c, tp_group, b * rows) + 2 * sync_s(c, tp_group);
  // Parameters' gradient sums: one all-reduce of them all where sequence
  // parallelism buckets them (one micro-batch, no pipeline), else one each.
  if (!s.tp.shard_bytes_per_row.empty() && m == 1 && P == 1) {
    double all = 0;
    for (double b : s.tp.param_sum_bytes) all += b;
    if (all > 0) tp_mb += allreduce_s(c, tp_group, all) + sync_s(c, tp_group);
  } else {
    for (double b : s.tp.param_sum_bytes)
      tp_mb += allreduce_s(c, tp_group, b) + sync_s(c, tp_group);
  }
  k.update_s = p.update_s * s.share / (zero >= 1 ? D : 1);
  const double stage = P > 1 ? s.pp.stage_share : 1.0;
  k.product_s = m * p.product_s * s.tp.product_ratio * stage;
  k.other_s = m * p.other_s * s.tp.other_ratio * stage + (m - 1) * c.accumulate_s * s.share;
  double path = k.product_s + k.other_s;  // the kernels of this rank's micro-batches
  if (P == 1) {
    k.allreduce_s = m * tp_mb;
  } else {
    // (m + P - 1) slots of the largest stage: the pipeline's bubble. On a
    // host with more ranks x threads than cores the calibration ran every
    // rank at once; a stage idle in the bubble leaves its core to the
    // others, so the path runs faster by that contention, but never below
    // the work every stage must do with all of them busy.
    // Interleaved (v pieces a rank): m v + P - 1 slots of a piece, each
    // 1/v of a micro-batch's stage (Megatron's bubble, (P - 1) / v).
    const double slots = m * s.v + P - 1;
    const double contention = std::max(
        1.0, c.contention > 0 ? c.contention
                              : static_cast<double>(c.ranks / std::max(c.hosts, 1) * c.threads) /
                                    std::max(c.cores, 1));
    path = std::max(path, slots * (path / m / s.v) / contention);
    // A message across a cut: the rows' activation (its gradient back)
    // priced as the pair's measured all-reduce of those bytes. Under
    // sequence parallelism the residual stream a cut carries is sharded
    // (mp::shard_sequence): each of the T ranks sends its 1/T of the rows,
    // where without it each sends them all.
    const double bytes = s.pp.boundary_bytes_per_row * static_cast<double>(s.rows) /
                         (k.layout.sequence_parallel ? T : 1);
    // Rank r's cut to r + 1: the even ones measured in pp_group, the odd
    // ones (P > 2) between its pairs, the last (to rank 0, interleaved)
    // like an odd one where there are more than two. What they add to the
    // step: the ranks' work replayed in the schedule's order with them.
    const double even = allreduce_s(c, pp_group, bytes);
    const double odd = P > 2 ? allreduce_s(c, {2, T, 1, T * P}, bytes) : even;
    std::vector<double> hop(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r)
      hop[static_cast<std::size_t>(r)] = r % 2 == 0 && r < P - 1 ? even : odd;
    k.allreduce_s = slots * tp_mb * stage / s.v;
    k.transfer_s = pipeline_transfer_s(k.layout.pp_schedule, P, m, s.v, path / slots, hop);
  }
  k.compute_s = path + k.update_s;
  if (D > 1) (zero >= 1 ? k.shard_s : k.allreduce_s) += data_parallel_s(c, s, k);
  k.comm_s = k.allreduce_s + k.transfer_s + k.shard_s;
  k.step_s = k.compute_s + k.comm_s;
}

// Micro-batches whose activations the first stage holds at once, in
// micro-batches' worth of its stage (mp::stage_work's schedules): GPipe all
// of them, 1F1B at most P, interleaved its warm-up of 2 (P - 1) + (v - 1) P
// pieces and one more, each 1/v of a stage (all of them when m == P).
double in_flight(const Layout& l, int m, int P) {
  const int v = l.pp_virtual;
  if (v > 1) {
    const int total = m * v;
    const int held = m == P ? total : std::min(total, 2 * (P - 1) + (v - 1) * P + 1);
    return static_cast<double>(held) / v;
  }
  return l.pp_schedule == "gpipe" ? m : std::min(m, P);
}

// The largest rank's bytes: the step's arena and the state it holds.
double price_memory(const Split& s, const Layout& l, int zero) {
  const train::StepProfile& p = s.p;
  // The arena holds the gradients (split as the parameters are) and the
  // activations (as the other work is).
  const double grads_whole =
      std::min(static_cast<double>(p.param_bytes), static_cast<double>(p.arena_bytes));
  double arena = s.tp.arena_ratio > 0
                     ? static_cast<double>(p.arena_bytes) * s.tp.arena_ratio
                     : (static_cast<double>(p.arena_bytes) - grads_whole) * s.tp.other_ratio +
                           grads_whole * s.tp.param_ratio;
  if (s.P > 1) arena *= s.pp.stage_share * in_flight(l, s.m, s.P);
  const double params = static_cast<double>(p.param_bytes) * s.share;
  if (s.m > 1) arena += params;  // accumulated gradients
  return arena + params / (zero == 3 ? s.D : 1) +
         static_cast<double>(p.state_bytes) * s.share / (zero >= 1 ? s.D : 1) +
         static_cast<double>(p.buffer_bytes);
}

// What layout `l` leaves one rank of `r`'s job.
Split split_of(const PlanRequest& r, const Calibration& c, const Layout& l,
               const std::string& variant) {
  Split s;
  s.T = l.tp;
  s.P = l.pp;
  s.D = r.ranks / (s.T * s.P);
  s.m = micro_batches(l);
  s.v = l.pp_virtual;
  s.rows = r.global_batch / s.D / s.m;
  s.p = variant_at(c, s.rows, variant);
  if (s.T > 1) s.tp = l.sequence_parallel ? c.tp_sequence.at(s.T) : c.tp.at(s.T);
  if (s.P > 1) s.pp = s.v > 1 ? c.pp_interleaved.at(s.v).at(s.P) : c.pp.at(s.P);
  s.share = s.tp.param_ratio * s.pp.param_share;
  return s;
}

// The formula scaled by what a step the calibration built held against the
// formula's price of that same step (ZeRO 0, the calibration's precision):
// the layout's family's (an interleaved pipeline's at tp 1), or for a
// recomputation the one built with data parallelism over every rank; 1
// where none was built.
double built_scale(const PlanRequest& r, const Calibration& c, const Layout& l,
                   const std::string& recompute) {
  const bool recomputes = recompute != "none";
  Layout built = recomputes ? Layout{} : l;
  if (l.pp_virtual > 1) {
    built.tp = 1;
    built.sequence_parallel = false;
  }
  const auto& held = recomputes ? c.recompute_held : c.built_held;
  auto it = held.find(recomputes ? recompute : family_key(built));
  if (it == held.end()) return 1;
  const Split s = split_of(r, c, built, variant_key(c.precision, recompute));
  const double formula = price_memory(s, built, 0);
  return formula > 0 ? it->second / formula : 1;
}

}  // namespace

std::string family_key(const Layout& l) {
  return fmt::format("tp{}{}/pp{}/{}/v{}/m{}", l.tp, l.sequence_parallel ? "+sp" : "", l.pp,
                     l.pp_schedule, l.pp_virtual, micro_batches(l));
}

Candidate predict(const PlanRequest& r, const Calibration& c, const Layout& l, int zero,
                  const std::string& precision, const std::string& recompute) {
  Candidate k;
  k.layout = l;
  k.zero = zero;
  k.precision = precision.empty() ? c.precision : precision;
  k.recompute = recompute.empty() ? c.recompute : recompute;
  const Split s = split_of(r, c, l, variant_key(k.precision, k.recompute));
  k.dp = s.D;
  k.layout.dp = s.D;
  k.batch = r.global_batch / s.D;
  price_step(c, s, k);
  k.memory_bytes = price_memory(s, l, zero) * built_scale(r, c, l, k.recompute);
  k.fits = r.mem_per_rank <= 0 || k.memory_bytes <= r.mem_per_rank;
  return k;
}

std::vector<Candidate> plan_layouts(const PlanRequest& r, const Calibration& c) {
  auto splits = [](const auto& shapes, int n) {
    return n == 1 || (shapes.count(n) && shapes.at(n).refused.empty());
  };
  // The base's precision and recomputation, and each variant measured.
  std::vector<std::pair<std::string, std::string>> variants = {{c.precision, c.recompute}};
  for (const auto& [key, v] : c.variants)
    variants.emplace_back(key.substr(0, key.find('/')), key.substr(key.find('/') + 1));
  std::vector<Candidate> out;
  for (const auto& [l, zero] : job_layouts(r)) {
    const int v = l.pp_virtual;
    if (v > 1 && !c.pp_interleaved.count(v)) continue;  // not calibrated
    if (!splits(l.sequence_parallel ? c.tp_sequence : c.tp, l.tp) ||
        !splits(v > 1 ? c.pp_interleaved.at(v) : c.pp, l.pp))
      continue;
    for (const auto& [precision, recompute] : variants) {
      // The trainer recomputes only a step it differentiates whole; and
      // what recomputing saves is measured under data parallelism alone:
      // with tensor parallelism's collectives or ZeRO-3's gathers in the
      // forward it saves far less (measured: +60-100% over the prediction).
      if (recompute != "none" && (l.pp > 1 || micro_batches(l) > 1 || l.tp > 1 || zero == 3))
        continue;
      out.push_back(predict(r, c, l, zero, precision, recompute));
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    return a.step_s < b.step_s;
  });
  return out;
}

std::string plan_table(const std::vector<Candidate>& cs, std::size_t rows) {
  std::size_t w = 56;
  for (std::size_t i = 0; i < cs.size() && i < rows; ++i) w = std::max(w, cs[i].flags().size());
  std::string s = fmt::format("{:>3}  {:<{}} {:>10} {:>9} {:>9} {:>10}\n", "#", "layout", w,
                              "compute ms", "comm ms", "step ms", "memory MB");
  for (std::size_t i = 0; i < cs.size() && i < rows; ++i) {
    const Candidate& c = cs[i];
    s += fmt::format("{:>3}  {:<{}} {:>10.1f} {:>9.1f} {:>9.1f} {:>10}{}\n", i + 1, c.flags(), w,
                     c.compute_s * 1e3, c.comm_s * 1e3, c.step_s * 1e3, mb(c.memory_bytes),
                     c.fits ? "" : "  over the budget");
  }
  if (cs.size() > rows) s += fmt::format("     ({} more)\n", cs.size() - rows);
  return s;
}

std::string candidates_json(const std::vector<Candidate>& cs) {
  nlohmann::json j = nlohmann::json::array();
  for (const Candidate& c : cs)
    j.push_back({{"flags", c.flags()},
                 {"dp", c.dp},
                 {"tp", c.layout.tp},
                 {"sequence_parallel", c.layout.sequence_parallel},
                 {"pp", c.layout.pp},
                 {"zero", c.zero},
                 {"micro_batches", micro_batches(c.layout)},
                 {"pp_schedule", c.layout.pp_schedule},
                 {"pp_virtual", c.layout.pp_virtual},
                 {"precision", c.precision},
                 {"recompute", c.recompute},
                 {"batch", c.batch},
                 {"compute_s", c.compute_s},
                 {"product_s", c.product_s},
                 {"other_s", c.other_s},
                 {"update_s", c.update_s},
                 {"allreduce_s", c.allreduce_s},
                 {"transfer_s", c.transfer_s},
                 {"shard_s", c.shard_s},
                 {"comm_s", c.comm_s},
                 {"step_s", c.step_s},
                 {"memory_bytes", c.memory_bytes},
                 {"fits", c.fits}});
  return j.dump(1) + "\n";
}

std::string plan_yaml(const Candidate& c, const PlanRequest& r, const train::TrainSettings& s) {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "model" << YAML::Value << s.model;
  e << YAML::Key << "data" << YAML::Value << s.data;
  if (s.model == "gpt") {
    e << YAML::Key << "layers" << YAML::Value << s.gpt.layers;
    e << YAML::Key << "heads" << YAML::Value << s.gpt.heads;
    e << YAML::Key << "dim" << YAML::Value << s.gpt.dim;
    e << YAML::Key << "context" << YAML::Value << s.gpt.context;
  }
  e << YAML::Key << "optimizer" << YAML::Value << s.optimizer;
  e << YAML::Key << "precision" << YAML::Value << c.precision;
  e << YAML::Key << "recompute" << YAML::Value << c.recompute;
  e << YAML::Key << "batch" << YAML::Value << c.batch;
  e << YAML::Key << "dp" << YAML::Value << c.dp;
  e << YAML::Key << "tp" << YAML::Value << c.layout.tp;
  if (c.layout.sequence_parallel) e << YAML::Key << "sequence-parallel" << YAML::Value << true;
  e << YAML::Key << "pp" << YAML::Value << c.layout.pp;
  e << YAML::Key << "zero" << YAML::Value << c.zero;
  e << YAML::Key << "micro-batches" << YAML::Value << micro_batches(c.layout);
  if (c.layout.pp_schedule != "1f1b")
    e << YAML::Key << "pp-schedule" << YAML::Value << c.layout.pp_schedule;
  if (c.layout.pp_virtual > 1) e << YAML::Key << "pp-virtual" << YAML::Value << c.layout.pp_virtual;
  e << YAML::Key << "plan-ranks" << YAML::Value << r.ranks;
  for (const auto& [key, field] : plan_keys()) {
    e << YAML::Key << key;
    if (field == &Candidate::memory_bytes)
      e << YAML::Value << static_cast<std::int64_t>(std::llround(c.memory_bytes));
    else
      e << YAML::Value << fmt::format("{:.6f}", c.*field);
  }
  e << YAML::EndMap;
  return fmt::format(
      "# shoal plan: {} on {} ranks, {} samples per step; edit freely (these are\n"
      "# `shoal train` flags); the plan-* keys are the prediction `shoal train --plan`\n"
      "# checks the run against.\n{}\n",
      s.model, r.ranks, r.global_batch, e.c_str());
}

}  // namespace shoal::dist
