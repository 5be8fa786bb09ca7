#include "ps/store_peers.h"

#include <cstring>

namespace shoal::ps {
namespace {

class StorePeers final : public train::Peers {
 public:
  StorePeers(net::Store& s, int worker, int workers, bool collective, double timeout_s)
      : s_(s), me_(worker), n_(workers), collective_(collective), timeout_s_(timeout_s) {}

  Status agree(const std::string& what, std::uint64_t value) override {
    const std::string key = "ps/peers/agree/" + what, mine = std::to_string(value);
    SHOAL_ASSIGN_OR_RETURN(std::string lead, lead_value(key, mine));
    if (lead.empty()) return ok_status();
    if (lead != mine)
      return failed_precondition(
          "the workers of this job disagree on {}: {} has {}, worker {} has {}", what, lead_name(),
          lead, me_, mine);
    return ok_status();
  }

  Status agree_options(const Options& options) override {
    const std::string key = "ps/peers/options";
    std::string mine;
    for (const auto& [k, v] : options) mine += k + '\n' + v + '\n';
    SHOAL_ASSIGN_OR_RETURN(std::string lead, lead_value(key, mine));
    if (lead.empty()) return ok_status();
    Options theirs;
    for (std::size_t p = 0; p < lead.size();) {
      const auto a = lead.find('\n', p), b = lead.find('\n', a + 1);
      if (a == std::string::npos || b == std::string::npos) break;
      theirs.emplace_back(lead.substr(p, a - p), lead.substr(a + 1, b - a - 1));
      p = b + 1;
    }
    for (std::size_t i = 0; i < std::max(options.size(), theirs.size()); ++i) {
      if (i >= options.size() || i >= theirs.size() || options[i].first != theirs[i].first)
        return failed_precondition(
            "the workers of this job check different options ({}: '{}', worker {}: '{}'): do "
            "they run the same shoal build?",
            lead_name(), i < theirs.size() ? theirs[i].first : "", me_,
            i < options.size() ? options[i].first : "");
      if (options[i].second != theirs[i].second)
        return failed_precondition(
            "the workers of this job disagree on {}: {} has {}, worker {} has {} (every worker "
            "must be started with the same options: they change the math)",
            options[i].first, lead_name(), theirs[i].second, me_, options[i].second);
    }
    return ok_status();
  }

  Status broadcast(Tensor& t) override {
    const std::string key = fmt::format("ps/peers/bcast/{}", bcasts_++);
    SHOAL_ASSIGN_OR_RETURN(
        std::string v,
        lead_value(key, std::string(static_cast<const char*>(t.raw_data()), t.nbytes())));
    if (v.empty()) return ok_status();
    if (v.size() != t.nbytes())
      return failed_precondition("broadcast {} from {}: {} bytes, this worker holds {}",
                                 bcasts_ - 1, lead_name(), v.size(), t.nbytes());
    std::memcpy(t.raw_data(), v.data(), v.size());
    return ok_status();
  }

  Status sum(std::vector<double>& v) override {
    if (!collective_) return ok_status();
    const std::string base = fmt::format("ps/peers/sum/{}/", sums_++);
    SHOAL_RETURN_IF_ERROR(
        s_.set(base + std::to_string(me_),
               std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(double))));
    std::vector<double> total(v.size(), 0.0);
    for (int w = 0; w < n_; ++w) {
      SHOAL_ASSIGN_OR_RETURN(std::string x, s_.get(base + std::to_string(w), dl()));
      if (x.size() != v.size() * sizeof(double))
        return failed_precondition("sum over workers: worker {} sent {} values, this one {}", w,
                                   x.size() / sizeof(double), v.size());
      for (std::size_t i = 0; i < v.size(); ++i) {
        double d;
        std::memcpy(&d, x.data() + i * sizeof(double), sizeof d);
        total[i] += d;
      }
    }
    v = std::move(total);
    return ok_status();
  }

  bool collective() const override { return collective_; }

  Status average(Tensor& t) override {
    if (!collective_) return ok_status();
    std::vector<double> v(static_cast<std::size_t>(t.numel()));
    float* p = t.data<float>();
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = p[i];
    SHOAL_RETURN_IF_ERROR(sum(v));
    for (std::size_t i = 0; i < v.size(); ++i) p[i] = static_cast<float>(v[i] / n_);
    return ok_status();
  }

 private:
  const char* lead_name() const { return collective_ ? "worker 0" : "the first worker"; }
  Deadline dl() const { return Deadline::after_seconds(timeout_s_); }

  // The leading value of `key`, "" when this worker leads (it wrote
  // `mine`). Sync jobs: worker 0 leads (after a resume its state is the
  // job's) and the others wait for it. Async jobs: the first worker to
  // write leads, so a worker that died or froze before writing (worker 0
  // too) holds no one up.
  Result<std::string> lead_value(const std::string& key, const std::string& mine) {
    if (collective_) {
      if (me_ == 0) {
        SHOAL_RETURN_IF_ERROR(s_.set(key, mine));
        return std::string();
      }
      return s_.get(key, dl());
    }
    SHOAL_ASSIGN_OR_RETURN(std::string now, s_.compare_set(key, "", mine));
    return now == mine ? std::string() : now;
  }
  net::Store& s_;
  int me_, n_;
  bool collective_;
  double timeout_s_;
  int bcasts_ = 0, sums_ = 0;
};

}  // namespace

std::shared_ptr<train::Peers> make_store_peers(net::Store& store, int worker, int workers,
                                               bool collective, double timeout_s) {
  return std::make_shared<StorePeers>(store, worker, workers, collective, timeout_s);
}

}  // namespace shoal::ps
