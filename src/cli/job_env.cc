#include "cli/job_env.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <thread>

#include "shoal/core/file.h"
#include "shoal/net/socket.h"

namespace shoal::cli {

Result<std::map<std::string, std::string>> read_job_env(const std::string& dir,
                                                        const std::string& what) {
  const std::string path = dir + "/job.env";
  auto text = read_file(path);
  if (!text.ok())
    return not_found("{} is not there ({}): is {} {}?", path, text.status().message(), dir, what);
  std::map<std::string, std::string> env;
  std::istringstream in(*text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const auto eq = line.find('=');
    if (eq == std::string::npos)
      return invalid_argument("{} line {}: '{}' is not KEY=VALUE", path, n, line);
    env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  for (const char* k : {"SHOAL_STORE", "SHOAL_JOB_TOKEN"})
    if (!env.count(k)) return invalid_argument("{} has no {}", path, k);
  return env;
}

Result<std::pair<std::unique_ptr<net::TcpStore>, std::string>> reach_job(
    std::map<std::string, std::string>& env, const std::string& key) {
  SHOAL_ASSIGN_OR_RETURN(auto hp, net::split_host_port(env["SHOAL_STORE"], "the job's store"));
  const std::string token = env["SHOAL_JOB_TOKEN"];
  const Deadline dl = Deadline::after_seconds(30);
  for (int wait_ms = 50, tries = 1;; wait_ms = std::min(wait_ms * 2, 1000), ++tries) {
    auto store = net::TcpStore::connect(hp.first, hp.second, dl, token);
    Result<std::string> value =
        store.ok() ? (*store)->peek(key) : Result<std::string>(store.status());
    if (value.ok()) return std::pair{std::move(store).value(), *value};
    if (value.status().code() != StatusCode::kUnavailable || dl.expired())
      return value.status().with_context(
          fmt::format("reaching the job's store at {}:{} ({} tries)", hp.first, hp.second, tries));
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
  }
}

Result<Asked> ask_job(const std::string& dir, const std::string& what, const std::string& limit_key,
                      const std::string& grow_key, int k, const std::string& not_elastic) {
  SHOAL_ASSIGN_OR_RETURN(auto env, read_job_env(dir, what));
  SHOAL_ASSIGN_OR_RETURN(auto reached, reach_job(env, limit_key));
  auto& [store, limit] = reached;
  if (limit.empty())
    return failed_precondition("the job at {} {}", env["SHOAL_STORE"], not_elastic);
  SHOAL_ASSIGN_OR_RETURN(std::int64_t total, store->add(grow_key, k));
  return Asked{env.count("SHOAL_JOB_ID") ? env["SHOAL_JOB_ID"] : env["SHOAL_STORE"], limit, total};
}

}  // namespace shoal::cli
