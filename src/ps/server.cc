#include "shoal/ps/server.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <vector>

#include "ps/peer_regions.h"
#include "ps/snapshot_writer.h"
#include "ps/wire.h"
#include "shoal/core/file.h"
#include "shoal/core/logging.h"
#include "shoal/net/auth.h"
#include "shoal/runtime/kernel.h"

namespace shoal::ps {

using ConnId = net::FrameServer::ConnId;

class Server::Handler final : public net::FrameServer::Handler {
 public:
  // `job`: who this job is, in its snapshots (a MAC of its token: a new
  // job has a new token, a server restarted in the same job the same).
  Handler(const ServerOptions& o, std::string job) : o_(o), job_(std::move(job)) {}
  ~Handler() override { writer_.reset(); }  // before the members its callback reads

  // The serving loop, woken when a snapshot is written (null: gone).
  void attach(net::FrameServer* s) {
    std::lock_guard<std::mutex> lk(wake_mu_);
    server_ = s;
  }

  // A shard with `so`, restored from the snapshot when there is one.
  // A shard that is not restored is never kept: the last snapshot at exit
  // would write it over the file that was refused.
  Status configure(const ShardOptions& so) {
    SHOAL_ASSIGN_OR_RETURN(std::unique_ptr<Shard> shard, Shard::create(so));
    std::error_code ec;
    if (!o_.snapshot.empty())  // what a server killed mid-snapshot left
      (void)remove_dead_temporaries(std::filesystem::path(o_.snapshot).parent_path().string());
    if (!o_.snapshot.empty() && std::filesystem::exists(o_.snapshot, ec)) {
      SHOAL_ASSIGN_OR_RETURN(train::CheckpointState old, train::load_checkpoint(o_.snapshot));
      SHOAL_RETURN_IF_ERROR(same_job(old, o_.snapshot));
      SHOAL_RETURN_IF_ERROR(
          shard->restore(old, o_.snapshot).with_context("restarting the ps server"));
      SHOAL_LOG_INFO("ps server: restored from {} ({} workers)", o_.snapshot,
                     shard->workers().size());
    }
    shard_ = std::move(shard);
    if (!o_.snapshot.empty() && o_.snapshot_every > 0)
      writer_ = std::make_unique<SnapshotWriter>(o_.snapshot, [this] {
        std::lock_guard<std::mutex> lk(wake_mu_);
        if (server_) server_->wake();
      });
    SHOAL_LOG_INFO("ps server: options {}", config_text(so));
    return ok_status();
  }

  std::string on_request(net::FrameServer& s, ConnId c, const net::FrameHeader& h,
                         std::string_view body) override {
    // OpenMP's thread count is per thread: set it on the serving one.
    static thread_local bool threads_set = (runtime::set_num_threads(o_.threads), true);
    (void)threads_set;
    if (static_cast<net::FrameType>(h.type) != net::FrameType::kPsRequest)
      return fmt::format("sent frame type {} to a parameter server", h.type);
    bytes_in_ += body.size();
    auto r = decode_request(body, [this](const Shape& shape) { return take_spare(shape); });
    if (!r.ok()) return refuse(s, c, h.seq, r.status());
    if (r->worker >= 0) seen_[r->worker] = std::chrono::steady_clock::now();
    Status st = serve(s, c, h.seq, *r);
    keep_spare(std::move(r->value));
    if (!st.ok()) return refuse(s, c, h.seq, st);
    return "";
  }

  // Releases the answers a finished snapshot holds; drops members silent
  // past the heartbeat deadline.
  void on_tick(net::FrameServer& s) override {
    snapshot_progress(s);
    if (!shard_ || o_.heartbeat_s <= 0) return;
    const auto now = std::chrono::steady_clock::now();
    const std::set<int> members = shard_->workers();
    bool dropped = false;
    for (int w : members) {
      if (departed_.count(w)) continue;          // left a sync job: not silent
      auto [it, fresh] = seen_.emplace(w, now);  // restored from a snapshot: from now
      const double silent = std::chrono::duration<double>(now - it->second).count();
      if (fresh || silent <= o_.heartbeat_s) continue;
      const std::string why =
          fmt::format("worker {} sent nothing for {:.1f} s (heartbeat deadline {} s)", w, silent,
                      o_.heartbeat_s);
      if (whole_rounds()) {
        lose(s, w, why);
        seen_[w] = now;  // named once
      } else {
        SHOAL_LOG_WARN("ps server: {}: dropped from the quorum", why);
        (void)shard_->remove_worker(w);
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        drops_.emplace_back(w, whole_rounds() ? lost_ : why + ": dropped from the quorum");
      }
      dropped = true;
    }
    if (dropped) {
      answer_pulls(s);
      publish();
    }
  }

  void on_close(net::FrameServer& s, ConnId c) override {
    std::erase_if(pulls_, [&](const Pull& p) { return p.conn == c; });
    regions_.drop(c);  // after its pulls: they point into these mappings
    auto w = worker_of_.find(c);
    if (w == worker_of_.end()) return;
    const int worker = w->second;
    worker_of_.erase(w);
    if (whole_rounds()) {
      lose(s, worker,
           fmt::format("worker {}'s connection closed before it left (did its process die?)",
                       worker));
      return;
    }
    SHOAL_LOG_WARN("ps server: worker {} left: its connection closed", worker);
    note_presence(worker, true);
    if (shard_) (void)shard_->remove_worker(worker);
    answer_pulls(s);
  }

  Server::Presence presence() const {
    std::lock_guard<std::mutex> lk(mu_);
    return presence_;
  }
  // After worker_of_ changed: how many are connected, and whether `worker`
  // is gone (its connection closed before it left) or back.
  void note_presence(int worker, bool gone) {
    std::lock_guard<std::mutex> lk(mu_);
    if (gone)
      gone_.insert(worker);
    else
      gone_.erase(worker);
    presence_ = {static_cast<int>(worker_of_.size()), static_cast<int>(gone_.size())};
  }

  std::string lost() const {
    std::lock_guard<std::mutex> lk(mu_);
    return lost_report_;
  }

  std::vector<std::pair<int, std::string>> take_drops() {
    std::lock_guard<std::mutex> lk(mu_);
    return std::exchange(drops_, {});
  }

  Server::Traffic traffic() const {
    std::lock_guard<std::mutex> lk(mu_);
    return traffic_;
  }

  ShardStats stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }
  Status final_snapshot() {
    writer_.reset();  // a write in progress finishes first
    return o_.snapshot.empty() || !shard_ ? ok_status()
                                          : train::save_checkpoint(o_.snapshot, capture());
  }

 private:
  struct Pull {
    ConnId conn;
    std::uint64_t seq;
    std::string key;
    std::uint64_t min_version;
    bool with_result = false;  // a pushpull: its PushResult goes before the value
    char result = 0;
    Codec codec = Codec::kF32;  // how the value goes back
    bool by_rows = false;       // a pullrows: only `rows`
    std::vector<std::int64_t> rows;
    std::uint8_t* in_place = nullptr;  // a shmpushpull: the value goes here
  };

  // Buffers pushes are decoded into, reused: a fresh 16 MiB tensor per
  // push costs page faults and zeroing (perf: 12% of a 16 MiB push-pull).
  // A few are kept, the most recently used first.
  static constexpr std::size_t kSpares = 4;
  Tensor take_spare(const Shape& shape) {
    for (auto it = spares_.begin(); it != spares_.end(); ++it)
      if (it->shape() == shape) {
        Tensor t = std::move(*it);
        spares_.erase(it);
        return t;
      }
    return Tensor();
  }
  void keep_spare(Tensor t) {
    // Only a buffer nothing else holds (the shard copies what it keeps).
    if (!t.defined() || t.storage().use_count() != 1 || t.dtype() != DType::kF32) return;
    spares_.insert(spares_.begin(), std::move(t));
    if (spares_.size() > kSpares) spares_.pop_back();
  }

  std::string refuse(net::FrameServer& s, ConnId c, std::uint64_t seq, const Status& st) {
    s.reply(c, net::FrameType::kStoreError, seq, st.message());
    return "";  // a refused request is answered; the client stays
  }

  Status serve(net::FrameServer& s, ConnId c, std::uint64_t seq, const Request& r) {
    if (r.op == Op::kConfig) {
      SHOAL_RETURN_IF_ERROR(config(r.config));
      s.reply(c, net::FrameType::kPsReply, seq, "");
      return ok_status();
    }
    if (!shard_)
      return failed_precondition(
          "this server has no options yet: a worker sends them first (config, wire op 'C')");
    if (r.op == Op::kPush || r.op == Op::kPushPull || r.op == Op::kPushRows ||
        r.op == Op::kPushRowsPull || r.op == Op::kShmPushPull) {
      SHOAL_RETURN_IF_ERROR(check_coding(r));
      SHOAL_RETURN_IF_ERROR(check_whole(s, r));
    }
    switch (r.op) {
      case Op::kJoin:
        if (whole_rounds() && !lost_.empty()) return failed_precondition("{}", lost_);
        SHOAL_RETURN_IF_ERROR(shard_->add_worker(r.worker));
        worker_of_[c] = r.worker;
        note_presence(r.worker, false);
        break;
      case Op::kLeave:
        worker_of_.erase(c);
        note_presence(r.worker, false);
        if (whole_rounds()) {
          leave_whole(s, r.worker);
          break;
        }
        SHOAL_RETURN_IF_ERROR(shard_->remove_worker(r.worker));
        answer_pulls(s);
        break;
      case Op::kInit:
        SHOAL_RETURN_IF_ERROR(shard_->init(r.key, r.value));
        break;
      case Op::kPush: {
        SHOAL_ASSIGN_OR_RETURN(PushResult pr,
                               shard_->push(r.worker, r.key, r.step, r.seq, r.value));
        return answer_push(s, c, seq, pr);
      }
      case Op::kPull: {
        SHOAL_RETURN_IF_ERROR(shard_->peek(r.key).status());
        pulls_.push_back({c, seq, r.key, r.min_version, false, 0, r.reply, false, {}});
        answer_pulls(s);
        return ok_status();
      }
      case Op::kPushPull:
      case Op::kPushRowsPull:
      case Op::kShmPushPull:
        return push_pull(s, c, seq, r);
      case Op::kMapCheck: {
        SHOAL_ASSIGN_OR_RETURN(std::uint8_t * probe, regions_.locate(c, r.mem.pid, r.mem.grad, 8));
        s.reply(c, net::FrameType::kPsReply, seq, std::string(reinterpret_cast<char*>(probe), 8));
        return ok_status();
      }
      case Op::kPushRows: {
        SHOAL_ASSIGN_OR_RETURN(PushResult pr, shard_->push_rows(r.worker, r.key, r.step, r.seq,
                                                                r.rows, r.value, r.lr));
        return answer_push(s, c, seq, pr);
      }
      case Op::kPullRows: {
        SHOAL_RETURN_IF_ERROR(shard_->pull_rows(r.key, r.rows).status());
        pulls_.push_back({c, seq, r.key, r.min_version, false, 0, r.reply, true, r.rows});
        answer_pulls(s);
        return ok_status();
      }
      case Op::kHeartbeat:
        break;
      case Op::kConfig:  // answered above, before the shard exists
        break;
    }
    send(s, c, seq, {});
    publish();
    return ok_status();
  }

  // Sync jobs of a known size: rounds close only with every worker.
  bool whole_rounds() const {
    return o_.job_workers > 0 && shard_ && shard_->options().mode == Mode::kSync;
  }

  // A member of a sync job is gone: no round can close with every worker
  // again. Every waiting answer is refused naming it, and so is every
  // later push and join; the loss is published for the job's roles.
  void lose(net::FrameServer& s, int worker, const std::string& why) {
    if (lost_.empty()) {
      lost_ =
          fmt::format("{}: a sync round needs all {} workers of the job, so the job cannot go on",
                      why, o_.job_workers);
      SHOAL_LOG_ERROR("ps server: {}", lost_);
      std::lock_guard<std::mutex> lk(mu_);
      lost_report_ = fmt::format("{} {}", worker, lost_);
    }
    for (const Pull& p : pulls_) s.reply(p.conn, net::FrameType::kStoreError, p.seq, lost_);
    pulls_.clear();
  }

  // A worker of a sync job of a known size leaves: at the end of the job
  // nobody waits for it. A round still open without it, or a push that
  // comes after it, means the workers ran different steps: the job is lost.
  void leave_whole(net::FrameServer& s, int worker) {
    departed_.insert(worker);
    const bool waiting =
        std::any_of(pulls_.begin(), pulls_.end(), [](const Pull& p) { return p.with_result; });
    if (waiting)
      lose(s, worker,
           fmt::format("worker {} left while other workers wait for it in a sync round", worker));
  }

  Status check_whole(net::FrameServer& s, const Request& r) {
    if (!whole_rounds()) return ok_status();
    if (lost_.empty() && !departed_.empty() && !departed_.count(r.worker))
      lose(s, *departed_.begin(),
           fmt::format("worker {} left the job (it had finished its steps) while worker {} still "
                       "pushes (step {}): the workers of a sync job must run the same steps",
                       *departed_.begin(), r.worker, r.step));
    if (!lost_.empty()) return failed_precondition("{}", lost_);
    return ok_status();
  }

  // A push's (or pushrows') answer: its result; then, when an update was
  // applied, the pulls waiting for it and the snapshot.
  Status answer_push(net::FrameServer& s, ConnId c, std::uint64_t seq, PushResult pr) {
    publish();  // stats count the push before its worker hears back
    if (pr == PushResult::kApplied || pr == PushResult::kClosed) maybe_snapshot();
    const std::string result(1, static_cast<char>(pr));
    send(s, c, seq, {result});
    if (pr == PushResult::kApplied || pr == PushResult::kClosed) answer_pulls(s);
    publish_traffic();
    return ok_status();
  }

  // A push coded otherwise than the job's compression would change the
  // math without anyone noticing: refused, naming both.
  Status check_coding(const Request& r) const {
    const Compression& want = shard_->options().compression;
    // Row-sparse pushes are never two-bit (residuals are kept for dense
    // keys): f32 then.
    const bool rows = r.op == Op::kPushRows || r.op == Op::kPushRowsPull;
    if (rows && want.push == Codec::kTwoBit && r.codec == Codec::kF32 &&
        (r.op == Op::kPushRows || r.reply == want.pull))
      return ok_status();
    const Compression got{r.codec,
                          r.op == Op::kPushPull || r.op == Op::kPushRowsPull ? r.reply : want.pull,
                          r.codec == Codec::kTwoBit ? r.threshold : want.threshold};
    if (got.push == want.push && got.pull == want.pull &&
        (want.push != Codec::kTwoBit || got.threshold == want.threshold))
      return ok_status();
    return failed_precondition("worker {} pushed '{}' as {}, the job's compression is {}", r.worker,
                               r.key, compression_text(got), compression_text(want));
  }

  // Push, then answer with the key's value once the update the push
  // belongs to is applied: at once in async mode, when its round closes in
  // sync mode (a retried push of a closed round is answered at once too).
  // A pushrowspull is the same with a row-sparse push.
  // A shmpushpull is a pushpull whose gradient is read from, and whose value
  // is written into, the worker's shared memory (same host).
  Status push_pull(net::FrameServer& s, ConnId c, std::uint64_t seq, const Request& r) {
    std::uint8_t* in_place = nullptr;
    Tensor grad = r.value;
    if (r.op == Op::kShmPushPull) {
      const auto bytes = 4 * static_cast<std::uint64_t>(num_elements(r.mem.shape));
      SHOAL_ASSIGN_OR_RETURN(std::uint8_t * g, regions_.locate(c, r.mem.pid, r.mem.grad, bytes));
      SHOAL_ASSIGN_OR_RETURN(in_place, regions_.locate(c, r.mem.pid, r.mem.dst, bytes));
      grad = Tensor::from_storage(Storage::wrap(g, bytes, nullptr), r.mem.shape, DType::kF32);
      shm_in_ += bytes;
    }
    SHOAL_ASSIGN_OR_RETURN(
        PushResult pr, r.op == Op::kPushRowsPull
                           ? shard_->push_rows(r.worker, r.key, r.step, r.seq, r.rows, grad, r.lr)
                           : shard_->push(r.worker, r.key, r.step, r.seq, grad, r.lr));
    if (pr == PushResult::kWait) {
      s.reply(c, net::FrameType::kPsReply, seq, std::string(1, static_cast<char>(pr)));
      return ok_status();
    }
    const bool sync = shard_->options().mode == Mode::kSync;
    pulls_.push_back({c,
                      seq,
                      r.key,
                      sync ? static_cast<std::uint64_t>(r.step) + 1 : 0,
                      true,
                      static_cast<char>(pr),
                      r.reply,
                      false,
                      {},
                      in_place});
    // The snapshot first: an update a worker has heard of is in it, so a
    // server restarted from it loses nothing a worker will not resend.
    if (pr == PushResult::kApplied || pr == PushResult::kClosed) maybe_snapshot();
    publish();  // stats count the update before any worker hears of it
    answer_pulls(s);
    publish_traffic();
    return ok_status();
  }

  Status config(const std::string& text) {
    SHOAL_ASSIGN_OR_RETURN(ShardOptions want, parse_config(text));
    if (!shard_) return configure(want);
    if (std::string d = config_diff(shard_->options(), want); !d.empty())
      return failed_precondition("a worker's parameter-server options differ: {}", d);
    return ok_status();
  }

  // Answers the pulls whose version is there; an f32 value goes out from
  // the shard's memory (copied only for what the socket does not take now).
  void answer_pulls(net::FrameServer& s) {
    std::erase_if(pulls_, [&](const Pull& p) {
      auto v = shard_->peek(p.key);
      if (!v.ok() || v->first < p.min_version) return false;
      std::string head;
      if (p.with_result) head.push_back(p.result);
      Tensor rows;
      const Tensor* value = v->second;
      std::uint64_t version = v->first;
      if (p.by_rows) {
        auto got = shard_->pull_rows(p.key, p.rows);
        if (!got.ok()) return false;  // checked when the pull came in
        version = got->first;
        rows = std::move(got->second);
        value = &rows;
      }
      if (!value->is_contiguous()) {
        rows = value->contiguous();
        value = &rows;
      }
      // The worker whose connection asked computes from this version now.
      if (auto w = worker_of_.find(p.conn); w != worker_of_.end())
        shard_->sent(w->second, p.key, version);
      std::string_view data;  // what follows the head on the socket
      if (p.in_place) {       // a shmpushpull: the value goes into the worker's memory
        std::memcpy(p.in_place, value->raw_data(), value->nbytes());
        shm_out_ += value->nbytes();
        append_pull_reply_in_place(head, version, value->shape());
      } else {
        append_pull_reply_head(head, version, *value, p.codec);
        if (p.codec == Codec::kF32)
          data = {static_cast<const char*>(value->raw_data()), value->nbytes()};
      }
      bytes_out_ += head.size() + data.size();
      send(s, p.conn, p.seq, {head, data});
      return true;
    });
  }

  // Snapshots (--snapshot-every N): every N updates one is due, and no
  // answer sent after it is due goes out before it is on disk, so a server
  // restarted from it has every update a worker heard of. The shard is
  // copied here and written on the writer's thread while serving goes on;
  // answers wait in held_ (copied). A write that fails refuses them, named.
  void maybe_snapshot() {
    if (!writer_) return;
    const std::uint64_t applied = shard_->stats().applied;
    if (applied - last_snapshot_ < o_.snapshot_every) return;
    last_snapshot_ = applied;
    due_ = applied;  // written from on_tick, after this batch of requests: one write for all
  }

  void start_snapshot() {
    if (!writer_ || writer_->busy() || written_ >= due_) return;
    writer_->start(capture(), shard_->stats().applied);
  }

  train::CheckpointState capture() const {
    train::CheckpointState s = shard_->capture();
    s.meta["job"] = job_;
    return s;
  }

  // A snapshot is restored only by the job that wrote it: another job's
  // (a directory used again) has its workers' sequence marks, so every push
  // of the new job was ignored as a duplicate and the job hung.
  Status same_job(const train::CheckpointState& old, const std::string& path) const {
    auto j = old.meta.find("job");
    if (j == old.meta.end() || j->second == job_) return ok_status();
    return failed_precondition(
        "{} is the snapshot of another job (its job token differs): a new job starts without "
        "one. Give it another --ps-snapshots directory (shoal run) or --snapshot file (shoal ps "
        "server), or remove this one",
        path);
  }

  void snapshot_progress(net::FrameServer& s) {
    if (!writer_) return;
    if (auto done = writer_->take_finished()) {
      const auto& [mark, st] = *done;
      if (st.ok()) written_ = std::max(written_, mark);
      std::erase_if(held_, [&](const Held& h) {
        if (st.ok() && h.needs > written_) return false;
        if (st.ok())
          s.reply(h.conn, net::FrameType::kPsReply, h.seq, h.payload);
        else
          s.reply(h.conn, net::FrameType::kStoreError, h.seq,
                  fmt::format("ps server: snapshot {}: {}", writer_->path(), st.message()));
        return true;
      });
      if (!st.ok()) {
        SHOAL_LOG_ERROR("ps server: snapshot {}: {}", writer_->path(), st.to_string());
        written_ = due_;  // its answers are refused; the next due one is tried afresh
      }
    }
    start_snapshot();
  }

  // An answer: out now, or held until the due snapshot is written.
  void send(net::FrameServer& s, ConnId c, std::uint64_t seq,
            std::initializer_list<std::string_view> parts) {
    if (due_ <= written_) {
      s.reply(c, net::FrameType::kPsReply, seq, std::span(parts.begin(), parts.size()));
      return;
    }
    std::string payload;
    for (std::string_view p : parts) payload.append(p);
    held_.push_back({c, seq, std::move(payload), due_});
  }

  void publish() {
    std::lock_guard<std::mutex> lk(mu_);
    stats_ = shard_->stats();
    for (int w : shard_->workers()) stats_.lag[w] = shard_->lag(w);
    traffic_ = {bytes_in_, bytes_out_, pulls_.size(), shm_in_, shm_out_};
  }
  // Only the byte and queue counters (what answering pulls changes), without
  // copying the stats a second time per request.
  void publish_traffic() {
    std::lock_guard<std::mutex> lk(mu_);
    traffic_ = {bytes_in_, bytes_out_, pulls_.size(), shm_in_, shm_out_};
  }

  std::unique_ptr<Shard> shard_;
  ServerOptions o_;
  const std::string job_;
  std::map<ConnId, int> worker_of_;
  std::set<int> gone_;         // connections closed before a leave, not back
  Server::Presence presence_;  // guarded by mu_
  std::map<int, std::chrono::steady_clock::time_point> seen_;  // worker -> last request
  std::vector<std::pair<int, std::string>> drops_;             // guarded by mu_
  std::string lost_;         // why a sync job of job_workers cannot go on; "" while it can
  std::string lost_report_;  // "worker why", guarded by mu_
  std::set<int> departed_;   // sync job: members that left
  std::vector<Pull> pulls_;
  std::vector<Tensor> spares_;
  std::uint64_t last_snapshot_ = 0;
  // Snapshots: the updates the due one must hold, those on disk, the
  // answers waiting for it.
  struct Held {
    ConnId conn;
    std::uint64_t seq;
    std::string payload;
    std::uint64_t needs;
  };
  std::uint64_t due_ = 0, written_ = 0;
  std::vector<Held> held_;
  std::unique_ptr<SnapshotWriter> writer_;
  std::mutex wake_mu_;
  net::FrameServer* server_ = nullptr;  // guarded by wake_mu_
  mutable std::mutex mu_;
  ShardStats stats_;
  PeerRegions regions_;                         // same-host workers' memory
  std::uint64_t bytes_in_ = 0, bytes_out_ = 0;  // the serving thread's
  std::uint64_t shm_in_ = 0, shm_out_ = 0;      // read from / written to workers' memory
  Server::Traffic traffic_;                     // guarded by mu_
};

Result<std::unique_ptr<Server>> Server::start(const std::string& host, int port,
                                              const std::string& token, const ServerOptions& o) {
  std::unique_ptr<Server> s(new Server());
  SHOAL_RETURN_IF_ERROR(net::init_crypto());
  const std::string mac = net::token_mac(token, "shoal ps snapshot job");
  std::string job;
  for (std::size_t i = 0; i < 8 && i < mac.size(); ++i)
    job += fmt::format("{:02x}", static_cast<unsigned char>(mac[i]));
  s->handler_ = std::make_unique<Handler>(o, job);
  if (o.configured) SHOAL_RETURN_IF_ERROR(s->handler_->configure(o.shard));
  SHOAL_ASSIGN_OR_RETURN(s->server_, net::FrameServer::start(host, port, token, s->handler_.get(),
                                                             o.limits, "ps server"));
  s->handler_->attach(s->server_.get());
  return s;
}

Server::~Server() {
  handler_->attach(nullptr);
  server_.reset();  // the serving thread stops first
  if (Status st = handler_->final_snapshot(); !st.ok())
    SHOAL_LOG_ERROR("ps server: last snapshot: {}", st.to_string());
}

int Server::port() const { return server_->port(); }
ShardStats Server::stats() const { return handler_->stats(); }
Server::Traffic Server::traffic() const { return handler_->traffic(); }
int Server::refused() const { return server_->refused(); }
std::vector<std::pair<int, std::string>> Server::take_drops() { return handler_->take_drops(); }
std::string Server::lost() const { return handler_->lost(); }
Server::Presence Server::presence() const { return handler_->presence(); }

}  // namespace shoal::ps
