// A worker's per-key operations: init, push, pull and push-pull, over one
// server or, for arrays of at least the job's slice bound, over all of
// them. A big array is cut along its first dimension into blocks of rows
// of at most 2^20 elements, as many on every server (block b on
// server b % S, under the key's own name for a server's first block and
// "key#j" for its j-th; rows so that row-sparse pushes find their server),
// so its traffic and its update are spread over every server; a push-pull
// sends every block before it waits for the first answer, so a server
// updates and answers one block while the next is still arriving (one
// server too: a 64 MiB key is 16 blocks in flight, not one round trip).
// Slicing is exact for the optimizers that update element by element; LARS
// and LAMB scale a whole tensor by its norm, so their keys are never sliced.
#include <chrono>
#include <optional>
#include <thread>

#include "ps/pipeline.h"
#include "ps/wire.h"
#include "ps/worker_impl.h"
#include "shoal/core/logging.h"

namespace shoal::ps {

std::vector<Worker::Impl::Part> Worker::Impl::parts(const std::string& key) const {
  auto it = shapes_.find(key);
  const std::int64_t n = it == shapes_.end() ? 0 : num_elements(it->second);
  const auto s = static_cast<std::int64_t>(servers_.size());
  const std::int64_t bound = config_ ? config_->slice_bound : 0;
  const bool by_norm = config_ && train::is_layerwise(config_->optimizer.name);
  const std::int64_t rows = it == shapes_.end() || it->second.empty() ? 1 : it->second[0];
  // Blocks of at most kBlockElements (as rows allow), the same number on
  // every server: block b on server b % s.
  constexpr std::int64_t kBlockElements = std::int64_t{1} << 20;  // 4 MiB of f32
  const std::int64_t per_server = (n + kBlockElements * s - 1) / (kBlockElements * s);
  const std::int64_t blocks = std::min(rows, s * per_server);
  if (bound <= 0 || n < bound || blocks < 2 || by_norm) return {{server_of(key), 0, rows, key}};
  std::vector<Part> out;
  for (std::int64_t b = 0; b < blocks; ++b)
    if (rows * (b + 1) / blocks > rows * b / blocks)
      out.push_back({static_cast<std::size_t>(b % s), rows * b / blocks, rows * (b + 1) / blocks,
                     b < s ? key : fmt::format("{}#{}", key, b / s)});
  return out;
}

namespace {

// Rows [b, e) of a contiguous tensor, as a (contiguous) view.
Tensor row_slice(const Tensor& t, std::int64_t b, std::int64_t e) {
  return t.slice(0, b, e).value();
}

}  // namespace

Status Worker::Impl::init(const std::string& key, const Tensor& value) {
  shapes_[key] = value.shape();
  const Tensor v = value.contiguous();
  const auto ps = parts(key);
  for (const Part& p : ps) {
    Request r;
    r.op = Op::kInit;
    r.key = p.name;
    r.value = ps.size() == 1 ? v : row_slice(v, p.begin, p.end);
    SHOAL_RETURN_IF_ERROR(
        call_server(p.server, encode(r), Deadline::after_seconds(60))
            .status()
            .with_context(fmt::format("init of '{}' on parameter server {}", key, p.server)));
  }
  return ok_status();
}

Result<PushResult> Worker::Impl::push(const std::string& key, std::int64_t step, const Tensor& grad,
                                      Deadline dl) {
  Request r;
  r.op = Op::kPush;
  r.worker = worker_;
  r.key = key;
  r.step = step;
  SHOAL_RETURN_IF_ERROR(code_push(r, grad));
  const Tensor whole = r.value.contiguous();
  const auto ps = parts(key);
  PushResult last = PushResult::kApplied;
  for (const Part& p : ps) {
    r.seq = ++seq_;
    r.key = p.name;
    r.value = ps.size() == 1 ? whole : row_slice(whole, p.begin, p.end);
    SHOAL_ASSIGN_OR_RETURN(last, push_until_taken(p.server, r, dl));
  }
  return last;
}

Result<PushResult> Worker::Impl::push_until_taken(std::size_t i, const Request& r, Deadline dl) {
  Request again = r;
  for (int wait_ms = 1;; wait_ms = std::min(wait_ms * 2, 100)) {
    SHOAL_ASSIGN_OR_RETURN(std::string rep, call_server(i, encode(again), dl));
    if (rep.size() != 1)
      return invalid_argument("ps server: push reply of {} bytes, expected 1", rep.size());
    const auto pr = static_cast<PushResult>(rep[0]);
    if (pr != PushResult::kWait) return pr;
    if (dl.expired())
      return deadline_exceeded(
          "worker {}: key '{}' step {} still too far ahead of the slowest worker at the "
          "deadline",
          worker_, r.key, r.step);
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    // Not applied: a new push with a new number (see PipelineBlock::renumber).
    again.seq = ++seq_;
  }
}

Result<std::pair<std::uint64_t, Tensor>> Worker::Impl::pull(const std::string& key,
                                                            std::uint64_t min_version,
                                                            Deadline dl) {
  Request r;
  r.op = Op::kPull;
  r.key = key;
  r.min_version = min_version;
  r.reply = compression_.pull;
  const auto ps = parts(key);
  if (ps.size() == 1) {
    SHOAL_ASSIGN_OR_RETURN(std::string rep, call_server(ps[0].server, encode(r), dl));
    return decode_pull_reply(rep);
  }
  Tensor out = Tensor::empty(shapes_.at(key), DType::kF32);
  std::uint64_t version = UINT64_MAX;
  for (const Part& p : ps) {
    r.key = p.name;
    SHOAL_ASSIGN_OR_RETURN(std::string rep, call_server(p.server, encode(r), dl));
    SHOAL_ASSIGN_OR_RETURN(auto got, decode_pull_reply(rep));
    Tensor dst = row_slice(out, p.begin, p.end);
    if (got.second.shape() != dst.shape())
      return failed_precondition("key '{}': parameter server {} holds a slice of {}, expected {}",
                                 key, p.server, shape_str(got.second.shape()),
                                 shape_str(dst.shape()));
    SHOAL_RETURN_IF_ERROR(dst.copy_from(got.second));
    version = std::min(version, got.first);
  }
  return std::pair{version, std::move(out)};
}

Result<Worker::Pulled> Worker::Impl::push_pull(const std::string& key, std::int64_t step,
                                               const Tensor& grad, double lr, Deadline dl,
                                               Tensor* into) {
  SHOAL_ASSIGN_OR_RETURN(Ticket t,
                         start_push_pull(key, step, grad, lr, into ? *into : Tensor(), dl));
  while (true) {
    std::optional<Result<Pulled>> mine;
    for (Done& d : poll_push_pulls(-1, dl)) {
      if (d.ticket == t)
        mine = std::move(d.pulled);
      else
        pipeline_->done.push_back(std::move(d));  // another caller's, kept for it
    }
    if (mine) return std::move(*mine);
    if (dl.expired())
      return deadline_exceeded(
          "worker {}: push-pull of key '{}' step {} not answered by the deadline", worker_, key,
          step);
  }
}

}  // namespace shoal::ps
