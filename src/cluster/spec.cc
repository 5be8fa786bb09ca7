#include "shoal/cluster/spec.h"

#include <algorithm>
#include <cctype>

#include "cluster/yaml_fields.h"
#include "shoal/core/file.h"

namespace shoal::cluster {

const char* link_need_name(LinkNeed l) {
  switch (l) {
    case LinkNeed::kNone:
      return "none";
    case LinkNeed::kRing:
      return "ring";
    case LinkNeed::kMesh:
      return "mesh";
  }
  return "?";
}

const char* job_kind_name(JobKind k) {
  switch (k) {
    case JobKind::kSync:
      return "sync";
    case JobKind::kElastic:
      return "elastic";
    case JobKind::kPs:
      return "ps";
  }
  return "?";
}

Status validate(const JobSpec& j) {
  const std::string who = j.name.empty() ? "job" : "job `" + j.name + "`";
  if (j.ranks < 1) return invalid_argument("{}: ranks is {}, must be ≥ 1", who, j.ranks);
  if (j.kind == JobKind::kSync && j.min_ranks != 0 && j.min_ranks != j.ranks)
    return invalid_argument("{}: min_ranks {} on a sync job (a gang runs all {} ranks or none)",
                            who, j.min_ranks, j.ranks);
  if (j.kind != JobKind::kSync && (j.min_ranks < 1 || j.min_ranks > j.ranks))
    return invalid_argument("{}: min_ranks is {}, must be in [1, ranks = {}] for a {} job", who,
                            j.min_ranks, j.ranks, job_kind_name(j.kind));
  if (j.kind != JobKind::kPs && j.servers != 0)
    return invalid_argument("{}: servers {} on a {} job (only kind: ps has servers)", who,
                            j.servers, job_kind_name(j.kind));
  if (j.kind == JobKind::kPs && j.servers < 1)
    return invalid_argument("{}: a ps job needs servers ≥ 1, got {}", who, j.servers);
  if (j.links != LinkNeed::kNone && j.accels_per_rank < 1)
    return invalid_argument("{}: links: {} needs accels_per_rank ≥ 1 (links join accelerators)",
                            who, link_need_name(j.links));
  if (j.links != LinkNeed::kNone && j.kind != JobKind::kSync)
    return invalid_argument(
        "{}: links: {} on a {} job (a ring or mesh is a fixed set of chips: only sync jobs)", who,
        link_need_name(j.links), job_kind_name(j.kind));
  if (j.links == LinkNeed::kMesh && j.mesh_w * j.mesh_h != j.total_accels())
    return invalid_argument("{}: mesh {}x{} has {} chips but ranks × accels_per_rank = {}", who,
                            j.mesh_w, j.mesh_h, j.mesh_w * j.mesh_h, j.total_accels());
  if (j.comm_fraction < 0 || j.comm_fraction > 1)
    return invalid_argument("{}: comm_fraction {} outside [0, 1]", who, j.comm_fraction);
  return ok_status();
}

namespace {

Status read_links(const Fields& f, JobSpec& j) {
  SHOAL_ASSIGN_OR_RETURN(LinkShape l, read_link_shape(f, "links"));
  j.links = l.kind == 2 ? LinkNeed::kMesh : l.kind == 1 ? LinkNeed::kRing : LinkNeed::kNone;
  j.mesh_w = l.w;
  j.mesh_h = l.h;
  return ok_status();
}

Status read_kind(const Fields& f, JobSpec& j) {
  SHOAL_ASSIGN_OR_RETURN(std::string kind, f.text("kind", "sync"));
  if (kind == "sync") {
    j.kind = JobKind::kSync;
  } else if (kind == "elastic") {
    j.kind = JobKind::kElastic;
  } else if (kind == "ps") {
    j.kind = JobKind::kPs;
  } else {
    return invalid_argument("{}: `{}` is not one of sync, elastic, ps", f.at("kind"), kind);
  }
  return ok_status();
}

}  // namespace

Result<JobSpec> parse_job_spec(const std::string& text, const std::string& where) {
  SHOAL_ASSIGN_OR_RETURN(YAML::Node root, load_yaml(text, where));
  SHOAL_ASSIGN_OR_RETURN(
      Fields f,
      Fields::open(root, where,
                   {"name", "ranks", "min_ranks", "servers", "cpus_per_rank", "mem_mb_per_rank",
                    "accels_per_rank", "links", "kind", "queue", "priority", "max_runtime_s",
                    "checkpoint_every_s", "allreduce_mb", "comm_fraction"}));
  JobSpec j;
  SHOAL_ASSIGN_OR_RETURN(j.name, f.text("name", ""));
  if (j.name.empty()) return invalid_argument("{}: field `name` is missing", where);
  // It names files, Slurm's job and Kubernetes' objects: a space or a quote
  // would be refused later, by sbatch or the API server.
  const bool name_ok =
      j.name.size() <= 63 && std::isalnum(static_cast<unsigned char>(j.name[0])) &&
      std::all_of(j.name.begin(), j.name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
      });
  if (!name_ok)
    return invalid_argument(
        "{}: field `name`: `{}` must be at most 63 letters, digits, '-', '_' or '.', starting "
        "with a letter or digit",
        where, j.name);
  SHOAL_ASSIGN_OR_RETURN(auto ranks, f.integer("ranks", 1, 1, 1 << 20));
  SHOAL_ASSIGN_OR_RETURN(auto min_ranks, f.integer("min_ranks", 0, 0, 1 << 20));
  SHOAL_ASSIGN_OR_RETURN(auto servers, f.integer("servers", 0, 0, 4096));
  SHOAL_ASSIGN_OR_RETURN(auto cpus, f.integer("cpus_per_rank", 1, 0, 1 << 16));
  SHOAL_ASSIGN_OR_RETURN(j.mem_mb_per_rank, f.integer("mem_mb_per_rank", 0, 0, 1ll << 40));
  SHOAL_ASSIGN_OR_RETURN(auto accels, f.integer("accels_per_rank", 0, 0, 64));
  SHOAL_ASSIGN_OR_RETURN(auto prio, f.integer("priority", 0, -1000000, 1000000));
  j.ranks = static_cast<int>(ranks);
  j.min_ranks = static_cast<int>(min_ranks);
  j.servers = static_cast<int>(servers);
  j.cpus_per_rank = static_cast<int>(cpus);
  j.accels_per_rank = static_cast<int>(accels);
  j.priority = static_cast<int>(prio);
  SHOAL_RETURN_IF_ERROR(read_links(f, j));
  SHOAL_RETURN_IF_ERROR(read_kind(f, j));
  SHOAL_ASSIGN_OR_RETURN(j.queue, f.text("queue", "default"));
  SHOAL_ASSIGN_OR_RETURN(j.max_runtime_s, f.number("max_runtime_s", 0, 0, 1e9));
  SHOAL_ASSIGN_OR_RETURN(j.checkpoint_every_s, f.number("checkpoint_every_s", 0, 0, 1e9));
  SHOAL_ASSIGN_OR_RETURN(j.allreduce_mb, f.number("allreduce_mb", 100, 0, 1e7));
  SHOAL_ASSIGN_OR_RETURN(j.comm_fraction, f.number("comm_fraction", 0.3, 0, 1));
  if (j.kind != JobKind::kSync && j.min_ranks == 0) j.min_ranks = j.ranks;
  Status st = validate(j);
  if (!st.ok()) return st.with_context(where);
  return j;
}

Result<JobSpec> load_job_spec(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse_job_spec(text, path);
}

}  // namespace shoal::cluster
