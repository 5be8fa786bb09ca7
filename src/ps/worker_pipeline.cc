// Pipelined push-pulls: every block of every push-pull a step has ready
// goes out at once, and answers are matched to their requests by frame
// number, so a server's rounds may close (and answer) in any order. This is
// what keeps the wire busy while the backward pass runs, and what lets the
// client send in priority order without the deadlock a blocking client
// would have (two workers each waiting on a round the other has not
// pushed to yet).
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "ps/pipeline.h"
#include "shoal/core/logging.h"

namespace shoal::ps {
namespace {

using Clock = std::chrono::steady_clock;

Tensor row_block(const Tensor& t, std::int64_t b, std::int64_t e) {
  return t.slice(0, b, e).value();
}

}  // namespace

std::size_t Worker::Impl::push_pulls_in_flight() const {
  return pipeline_ ? pipeline_->flights.size() : 0;
}

Result<Worker::Ticket> Worker::Impl::start_push_pull(const std::string& key, std::int64_t step,
                                                     const Tensor& grad, double lr, Tensor into,
                                                     Deadline dl) {
  Request r;
  r.op = Op::kPushPull;
  r.worker = worker_;
  r.key = key;
  r.step = step;
  r.lr = lr;
  SHOAL_RETURN_IF_ERROR(code_push(r, grad));
  const Tensor whole = r.value.contiguous();
  const auto ps = parts(key);
  auto shape = shapes_.find(key);
  const Shape want = shape == shapes_.end() ? whole.shape() : shape->second;
  return launch(r, ps, want, into, dl, [&](Request& q, const Part& p) {
    q.value = ps.size() == 1 ? whole : row_block(whole, p.begin, p.end);
  });
}

Worker::Ticket Worker::Impl::launch(const Request& r, const std::vector<Part>& ps,
                                    const Shape& want, Tensor into, Deadline dl,
                                    const std::function<void(Request&, const Part&)>& fill) {
  if (!pipeline_) pipeline_ = std::make_unique<Pipeline>();
  Pipeline& pl = *pipeline_;
  pl.dl = dl;
  if (!into.defined() || into.dtype() != DType::kF32 || into.shape() != want ||
      !into.is_contiguous())
    into = Tensor::empty(want, DType::kF32);
  const Ticket t = pl.next++;
  Pipeline::Flight& f = pl.flights[t];
  f.left = ps.size();
  f.all = {PushResult::kApplied, UINT64_MAX, into};
  for (const Part& p : ps) {
    PipelineBlock b;
    b.ticket = t;
    b.server = p.server;
    b.req = r;
    b.req.seq = ++seq_;
    b.req.key = p.name;
    fill(b.req, p);
    b.dst = ps.size() == 1 ? into : row_block(into, p.begin, p.end);
    maybe_in_place(b);
    send_block(std::move(b));
  }
  return t;
}

// A pushpull of f32 both ways to a server that maps this process's memory,
// whose gradient and destination lie in shared regions, goes in place.
void Worker::Impl::maybe_in_place(PipelineBlock& b) const {
  if (b.req.op != Op::kPushPull || !use_in_place_ || !in_place(b.server) ||
      b.req.codec != Codec::kF32 || b.req.reply != Codec::kF32)
    return;
  const Tensor& g = b.req.value;
  if (!g.is_contiguous() || !b.dst.is_contiguous() || g.dtype() != DType::kF32 ||
      g.shape() != b.dst.shape())
    return;
  auto gr = net::find_shared(g.raw_data(), g.nbytes());
  auto dr = net::find_shared(b.dst.raw_data(), b.dst.nbytes());
  if (!gr || !dr) return;
  b.req.op = Op::kShmPushPull;
  b.req.mem = {static_cast<std::int32_t>(::getpid()), g.shape(), *gr, *dr};
  // b.req.value stays: it keeps the gradient's memory alive until answered.
}

// Sends `b` and files it under its frame; a lost server is recovered (and
// `b` sent with its other requests), any other failure fails the push-pull.
void Worker::Impl::send_block(PipelineBlock&& b) {
  Pipeline& pl = *pipeline_;
  if (std::exchange(b.renumber, false)) b.req.seq = ++seq_;
  auto frame = send_request(b.server, b.req, pl.dl);
  if (frame.ok()) {
    pl.sent.emplace(std::pair{b.server, *frame}, std::move(b));
    return;
  }
  const std::size_t i = b.server;
  if (frame.status().code() == StatusCode::kUnavailable && resolve_) {
    pl.waiting.push_back(std::move(b));  // resent by recover(), with the rest
    recover(i, frame.status());
    return;
  }
  answer(b, frame.status());
}

// Marks block `b` answered: with its value, or failed with `st`.
void Worker::Impl::answer(const PipelineBlock& b, Result<Pulled> got) {
  Pipeline& pl = *pipeline_;
  auto it = pl.flights.find(b.ticket);
  if (it == pl.flights.end()) return;
  Pipeline::Flight& f = it->second;
  if (!got.ok()) {
    if (f.error.ok()) f.error = got.status();
  } else if (got->value.shape() != b.dst.shape()) {
    if (f.error.ok())
      f.error =
          failed_precondition("key '{}': parameter server {} sent {}, expected {}", b.req.key,
                              b.server, shape_str(got->value.shape()), shape_str(b.dst.shape()));
  } else {
    Tensor dst = b.dst;  // a view: the output's rows
    if (got->value.raw_data() != dst.raw_data()) (void)dst.copy_from(got->value);
    f.all.result = got->result;
    f.all.version = std::min(f.all.version, got->version);
  }
  if (--f.left > 0) return;
  if (f.error.ok())
    pl.done.push_back({b.ticket, std::move(f.all)});
  else
    pl.done.push_back({b.ticket, f.error});
  pl.flights.erase(it);
}

// Takes the blocks sent to server i and not yet answered out of the pipeline.
std::vector<Worker::Impl::PipelineBlock> Worker::Impl::take_sent(std::size_t i) {
  Pipeline& pl = *pipeline_;
  std::vector<PipelineBlock> taken;
  for (auto it = pl.sent.begin(); it != pl.sent.end();) {
    if (it->first.first == i) {
      taken.push_back(std::move(it->second));
      it = pl.sent.erase(it);
    } else {
      ++it;
    }
  }
  return taken;
}

// Server i was lost: reconnect (the resolver finds its restarted address)
// and resend every request it had not answered, with the same sequence
// numbers; when that cannot be done, those push-pulls fail.
void Worker::Impl::recover(std::size_t i, const Status& why) {
  Pipeline& pl = *pipeline_;
  std::vector<PipelineBlock> again = take_sent(i);
  for (auto it = pl.waiting.begin(); it != pl.waiting.end();) {
    if (it->server == i) {
      again.push_back(std::move(*it));
      it = pl.waiting.erase(it);
    } else {
      ++it;
    }
  }
  // Old numbers first, in order, so the server's duplicate mark passes
  // each only after it; blocks to renumber after them.
  std::sort(again.begin(), again.end(), [](const auto& a, const auto& b) {
    return std::pair{a.renumber, a.req.seq} < std::pair{b.renumber, b.req.seq};
  });
  Status st = why;
  if (resolve_ && !pl.dl.expired() && pl.recoveries[i]++ < 5) {
    SHOAL_LOG_WARN("worker {}: lost parameter server {} at {} ({}); waiting for it to restart",
                   worker_, i, addrs_[i], why.message());
    st = reconnect(i, pl.dl).with_context(fmt::format("reconnecting to parameter server {}", i));
  }
  for (auto& b : again) {
    if (!st.ok()) {
      answer(b, st);
      continue;
    }
    if (std::exchange(b.renumber, false)) b.req.seq = ++seq_;
    auto frame = send_request(i, b.req, pl.dl);
    if (!frame.ok()) {
      answer(b, frame.status());
      continue;
    }
    pl.sent.emplace(std::pair{i, *frame}, std::move(b));
  }
}

// Server i is taken for stopped or hung (its heartbeat went unanswered):
// what waits on it fails, naming it.
void Worker::Impl::fail_if_silent(std::size_t i) {
  if (!silent_) return;
  const std::string why = silent_(i);
  if (why.empty()) return;
  std::vector<PipelineBlock> lost = take_sent(i);
  if (silenced_.size() < servers_.size()) silenced_.resize(servers_.size());
  silenced_[i] = true;
  for (auto& b : lost) answer(b, deadline_exceeded("{}", why));
}

// Reads one answer from server i and files it.
void Worker::Impl::read_answer(std::size_t i) {
  Pipeline& pl = *pipeline_;
  net::Socket& s = servers_[i];
  auto rh = s.recv_header(std::uint64_t{1} << 34, pl.dl);
  if (!rh.ok()) return recover(i, rh.status().with_context(s.peer()));
  auto it = pl.sent.find({i, rh->seq});
  if (it == pl.sent.end()) {
    // Not an answer to anything asked: the stream cannot be trusted.
    return recover(
        i, invalid_argument("{}: an answer (frame {}) to no request in flight", s.peer(), rh->seq));
  }
  PipelineBlock b = std::move(it->second);
  pl.sent.erase(it);
  auto got = recv_answer(i, *rh, pl.dl, &b.dst, b.req.op == Op::kShmPushPull);
  if (!got.ok() && got.status().code() == StatusCode::kUnavailable) {
    pl.waiting.push_back(std::move(b));
    return recover(i, got.status());
  }
  if (got.ok() && got->result == PushResult::kWait) {
    // Bounded staleness: too far ahead of the slowest worker; again soon.
    b.resend_at = Clock::now() + std::chrono::milliseconds(b.wait_ms);
    b.wait_ms = std::min(b.wait_ms * 2, 100);
    b.renumber = true;
    pl.waiting.push_back(std::move(b));
    return;
  }
  answer(b, std::move(got));
}

std::vector<Worker::Done> Worker::Impl::poll_push_pulls(int wake, Deadline dl) {
  if (!pipeline_) pipeline_ = std::make_unique<Pipeline>();
  Pipeline& pl = *pipeline_;
  while (pl.done.empty()) {
    // kWait blocks whose back-off is over go out again.
    const auto now = Clock::now();
    auto next_resend = Clock::time_point::max();
    std::vector<PipelineBlock> due;
    for (auto it = pl.waiting.begin(); it != pl.waiting.end();) {
      if (it->resend_at <= now) {
        due.push_back(std::move(*it));
        it = pl.waiting.erase(it);
      } else {
        next_resend = std::min(next_resend, it->resend_at);
        ++it;
      }
    }
    for (auto& b : due) send_block(std::move(b));
    if (!pl.done.empty()) break;
    std::vector<pollfd> fds;
    std::vector<std::size_t> who;
    for (std::size_t i = 0; i < servers_.size(); ++i) {
      const bool asked = std::any_of(pl.sent.begin(), pl.sent.end(),
                                     [&](const auto& kv) { return kv.first.first == i; });
      if (!asked) continue;
      fds.push_back({servers_[i].fd(), POLLIN, 0});
      who.push_back(i);
    }
    if (wake >= 0) fds.push_back({wake, POLLIN, 0});
    auto until = std::min(next_resend, Clock::now() + dl.remaining());
    if (pl.sent.empty() && pl.waiting.empty() && wake < 0) break;  // nothing to wait for
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    const int rc = ::poll(fds.data(), fds.size(),
                          static_cast<int>(std::clamp<long long>(ms.count() + 1, 0, 1000)));
    if (rc > 0) {
      for (std::size_t k = 0; k < who.size(); ++k)
        if (fds[k].revents) read_answer(who[k]);
      if (wake >= 0 && fds.back().revents) break;
    }
    for (std::size_t i : who) fail_if_silent(i);
    if (dl.expired()) break;
  }
  return std::exchange(pl.done, {});
}

}  // namespace shoal::ps
