// Worker's implementation (ps/worker.h): its connections, keys, sequence
// numbers and the push-pull pipeline. Private to ps; the methods are
// defined in worker.cc, worker_keys.cc, worker_rows.cc and
// worker_pipeline.cc.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shoal/ps/worker.h"

namespace shoal::ps {

struct Request;  // ps/wire.h

class Worker::Impl {
 public:
  Impl() = default;
  ~Impl();  // leaves, when it has not
  // Worker's API (documented in ps/worker.h).
  int id() const { return worker_; }
  int num_servers() const { return static_cast<int>(servers_.size()); }
  Status configure(const ShardOptions& o, Deadline dl);
  Status init(const std::string& key, const Tensor& value);
  Result<PushResult> push(const std::string& key, std::int64_t step, const Tensor& grad,
                          Deadline dl);
  Result<std::pair<std::uint64_t, Tensor>> pull(const std::string& key, std::uint64_t min_version,
                                                Deadline dl);
  Result<Pulled> push_pull(const std::string& key, std::int64_t step, const Tensor& grad, double lr,
                           Deadline dl, Tensor* into = nullptr);
  Result<Ticket> start_push_pull(const std::string& key, std::int64_t step, const Tensor& grad,
                                 double lr, Tensor into, Deadline dl);
  Result<Ticket> start_push_rows_pull(const std::string& key, std::int64_t step,
                                      const std::vector<std::int64_t>& rows, const Tensor& values,
                                      double lr, Tensor into, Deadline dl);
  std::vector<Done> poll_push_pulls(int wake, Deadline dl);
  std::size_t push_pulls_in_flight() const;
  void set_compression(const Compression& c);
  const Compression& compression() const { return compression_; }
  ErrorFeedback* feedback() { return feedback_.get(); }  // null unless 2bit
  Result<PushResult> push_rows(const std::string& key, std::int64_t step,
                               const std::vector<std::int64_t>& rows, const Tensor& values,
                               double lr, Deadline dl);
  Result<std::pair<std::uint64_t, Tensor>> pull_rows(const std::string& key,
                                                     const std::vector<std::int64_t>& rows,
                                                     std::uint64_t min_version, Deadline dl);
  void set_in_place(bool on) { use_in_place_ = on; }
  bool in_place(std::size_t server) const { return server < in_place_.size() && in_place_[server]; }
  Status leave();
  void set_resolver(Resolver r) { resolve_ = std::move(r); }
  void set_silence(Silence s) { silent_ = std::move(s); }

  // The rest is private to the implementation.
  std::size_t server_of(const std::string& key) const;
  // Where a key's rows (first dimension) live: one part, or one block of
  // rows per server.
  struct Part {
    std::size_t server;
    std::int64_t begin, end;  // rows
    std::string name;         // the block's key on its server
  };
  std::vector<Part> parts(const std::string& key) const;
  Result<std::string> call(net::Socket& s, const std::string& payload, Deadline dl);
  // call() on server i, reconnecting and resending when it is lost.
  Result<std::string> call_server(std::size_t i, const std::string& payload, Deadline dl);
  Status reconnect(std::size_t i, Deadline dl);
  // Sends `r` to server i without copying its tensor; the frame number
  // its answer will carry.
  Result<std::uint64_t> send_request(std::size_t i, const Request& r, Deadline dl);
  // The rest of a push-pull answer whose header `rh` was read from server
  // i: a refusal, kWait, or the value (into `into` when it fits).
  // `in_place`: the request was a shmpushpull, whose value the server
  // wrote into `into` itself.
  Result<Pulled> recv_answer(std::size_t i, const net::FrameHeader& rh, Deadline dl, Tensor* into,
                             bool in_place = false);
  // Asks server i to map this process's probe region; in_place_[i] says
  // whether it could (a failure only means TCP).
  void probe_in_place(std::size_t i, Deadline dl);
  // Sends push (or pushrows) `r` to server i, again while it says kWait
  // (bounded staleness), until `dl`; its answer.
  Result<PushResult> push_until_taken(std::size_t i, const Request& r, Deadline dl);
  // The pipeline's steps (worker_pipeline.cc): send a block and file it
  // under its frame; file an answer (or a failure) to a block; reconnect to
  // a lost server and resend what it had not answered; read one answer.
  struct PipelineBlock;
  // Turns a pushpull block into a shmpushpull when its server and memory allow.
  void maybe_in_place(PipelineBlock& b) const;
  // Starts a push-pull of `ps` parts of a key of shape `want`, each
  // request `r` with its part's block name, sequence number and what `fill`
  // puts in.
  Ticket launch(const Request& r, const std::vector<Part>& ps, const Shape& want, Tensor into,
                Deadline dl, const std::function<void(Request&, const Part&)>& fill);
  void send_block(PipelineBlock&& b);
  void answer(const PipelineBlock& b, Result<Pulled> got);
  void recover(std::size_t i, const Status& why);
  void fail_if_silent(std::size_t i);
  std::vector<PipelineBlock> take_sent(std::size_t i);
  void read_answer(std::size_t i);
  // The rest of a pushpull reply after its fixed part: dims, codec, data.
  Result<Tensor> recv_value(net::Socket& s, std::uint64_t length, int rank, Deadline dl,
                            Tensor* into, bool in_place);
  // Fills r's value and codecs from `grad` under the job's compression.
  Status code_push(Request& r, const Tensor& grad);
  std::vector<net::Socket> servers_;
  std::vector<std::string> addrs_;
  std::string token_;
  std::optional<ShardOptions> config_;
  Resolver resolve_;
  Silence silent_;
  std::vector<bool> silenced_;  // servers whose waits failed as silent
  Compression compression_;
  std::unique_ptr<ErrorFeedback> feedback_;
  std::map<std::string, Shape> shapes_;  // from init
  int worker_ = -1;
  std::uint64_t seq_ = 0, frame_ = 0;
  bool left_ = false;
  bool use_in_place_ = true;
  std::vector<bool> in_place_;                // by server: the probe succeeded
  std::shared_ptr<net::SharedRegion> probe_;  // one page; a random word at 0
  struct Pipeline;                            // ps/pipeline.h: push-pulls in flight
  std::unique_ptr<Pipeline> pipeline_;
};

}  // namespace shoal::ps
