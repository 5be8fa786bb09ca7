// dist/plan.h's calibration as JSON: what `shoal plan --save-calibration`
// writes and `--calibration` reads back (a malformed file is named).
#include <algorithm>
#include <nlohmann/json.hpp>

#include "dist/plan_internal.h"

namespace shoal::dist {
namespace {

nlohmann::json profile_json(const train::StepProfile& p) {
  return {{"steps", p.steps},
          {"step_s", p.step_s},
          {"period_s", p.period_s},
          {"product_s", p.product_s},
          {"other_s", p.other_s},
          {"update_s", p.update_s},
          {"flops", p.flops},
          {"arena_bytes", p.arena_bytes},
          {"param_bytes", p.param_bytes},
          {"state_bytes", p.state_bytes},
          {"buffer_bytes", p.buffer_bytes},
          {"param_tensors", p.param_tensors}};
}

// Throws nlohmann::json::exception on a missing or mistyped field.
train::StepProfile parse_profile(const nlohmann::json& e) {
  train::StepProfile p;
  p.steps = e.at("steps").get<int>();
  p.step_s = e.at("step_s").get<double>();
  p.period_s = e.value("period_s", 0.0);
  p.product_s = e.at("product_s").get<double>();
  p.other_s = e.at("other_s").get<double>();
  p.update_s = e.at("update_s").get<double>();
  p.flops = e.at("flops").get<double>();
  p.arena_bytes = e.at("arena_bytes").get<std::size_t>();
  p.param_bytes = e.at("param_bytes").get<std::size_t>();
  p.state_bytes = e.at("state_bytes").get<std::size_t>();
  p.buffer_bytes = e.at("buffer_bytes").get<std::size_t>();
  p.param_tensors = e.value("param_tensors", 0);
  return p;
}

}  // namespace

std::string calibration_json(const Calibration& c) {
  nlohmann::json j;
  j["ranks"] = c.ranks;
  j["threads"] = c.threads;
  j["overlap"] = c.overlap;
  j["precision"] = c.precision;
  j["seconds"] = c.seconds;
  for (const auto& [rows, p] : c.steps) {
    nlohmann::json e = profile_json(p);
    e["rows"] = rows;
    j["steps"].push_back(e);
  }
  auto put_tp = [&j](bool sequence, const std::map<int, TpShape>& by_size) {
    for (const auto& [t, s] : by_size)
      j["tp"].push_back({{"size", t},
                         {"sequence_parallel", sequence},
                         {"refused", s.refused},
                         {"product_ratio", s.product_ratio},
                         {"other_ratio", s.other_ratio},
                         {"param_ratio", s.param_ratio},
                         {"arena_ratio", s.arena_ratio},
                         {"collective_bytes_per_row", s.collective_bytes_per_row},
                         {"shard_bytes_per_row", s.shard_bytes_per_row},
                         {"param_sum_bytes", s.param_sum_bytes}});
  };
  put_tp(false, c.tp);
  put_tp(true, c.tp_sequence);
  auto put_pp = [&j](int chunks, const std::map<int, PpShape>& by_size) {
    for (const auto& [p, s] : by_size)
      j["pp"].push_back({{"size", p},
                         {"chunks", chunks},
                         {"refused", s.refused},
                         {"stage_share", s.stage_share},
                         {"param_share", s.param_share},
                         {"boundary_bytes_per_row", s.boundary_bytes_per_row}});
  };
  put_pp(1, c.pp);
  for (const auto& [v, by_size] : c.pp_interleaved) put_pp(v, by_size);
  for (const auto& [family, bytes] : c.built_held) j["built_held"][family] = bytes;
  for (const auto& [rc, bytes] : c.recompute_held) j["recompute_held"][rc] = bytes;
  // Each group's fit; the all-reduces' with the group's wait.
  auto put_fits = [&](const char* kind, const std::map<Group, LinkFit>& fits, bool sync) {
    for (const auto& [g, f] : fits) {
      nlohmann::json e = {{"group", g.size},   {"stride", g.stride}, {"shift", g.shift},
                          {"span", g.span},    {"alpha", f.alpha},   {"beta", f.beta},
                          {"points", f.points}};
      if (sync) e["sync_s"] = c.sync_s.count(g) ? c.sync_s.at(g) : 0.0;
      j[kind].push_back(e);
    }
  };
  put_fits("allreduce", c.allreduce, true);
  put_fits("shard", c.shard, false);
  j["cores"] = c.cores;
  j["hosts"] = c.hosts;
  j["contention"] = c.contention;
  j["recompute"] = c.recompute;
  j["variant_rows"] = c.variant_rows;
  for (const auto& [key, p] : c.variants) j["variants"][key] = profile_json(p);
  j["accumulate_s"] = c.accumulate_s;
  return j.dump(1) + "\n";
}

Result<Calibration> parse_calibration(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return invalid_argument("plan calibration: not a JSON object");
  Calibration c;
  try {
    c.ranks = j.at("ranks").get<int>();
    c.threads = j.at("threads").get<int>();
    c.overlap = j.at("overlap").get<bool>();
    c.precision = j.at("precision").get<std::string>();
    c.seconds = j.value("seconds", 0.0);
    for (const auto& e : j.value("steps", nlohmann::json::array()))
      c.steps[e.at("rows").get<std::int64_t>()] = parse_profile(e);
    for (const auto& e : j.value("tp", nlohmann::json::array())) {
      TpShape s;
      s.refused = e.at("refused").get<std::string>();
      s.product_ratio = e.at("product_ratio").get<double>();
      s.other_ratio = e.at("other_ratio").get<double>();
      s.param_ratio = e.at("param_ratio").get<double>();
      s.arena_ratio = e.value("arena_ratio", 0.0);
      s.collective_bytes_per_row = e.at("collective_bytes_per_row").get<std::vector<double>>();
      s.shard_bytes_per_row = e.value("shard_bytes_per_row", std::vector<double>{});
      s.param_sum_bytes = e.value("param_sum_bytes", std::vector<double>{});
      (e.value("sequence_parallel", false) ? c.tp_sequence : c.tp)[e.at("size").get<int>()] = s;
    }
    for (const auto& e : j.value("pp", nlohmann::json::array())) {
      PpShape s;
      s.refused = e.at("refused").get<std::string>();
      s.stage_share = e.at("stage_share").get<double>();
      s.param_share = e.at("param_share").get<double>();
      s.boundary_bytes_per_row = e.at("boundary_bytes_per_row").get<double>();
      const int chunks = e.value("chunks", 1);
      if (chunks < 1 || chunks > 64)
        return invalid_argument("plan calibration: a pipeline of {} chunks a rank", chunks);
      (chunks == 1 ? c.pp : c.pp_interleaved[chunks])[e.at("size").get<int>()] = s;
    }
    const nlohmann::json built = j.value("built_held", nlohmann::json::object());
    for (const auto& [family, bytes] : built.items()) c.built_held[family] = bytes.get<double>();
    const nlohmann::json held = j.value("recompute_held", nlohmann::json::object());
    for (const auto& [rc, bytes] : held.items()) c.recompute_held[rc] = bytes.get<double>();
    c.cores = j.value("cores", 1);
    c.hosts = j.value("hosts", 1);
    c.contention = j.value("contention", 0.0);
    c.recompute = j.value("recompute", "none");
    c.variant_rows = j.value("variant_rows", std::int64_t{0});
    const nlohmann::json variants = j.value("variants", nlohmann::json::object());
    for (const auto& [key, e] : variants.items()) c.variants[key] = parse_profile(e);
    c.accumulate_s = j.value("accumulate_s", 0.0);
    for (auto [kind, fits] : {std::pair{"allreduce", &c.allreduce}, std::pair{"shard", &c.shard}})
      for (const auto& e : j.value(kind, nlohmann::json::array())) {
        const Group g{e.at("group").get<int>(), e.value("stride", 1), e.value("shift", 0),
                      e.value("span", 0)};
        LinkFit f{e.at("alpha").get<double>(), e.at("beta").get<double>(), {}};
        f.points = e.value("points", std::vector<std::pair<double, double>>{});
        if (!std::is_sorted(f.points.begin(), f.points.end()))
          return invalid_argument("plan calibration: a group's {} sizes are not in ascending order",
                                  kind);
        (*fits)[g] = f;
        if (fits == &c.allreduce) c.sync_s[g] = e.value("sync_s", 0.0);
      }
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("plan calibration: {}", e.what());
  }
  if (c.steps.empty()) return invalid_argument("plan calibration: no step sizes measured");
  if (c.hosts < 1 || c.ranks % c.hosts != 0)
    return invalid_argument("plan calibration: {} ranks over {} hosts", c.ranks, c.hosts);
  return c;
}

}  // namespace shoal::dist
