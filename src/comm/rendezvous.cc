#include "comm/rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>
#include <vector>

#include "shoal/core/env.h"
#include "shoal/core/hash.h"
#include "shoal/core/logging.h"
#include "shoal/net/auth.h"
#include "shoal/net/c10d_store.h"
#include "shoal/net/interfaces.h"
#include "shoal/net/retry.h"

namespace shoal::comm {
namespace {

// Which job (and attempt) a file store's keys belong to: the launcher's job
// id and restart count, else Slurm's job and step, else a digest of the
// job token; "" when none is known.
std::string file_store_job() {
  const std::string restart = env::get("SHOAL_RESTART_COUNT").value_or("0");
  if (auto id = env::get("SHOAL_JOB_ID")) return *id + "." + restart;
  if (auto id = env::get("SLURM_JOB_ID"))
    return *id + "." + env::get("SLURM_STEP_ID").value_or("batch") + "." + restart;
  if (auto t = env::get("SHOAL_JOB_TOKEN"); t && !t->empty()) {
    std::string mac = net::token_mac(*t, "shoal-file-store");
    std::string hex;
    for (int i = 0; i < 8; ++i) hex += fmt::format("{:02x}", static_cast<unsigned char>(mac[i]));
    return "token-" + hex + "." + restart;
  }
  return "";
}

// A port for a store derived from a launcher's job id: the same on every
// rank, below the ephemeral range (32768 and up on Linux) so that no
// outgoing connection holds it, and spread so that two jobs on one host
// rarely meet; when they do, rank 0's bind fails and says so.
int derived_port(const std::string& id) {
  return 20000 + static_cast<int>(fnv1a(id) % 12000);  // the same in every build
}

// MPICH's Hydra exports no job id; the ranks of one host are the
// descendants of one hydra_pmi_proxy: its pid and start time (field 22 of
// /proc/PID/stat) name the job. "" when no such ancestor is found.
std::string hydra_proxy() {
  pid_t pid = getppid();
  for (int depth = 0; depth < 8 && pid > 1; ++depth) {
    std::ifstream in(fmt::format("/proc/{}/stat", pid));
    std::string stat((std::istreambuf_iterator<char>(in)), {});
    const std::size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) return "";
    std::istringstream rest(stat.substr(close + 2));
    std::vector<std::string> f{std::istream_iterator<std::string>(rest), {}};
    if (f.size() < 20) return "";
    if (stat.substr(open + 1, close - open - 1) == "hydra_pmi_proxy")
      return fmt::format("{}.{}", pid, f[19]);          // fields from 3 on: f[19] is field 22
    pid = static_cast<pid_t>(std::atol(f[1].c_str()));  // field 4: the parent
  }
  return "";
}

// The first host of a Slurm node list ("n[3-4,7],m1" -> "n3").
std::string first_node(const std::string& list) {
  const std::size_t cut = list.find_first_of(",[");
  if (cut == std::string::npos || list[cut] == ',') return list.substr(0, cut);
  const std::size_t end = list.find_first_of(",-]", cut + 1);
  return list.substr(0, cut) + list.substr(cut + 1, end - cut - 1);
}

// Retries a refused connection for SHOAL_STORE_WAIT seconds: ranks may
// start before the one that serves the store does.
template <typename Connect>
auto connect_with_retries(const std::string& where, Connect connect) -> decltype(connect()) {
  SHOAL_ASSIGN_OR_RETURN(double wait, env::get_double("SHOAL_STORE_WAIT", 60.0));
  return net::connect_with_retries(where, wait, "SHOAL_STORE_WAIT", connect);
}

// torchrun's default (static) rendezvous: its agent serves a c10d store on
// MASTER_PORT for the workers. Keys of each attempt (torchrun restarts the
// workers with the agent's store kept) get their own prefix.
Result<Rendezvous> agent_store(const LaunchEnv& e, CommOptions& o) {
  SHOAL_ASSIGN_OR_RETURN(auto hp, net::split_host_port(e.store, "MASTER_ADDR:MASTER_PORT"));
  Rendezvous rv;
  SHOAL_ASSIGN_OR_RETURN(rv.store, connect_with_retries(e.store, [&] {
                           return net::C10dStore::connect(
                               hp.first, hp.second, Deadline::after_seconds(o.timeout_seconds));
                         }));
  rv.where = fmt::format("{} (torchrun's agent)", e.store);
  rv.host = hp.first;
  rv.connect_again = [hp]() -> Result<std::unique_ptr<net::Store>> {
    SHOAL_ASSIGN_OR_RETURN(
        auto s, net::C10dStore::connect(hp.first, hp.second, Deadline::after_seconds(30)));
    return std::unique_ptr<net::Store>(std::move(s));
  };
  o.prefix = fmt::format("shoal/{}/{}", env::get("TORCHELASTIC_RUN_ID").value_or("none"),
                         env::get("TORCHELASTIC_RESTART_COUNT").value_or("0"));
  if (e.rank == 0)
    SHOAL_LOG_INFO("rendezvous through torchrun's store at {} (keys under {})", e.store, o.prefix);
  return rv;
}

}  // namespace

std::string derived_store(const LaunchEnv& e, std::string* why) {
  auto same = [](const char* a, const char* b) {
    auto x = env::get(a), y = env::get(b);
    return x && y && *x == *y;
  };
  if (e.source == "Slurm") {
    auto job = env::get("SLURM_JOB_ID"), step = env::get("SLURM_STEP_ID");
    if (!job || !step) {
      *why = "Slurm set no SLURM_JOB_ID/SLURM_STEP_ID";
      return "";
    }
    const std::string nodes = env::get("SLURM_STEP_NODELIST").value_or("");
    const bool one = env::get("SLURM_STEP_NUM_NODES").value_or("") == "1";
    const std::string host = one ? "127.0.0.1" : first_node(nodes);
    if (host.empty()) {
      *why = "Slurm set no SLURM_STEP_NODELIST";
      return "";
    }
    return fmt::format("{}:{}", host, derived_port("slurm/" + *job + "." + *step));
  }
  if (e.source == "OpenMPI") {
    auto job = env::get("OMPI_MCA_ess_base_jobid");
    if (job && same("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"))
      return fmt::format("127.0.0.1:{}", derived_port("ompi/" + *job));
    *why = "OpenMPI's ranks span several hosts and it does not say where rank 0 runs";
    return "";
  }
  if (e.source == "PMI") {  // MPICH's Hydra
    const std::string proxy = hydra_proxy();
    if (!proxy.empty() && same("MPI_LOCALNRANKS", "PMI_SIZE"))
      return fmt::format("127.0.0.1:{}", derived_port("hydra/" + proxy));
    *why = proxy.empty() ? "no MPICH hydra_pmi_proxy above this process names the job"
                         : "MPICH's ranks span several hosts and it does not say where rank 0 runs";
    return "";
  }
  *why = fmt::format("{} says nothing about where rank 0 runs", e.source);
  return "";
}

Result<Rendezvous> open_rendezvous(const LaunchEnv& e, CommOptions& o) {
  Rendezvous rv;
  if (auto dir = env::get("SHOAL_STORE_DIR")) {
    const std::string job = file_store_job();
    if (job.empty() && e.rank == 0)
      SHOAL_LOG_WARN(
          "SHOAL_STORE_DIR={} without a job id (SHOAL_JOB_ID, SLURM_JOB_ID or "
          "SHOAL_JOB_TOKEN): the keys go in that directory itself, where a later job would "
          "read them; use a fresh directory per job or set SHOAL_JOB_ID",
          *dir);
    rv.store = std::make_unique<net::FileStore>(*dir, job);
    rv.where = fmt::format("SHOAL_STORE_DIR={}", *dir);
    rv.connect_again = [d = *dir, job]() -> Result<std::unique_ptr<net::Store>> {
      return std::unique_ptr<net::Store>(std::make_unique<net::FileStore>(d, job));
    };
    return rv;
  }
  const bool named = env::get("SHOAL_STORE").has_value();
  SHOAL_ASSIGN_OR_RETURN(bool agent, env::get_bool("TORCHELASTIC_USE_AGENT_STORE", false));
  if (agent && !named && env::get("MASTER_ADDR")) return agent_store(e, o);
  std::string where = e.store;
  SHOAL_ASSIGN_OR_RETURN(bool serve, env::get_bool("SHOAL_STORE_SERVE", false));
  if (!named && env::get("MASTER_ADDR")) serve = true;  // torchrun --standalone, MASTER_ADDR style
  const bool where_derived = where.empty();
  if (where_derived) {
    std::string why;
    where = derived_store(e, &why);
    if (where.empty())
      return failed_precondition(
          "{} ranks but no store, and none can be derived ({}): set SHOAL_STORE=host:port (or "
          "MASTER_ADDR/MASTER_PORT, or SHOAL_STORE_DIR on a shared file system); `shoal run` "
          "sets them",
          e.world, why);
    serve = true;
    if (e.rank == 0)
      SHOAL_LOG_INFO(
          "no store was named: rank 0 serves one at {}, its port derived from the job id of the "
          "launcher ({})",
          where, e.source);
  }
  SHOAL_ASSIGN_OR_RETURN(auto hp, net::split_host_port(where, "SHOAL_STORE"));
  if (serve && e.rank == 0) {
    const std::string bind = net::listen_address_for(hp.first);
    auto s = net::TcpStoreServer::start(bind, hp.second, o.token);
    if (!s.ok())
      return s.status().with_context(
          fmt::format("rank 0 serving the store at {}{}", where,
                      s.status().code() == StatusCode::kAlreadyExists ? " (port in use)" : ""));
    rv.server = std::move(s).value();
    if (!where_derived)
      SHOAL_LOG_INFO("rank 0 serves the store at {} (bound to {})", where,
                     bind.empty() ? std::string("loopback") : bind);
  }
  SHOAL_ASSIGN_OR_RETURN(rv.store, connect_with_retries(where, [&] {
                           return net::TcpStore::connect(hp.first, hp.second,
                                                         Deadline::after_seconds(o.timeout_seconds),
                                                         o.token);
                         }));
  rv.where = serve ? fmt::format("{} (served by rank 0)", where) : where;
  rv.host = hp.first;
  rv.connect_again = [hp, token = o.token]() -> Result<std::unique_ptr<net::Store>> {
    SHOAL_ASSIGN_OR_RETURN(
        auto s, net::TcpStore::connect(hp.first, hp.second, Deadline::after_seconds(30), token));
    return std::unique_ptr<net::Store>(std::move(s));
  };
  return rv;
}

}  // namespace shoal::comm
