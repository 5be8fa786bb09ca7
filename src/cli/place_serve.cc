// `shoal place --serve HOST:PORT --cluster MODEL`: Shoal's placer as
// kube-scheduler's extender (cluster/extender.h) over HTTP (net/http_server.h).
#include <chrono>
#include <thread>

#include "cli/commands.h"
#include "shoal/cluster/extender.h"
#include "shoal/core/logging.h"
#include "shoal/core/stop.h"
#include "shoal/net/http_server.h"

namespace shoal::cli {

namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

net::HttpResponse route(cluster::SchedulerExtender& ext, const std::string& prefix,
                        const net::HttpRequest& r) {
  if (r.path == "/healthz") return {200, "text/plain", "ok\n"};
  const bool is_filter = r.path == prefix + "/filter";
  const bool is_prioritize = r.path == prefix + "/prioritize";
  if (!is_filter && !is_prioritize)
    return {404, "text/plain",
            fmt::format("no verb at {}: this extender serves POST {}/filter and {}/prioritize\n",
                        r.path, prefix, prefix)};
  if (r.method != "POST")
    return {405, "text/plain", fmt::format("{} wants POST, not {}\n", r.path, r.method)};
  Result<std::string> out =
      is_filter ? ext.filter(r.body, seconds_now()) : ext.prioritize(r.body, seconds_now());
  if (!out.ok()) {
    SHOAL_LOG_WARN("shoal place --serve: {} refused: {}", r.path, out.status().message());
    return {400, "text/plain", out.status().message() + "\n"};
  }
  SHOAL_LOG_DEBUG("shoal place --serve: {} -> {}", r.path, *out);
  return {200, "application/json", std::move(*out)};
}

}  // namespace

int run_place_serve(const ClusterFlags& f) {
  if (f.cluster.empty()) {
    SHOAL_LOG_ERROR(
        "shoal place --serve: give --cluster MODEL.yaml, the nodes as Kubernetes names them "
        "with their switches and chip links");
    return 2;
  }
  auto t = cluster::load_topology(f.cluster);
  auto where = net::split_host_port(f.serve, "--serve");
  if (!t.ok() || !where.ok()) {
    SHOAL_LOG_ERROR("shoal place: {}", (!t.ok() ? t.status() : where.status()).to_string());
    return 2;
  }
  std::string prefix = f.url_prefix;
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (!prefix.empty() && prefix.front() != '/') prefix = "/" + prefix;
  catch_stop_signals();  // before the server's thread starts: it inherits the mask
  cluster::SchedulerExtender ext(std::move(*t), {f.hold_seconds});
  auto server = net::HttpServer::start(where->first, where->second, [&](const net::HttpRequest& r) {
    return route(ext, prefix, r);
  });
  if (!server.ok()) {
    SHOAL_LOG_ERROR("shoal place --serve: {}", server.status().to_string());
    return 2;
  }
  fmt::print(
      "shoal place: kube-scheduler extender on http://{}:{}{} (filterVerb: filter, "
      "prioritizeVerb: prioritize, weight 1..; nodeCacheCapable true or false); Ctrl-C stops\n",
      where->first, (*server)->port(), prefix);
  std::fflush(stdout);
  while (stop_signal() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  fmt::print("shoal place: stopped after {} requests\n", (*server)->answered());
  return 0;
}

}  // namespace shoal::cli
