#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "ps/pipeline.h"
#include "ps/wire.h"
#include "ps/worker_impl.h"
#include "shoal/core/hash.h"
#include "shoal/core/logging.h"
#include "shoal/net/frame_server.h"

namespace shoal::ps {

Result<std::unique_ptr<Worker>> Worker::connect(const std::vector<std::string>& servers,
                                                const std::string& token, int worker, Deadline dl,
                                                const ShardOptions* config) {
  if (servers.empty()) return invalid_argument("a worker needs at least one ps server");
  auto w = std::make_unique<Impl>();
  w->worker_ = worker;
  w->token_ = token;
  w->addrs_ = servers;
  if (config) {
    w->config_ = *config;
    w->set_compression(config->compression);
  }
  for (const auto& addr : servers) {
    SHOAL_ASSIGN_OR_RETURN(auto hp, net::split_host_port(addr, "ps server"));
    SHOAL_ASSIGN_OR_RETURN(net::Socket s,
                           net::connect_authenticated(hp.first, hp.second, dl, token, "ps server"));
    w->servers_.push_back(std::move(s));
  }
  if (config) SHOAL_RETURN_IF_ERROR(w->configure(*config, dl));
  Request j;
  j.op = Op::kJoin;
  j.worker = worker;
  for (auto& s : w->servers_) SHOAL_RETURN_IF_ERROR(w->call(s, encode(j), dl).status());
  for (std::size_t i = 0; i < w->servers_.size(); ++i) w->probe_in_place(i, dl);
  return std::unique_ptr<Worker>(new Worker(std::move(w)));
}

Worker::Worker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Worker::~Worker() = default;  // Impl's destructor leaves

// The API, forwarded.
int Worker::id() const { return impl_->id(); }
int Worker::num_servers() const { return impl_->num_servers(); }
Status Worker::configure(const ShardOptions& o, Deadline dl) { return impl_->configure(o, dl); }
Status Worker::init(const std::string& key, const Tensor& value) { return impl_->init(key, value); }
Result<PushResult> Worker::push(const std::string& key, std::int64_t step, const Tensor& grad,
                                Deadline dl) {
  return impl_->push(key, step, grad, dl);
}
Result<std::pair<std::uint64_t, Tensor>> Worker::pull(const std::string& key,
                                                      std::uint64_t min_version, Deadline dl) {
  return impl_->pull(key, min_version, dl);
}
Result<Worker::Pulled> Worker::push_pull(const std::string& key, std::int64_t step,
                                         const Tensor& grad, double lr, Deadline dl, Tensor* into) {
  return impl_->push_pull(key, step, grad, lr, dl, into);
}
Result<Worker::Ticket> Worker::start_push_pull(const std::string& key, std::int64_t step,
                                               const Tensor& grad, double lr, Tensor into,
                                               Deadline dl) {
  return impl_->start_push_pull(key, step, grad, lr, std::move(into), dl);
}
Result<Worker::Ticket> Worker::start_push_rows_pull(const std::string& key, std::int64_t step,
                                                    const std::vector<std::int64_t>& rows,
                                                    const Tensor& values, double lr, Tensor into,
                                                    Deadline dl) {
  return impl_->start_push_rows_pull(key, step, rows, values, lr, std::move(into), dl);
}
std::vector<Worker::Done> Worker::poll_push_pulls(int wake, Deadline dl) {
  return impl_->poll_push_pulls(wake, dl);
}
std::size_t Worker::push_pulls_in_flight() const { return impl_->push_pulls_in_flight(); }
void Worker::set_compression(const Compression& c) { impl_->set_compression(c); }
const Compression& Worker::compression() const { return impl_->compression(); }
ErrorFeedback* Worker::feedback() { return impl_->feedback(); }
Result<PushResult> Worker::push_rows(const std::string& key, std::int64_t step,
                                     const std::vector<std::int64_t>& rows, const Tensor& values,
                                     double lr, Deadline dl) {
  return impl_->push_rows(key, step, rows, values, lr, dl);
}
Result<std::pair<std::uint64_t, Tensor>> Worker::pull_rows(const std::string& key,
                                                           const std::vector<std::int64_t>& rows,
                                                           std::uint64_t min_version, Deadline dl) {
  return impl_->pull_rows(key, rows, min_version, dl);
}
void Worker::set_in_place(bool on) { impl_->set_in_place(on); }
bool Worker::in_place(std::size_t server) const { return impl_->in_place(server); }
Status Worker::leave() { return impl_->leave(); }
void Worker::set_resolver(Resolver r) { impl_->set_resolver(std::move(r)); }
void Worker::set_silence(Silence s) { impl_->set_silence(std::move(s)); }

void Worker::Impl::probe_in_place(std::size_t i, Deadline dl) {
  if (in_place_.size() < servers_.size()) in_place_.resize(servers_.size(), false);
  in_place_[i] = false;
  if (!probe_) {
    auto r = net::SharedRegion::create(8);
    if (!r.ok()) {
      SHOAL_LOG_DEBUG("worker {}: no shared memory ({}): push-pulls go over TCP", worker_,
                      r.status().message());
      return;
    }
    probe_ = std::move(*r);
    std::random_device rd;
    const std::uint64_t word = (std::uint64_t{rd()} << 32) | rd();
    std::memcpy(probe_->data(), &word, 8);
  }
  auto ref = net::find_shared(probe_->data(), 8);
  if (!ref) return;
  Request m;
  m.op = Op::kMapCheck;
  m.worker = worker_;
  m.mem.pid = static_cast<std::int32_t>(::getpid());
  m.mem.grad = *ref;
  auto got = call(servers_[i], encode(m), dl);
  in_place_[i] = got.ok() && got->size() == 8 && std::memcmp(got->data(), probe_->data(), 8) == 0;
  SHOAL_LOG_DEBUG("worker {}: parameter server {} {}", worker_, i,
                  in_place_[i] ? "maps this process's memory: push-pulls in place"
                               : fmt::format("over TCP ({})", got.ok() ? "the probe differs"
                                                                       : got.status().message()));
}

Worker::Impl::~Impl() {
  if (!left_) (void)leave();
}

std::size_t Worker::Impl::server_of(const std::string& key) const {
  return fnv1a(key) % servers_.size();  // the same on every worker
}

Status Worker::Impl::reconnect(std::size_t i, Deadline dl) {
  SHOAL_ASSIGN_OR_RETURN(std::string addr, resolve_(static_cast<int>(i), addrs_[i]));
  SHOAL_ASSIGN_OR_RETURN(auto hp, net::split_host_port(addr, "ps server"));
  SHOAL_ASSIGN_OR_RETURN(net::Socket s,
                         net::connect_authenticated(hp.first, hp.second, dl, token_, "ps server"));
  if (config_) {
    Request c;
    c.op = Op::kConfig;
    c.config = config_text(*config_);
    SHOAL_RETURN_IF_ERROR(call(s, encode(c), dl).status());
  }
  Request j;
  j.op = Op::kJoin;
  j.worker = worker_;
  SHOAL_RETURN_IF_ERROR(call(s, encode(j), dl).status());
  servers_[i] = std::move(s);
  probe_in_place(i, dl);  // a restarted server may be elsewhere
  SHOAL_LOG_WARN("worker {}: reconnected to parameter server {} at {} (was {})", worker_, i, addr,
                 addrs_[i]);
  addrs_[i] = addr;
  return ok_status();
}

Result<std::string> Worker::Impl::call_server(std::size_t i, const std::string& payload,
                                              Deadline dl) {
  for (int attempt = 0;; ++attempt) {
    auto r = call(servers_[i], payload, dl);
    if (r.ok() || r.status().code() != StatusCode::kUnavailable || !resolve_ || dl.expired() ||
        attempt >= 5)
      return r;
    SHOAL_LOG_WARN("worker {}: lost parameter server {} at {} ({}); waiting for it to restart",
                   worker_, i, addrs_[i], r.status().message());
    if (Status st = reconnect(i, dl); !st.ok())
      return st.with_context(fmt::format("reconnecting to parameter server {}", i));
  }
}

Result<std::string> Worker::Impl::call(net::Socket& s, const std::string& payload, Deadline dl) {
  net::FrameHeader h;
  h.type = static_cast<std::uint16_t>(net::FrameType::kPsRequest);
  h.length = payload.size();
  h.seq = ++frame_;
  SHOAL_RETURN_IF_ERROR(s.send_frame(h, payload.data(), dl).with_context(s.peer()));
  return net::recv_reply(s, net::FrameType::kPsReply, net::FrameType::kStoreError,
                         std::uint64_t{1} << 34, dl);
}

Status Worker::Impl::configure(const ShardOptions& o, Deadline dl) {
  set_compression(o.compression);
  Request r;
  r.op = Op::kConfig;
  r.config = config_text(o);
  for (auto& s : servers_) SHOAL_RETURN_IF_ERROR(call(s, encode(r), dl).status());
  return ok_status();
}

Result<std::uint64_t> Worker::Impl::send_request(std::size_t i, const Request& r, Deadline dl) {
  net::Socket& s = servers_[i];
  // An f32 gradient is sent from its own memory; a coded one is encoded.
  const bool raw = r.codec == Codec::kF32 && r.op != Op::kShmPushPull;  // 'Y' has no tensor data
  const std::string head = raw ? encode_head(r) : encode(r);
  const Tensor grad = raw ? r.value.contiguous() : Tensor();
  const std::size_t data_bytes = raw ? grad.nbytes() : 0;
  net::FrameHeader h;
  h.type = static_cast<std::uint16_t>(net::FrameType::kPsRequest);
  h.length = head.size() + data_bytes;
  h.seq = ++frame_;
  std::uint8_t hb[net::kHeaderBytes];
  net::encode_header(h, hb);
  SHOAL_RETURN_IF_ERROR(s.send_all(hb, sizeof hb, dl).with_context(s.peer()));
  SHOAL_RETURN_IF_ERROR(s.send_all(head.data(), head.size(), dl).with_context(s.peer()));
  if (raw)
    SHOAL_RETURN_IF_ERROR(s.send_all(grad.raw_data(), data_bytes, dl).with_context(s.peer()));
  return h.seq;
}

Result<Worker::Pulled> Worker::Impl::recv_answer(std::size_t i, const net::FrameHeader& rh,
                                                 Deadline dl, Tensor* into, bool in_place) {
  net::Socket& s = servers_[i];
  // The reply: result, then (unless kWait) version, rank, dims, coded data.
  if (rh.type == static_cast<std::uint16_t>(net::FrameType::kStoreError) ||
      rh.type != static_cast<std::uint16_t>(net::FrameType::kPsReply) || rh.length < 1) {
    std::string v(rh.length, '\0');
    SHOAL_RETURN_IF_ERROR(s.recv_all(v.data(), v.size(), dl).with_context(s.peer()));
    if (rh.type == static_cast<std::uint16_t>(net::FrameType::kStoreError))
      return failed_precondition("{} refused: {}", s.peer(), v);
    return invalid_argument("{}: a pushpull reply of type {} and {} bytes", s.peer(), rh.type,
                            rh.length);
  }
  std::uint8_t fixed[10];  // result, version, rank
  const std::size_t n_fixed = rh.length == 1 ? 1 : 10;
  if (n_fixed == 10 && rh.length < 10)
    return invalid_argument("{}: a pushpull reply of {} bytes", s.peer(), rh.length);
  SHOAL_RETURN_IF_ERROR(s.recv_all(fixed, n_fixed, dl).with_context(s.peer()));
  const auto pr = static_cast<PushResult>(fixed[0]);
  if (n_fixed == 1) {
    if (pr != PushResult::kWait)
      return invalid_argument("{}: a pushpull reply without a value ({})", s.peer(),
                              push_result_name(pr));
    return Pulled{pr, 0, Tensor()};
  }
  std::uint64_t version;
  std::memcpy(&version, fixed + 1, 8);
  SHOAL_ASSIGN_OR_RETURN(Tensor value, recv_value(s, rh.length - 10, fixed[9], dl, into, in_place));
  return Pulled{pr, version, std::move(value)};
}

Result<Tensor> Worker::Impl::recv_value(net::Socket& s, std::uint64_t length, int rank, Deadline dl,
                                        Tensor* into, bool in_place) {
  if (rank > 8) return invalid_argument("{}: a pushpull reply of rank {}", s.peer(), rank);
  std::int64_t dims[8];
  const std::uint64_t dim_bytes = 8 * static_cast<std::uint64_t>(rank);
  if (length < dim_bytes + 1)
    return invalid_argument("{}: a pushpull reply of rank {} in {} bytes", s.peer(), rank, length);
  SHOAL_RETURN_IF_ERROR(s.recv_all(dims, dim_bytes, dl));
  Shape shape(dims, dims + rank);
  std::uint64_t numel = 1;
  for (std::int64_t d : shape) {
    if (d < 0 || (d > 0 && numel > (std::uint64_t{1} << 40) / static_cast<std::uint64_t>(d)))
      return invalid_argument("{}: a pushpull reply of shape {}", s.peer(), shape_str(shape));
    numel *= static_cast<std::uint64_t>(d);
  }
  std::uint8_t codec;
  SHOAL_RETURN_IF_ERROR(s.recv_all(&codec, 1, dl));
  if (codec == kInPlace || in_place) {
    // The server wrote the value into `into` (this process's memory).
    if (codec != kInPlace || !in_place || !into || into->shape() != shape ||
        length != dim_bytes + 1)
      return invalid_argument("{}: a pushpull reply coded {} of shape {} in {} bytes, for a {}",
                              s.peer(), codec, shape_str(shape), length + 10,
                              in_place ? "value written in place" : "value sent over TCP");
    return *into;
  }
  const auto c = static_cast<Codec>(codec);
  if (c != Codec::kF32 && c != Codec::kF16 && c != Codec::kBF16)
    return invalid_argument("{}: a pushpull reply coded {}", s.peer(), codec);
  if (length != dim_bytes + 1 + codec_payload_bytes(c, numel))
    return invalid_argument("{}: a pushpull reply of {} bytes for shape {} in {}", s.peer(),
                            length + 10, shape_str(shape), codec_name(c));
  Tensor value =
      into && into->dtype() == DType::kF32 && into->shape() == shape && into->is_contiguous()
          ? *into
          : Tensor::empty(shape, DType::kF32);
  if (c == Codec::kF32) {
    SHOAL_RETURN_IF_ERROR(s.recv_all(value.raw_data(), 4 * numel, dl).with_context(s.peer()));
    return value;
  }
  std::string coded(1 + codec_payload_bytes(c, numel), static_cast<char>(codec));
  SHOAL_RETURN_IF_ERROR(s.recv_all(coded.data() + 1, coded.size() - 1, dl).with_context(s.peer()));
  SHOAL_RETURN_IF_ERROR(decode_coded(coded, numel, value.data<float>()).status());
  return value;
}

void Worker::Impl::set_compression(const Compression& c) {
  compression_ = c;
  if (c.push == Codec::kTwoBit && (!feedback_ || feedback_->threshold() != c.threshold))
    feedback_ = std::make_unique<ErrorFeedback>(c.threshold);
  if (c.push != Codec::kTwoBit) feedback_.reset();
}

Status Worker::Impl::code_push(Request& r, const Tensor& grad) {
  r.codec = compression_.push;
  r.reply = compression_.pull;
  if (r.codec != Codec::kTwoBit) {
    r.value = grad;
    return ok_status();
  }
  r.threshold = compression_.threshold;
  r.value = Tensor::empty(grad.shape(), DType::kF32);
  return feedback_->quantize(r.key, grad, r.value);
}

Status Worker::Impl::leave() {
  left_ = true;
  Request q;
  q.op = Op::kLeave;
  q.worker = worker_;
  // Every server is told, the first failure reported; a server taken for
  // stopped (its stream holds unanswered requests) is not waited for.
  Status first;
  for (std::size_t i = 0; i < servers_.size(); ++i) {
    if (i < silenced_.size() && silenced_[i]) continue;
    Status st = call(servers_[i], encode(q), Deadline::after_seconds(10)).status();
    if (first.ok()) first = st;
  }
  return first;
}

}  // namespace shoal::ps
