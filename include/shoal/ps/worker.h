// A worker's connections to the parameter servers: join, init keys, push
// gradients (each with the next sequence number, so a retry is recognized)
// and pull values. A key lives on one server, chosen by a stable hash of
// its name, unless it has at least the job's slice_bound elements: then it
// is cut into blocks of rows spread over every server (worker_keys.cc). A key's slicing
// is known from its init, which every worker sends before it pushes or
// pulls. Not thread-safe: one per thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shoal/core/deadline.h"
#include "shoal/net/shared_memory.h"
#include "shoal/net/socket.h"
#include "shoal/ps/codec.h"
#include "shoal/ps/shard.h"

namespace shoal::ps {

class Worker {
 public:
  // `servers` are "host:port"; every connection proves `token`. With
  // `config`, the servers get the job's options before the worker joins.
  static Result<std::unique_ptr<Worker>> connect(const std::vector<std::string>& servers,
                                                 const std::string& token, int worker, Deadline dl,
                                                 const ShardOptions* config = nullptr);
  ~Worker();  // leaves, when it has not
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  int id() const;
  int num_servers() const;
  // Sends the job's options to every server: a server started without
  // options adopts them; one with other options refuses, naming the field.
  Status configure(const ShardOptions& o, Deadline dl);
  Status init(const std::string& key, const Tensor& value);
  // Pushes, waiting and retrying while a bounded-staleness server says
  // kWait, until `dl`.
  Result<PushResult> push(const std::string& key, std::int64_t step, const Tensor& grad,
                          Deadline dl);
  // The key's value once its version reaches `min_version` (sync: after
  // round min_version - 1 closed).
  Result<std::pair<std::uint64_t, Tensor>> pull(const std::string& key, std::uint64_t min_version,
                                                Deadline dl);
  // Pushes and, in the same round trip, receives the key's value once the
  // update the push belongs to is applied (sync: when its round closes).
  // `lr` > 0 is this step's learning rate. Retries while kWait, until `dl`.
  struct Pulled {
    PushResult result;
    std::uint64_t version;
    Tensor value;
  };
  // The gradient is sent from its own memory and, when `into` is an f32
  // tensor of the key's shape, the value is received straight into it
  // (Pulled::value then shares its storage).
  Result<Pulled> push_pull(const std::string& key, std::int64_t step, const Tensor& grad, double lr,
                           Deadline dl, Tensor* into = nullptr);
  // Pipelined push-pulls (the graph pass's client thread): start_push_pull
  // sends every block of a push-pull and returns at once, so a step's
  // push-pulls are all in flight together; answers are matched to their
  // requests by frame, in whatever order the servers' rounds close. The
  // value is received into `into` when it is an f32 tensor of the key's
  // shape (keep it alive until the push-pull is done), else into a new one.
  using Ticket = std::uint64_t;
  Result<Ticket> start_push_pull(const std::string& key, std::int64_t step, const Tensor& grad,
                                 double lr, Tensor into, Deadline dl);
  // The same for a row-sparse push (embedding tables: `values` holds rows
  // `rows` of the gradient, as push_rows takes them), answered with the
  // key's whole value: the graph pass's push for a table's gradient.
  Result<Ticket> start_push_rows_pull(const std::string& key, std::int64_t step,
                                      const std::vector<std::int64_t>& rows, const Tensor& values,
                                      double lr, Tensor into, Deadline dl);
  struct Done {
    Ticket ticket;
    Result<Pulled> pulled;
  };
  // Waits until a started push-pull is done (every block answered), `wake`
  // (a file descriptor, or -1) is readable, or `dl` passes; returns what is
  // done (maybe nothing). A bounded-staleness kWait is resent after a
  // back-off; a lost server is reconnected through the resolver and its
  // unanswered requests resent with their sequence numbers (applied once).
  std::vector<Done> poll_push_pulls(int wake, Deadline dl);
  std::size_t push_pulls_in_flight() const;

  // How pushes and pulls travel (default f32 both ways). With two-bit
  // pushes the worker keeps each key's residual (error feedback).
  void set_compression(const Compression& c);
  const Compression& compression() const;
  ErrorFeedback* feedback();  // null unless 2bit

  // Row-sparse push (embedding tables): `values` holds rows `rows` of the
  // key's gradient, shape [rows.size(), the key's other dimensions]; the
  // servers take every other row as zero (a row listed twice adds). A
  // sliced key gets a push on every server, with the rows it holds (maybe
  // none: a sync round waits for every worker). f16/bf16 compression
  // applies; two-bit does not (rows go as f32). After init only.
  Result<PushResult> push_rows(const std::string& key, std::int64_t step,
                               const std::vector<std::int64_t>& rows, const Tensor& values,
                               double lr, Deadline dl);
  // Rows `rows` of the key's value, in that order, once its version reaches
  // `min_version`.
  Result<std::pair<std::uint64_t, Tensor>> pull_rows(const std::string& key,
                                                     const std::vector<std::int64_t>& rows,
                                                     std::uint64_t min_version, Deadline dl);

  // Same-host servers (on by default): at connect, each server is asked to
  // map a probe in this process's shared memory and read it back ('M');
  // to a server that can, a push-pull of f32 both ways whose gradient and
  // destination lie in shared regions (net::SharedRegion, e.g. a training
  // arena from comm::Communicator::shared_arena) goes in place ('Y'): the
  // server reads the gradient from this process's memory and writes the
  // value into `into`; only a small frame crosses the socket. Anything
  // else goes over TCP as before.
  void set_in_place(bool on);
  // Whether server i maps this process's memory (the probe succeeded).
  bool in_place(std::size_t server) const;

  // Leaves every server: sync rounds stop waiting for this worker.
  Status leave();

  // Server recovery: when a server's connection is lost, `resolve(i, old)`
  // returns server i's new address once it differs from `old` (a server
  // restarted from its snapshot registers again); the worker reconnects,
  // sends its options and joins again, and resends the request it had not
  // had an answer to, with the same sequence number: the server applies it
  // once, whether or not its snapshot already holds it.
  using Resolver = std::function<Result<std::string>(int server, const std::string& old)>;
  void set_resolver(Resolver r);

  // Liveness: `silent(i)` says why server i is taken for stopped or hung
  // ("" while it answers; the job's heartbeat knows). Push-pulls waiting
  // on such a server fail with that reason instead of waiting out their
  // deadline. Must not block.
  using Silence = std::function<std::string(std::size_t server)>;
  void set_silence(Silence s);

 private:
  // The connections, keys, sequence numbers and pipeline (ps/worker_impl.h).
  class Impl;
  explicit Worker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace shoal::ps
