// A worker's push-pulls in flight (Worker::start_push_pull and
// poll_push_pulls). Private to ps.
#pragma once

#include <chrono>
#include <map>
#include <utility>
#include <vector>

#include "ps/wire.h"
#include "ps/worker_impl.h"

namespace shoal::ps {

// One request of a push-pull (a block of a sliced key, or the whole key).
struct Worker::Impl::PipelineBlock {
  Ticket ticket = 0;
  std::size_t server = 0;
  Request req;
  Tensor dst;  // where its value goes: the block's rows of the output
  std::chrono::steady_clock::time_point resend_at{};
  int wait_ms = 1;  // kWait back-off
  // Answered kWait: the server did not apply it, and a later push of this
  // worker may have moved the server's duplicate mark past its number, so
  // it goes out again as a new push with a new number (after any resent
  // old ones), never with the number the server may already have passed.
  bool renumber = false;
};

struct Worker::Impl::Pipeline {
  using Block = PipelineBlock;
  // One push-pull: its blocks still unanswered and what the answered ones said.
  struct Flight {
    std::size_t left = 0;
    Pulled all;
    Status error;
  };
  std::map<std::pair<std::size_t, std::uint64_t>, Block> sent;  // (server, frame) -> block
  std::vector<Block> waiting;                                   // kWait: resent at resend_at
  std::map<Ticket, Flight> flights;
  std::map<std::size_t, int> recoveries;  // server -> reconnections so far
  std::vector<Done> done;                 // done, not yet returned by poll_push_pulls
  Ticket next = 1;
  Deadline dl = Deadline::after_seconds(300);  // the latest push-pull's
};

}  // namespace shoal::ps
