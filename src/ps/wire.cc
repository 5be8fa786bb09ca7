#include "ps/wire.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "shoal/core/bytes.h"

namespace shoal::ps {
namespace {

void put_rows(std::string& out, const std::vector<std::int64_t>& rows) {
  append_le<std::uint32_t>(out, static_cast<std::uint32_t>(rows.size()));
  const std::size_t at = out.size();
  out.resize(at + 8 * rows.size());
  if (!rows.empty()) std::memcpy(out.data() + at, rows.data(), 8 * rows.size());
}
void put_str(std::string& out, const std::string& s) {
  append_le<std::uint32_t>(out, static_cast<std::uint32_t>(s.size()));
  out += s;
}
void put_shape(std::string& out, const Shape& s) {
  append_le<std::uint8_t>(out, static_cast<std::uint8_t>(s.size()));
  for (std::int64_t d : s) append_le<std::int64_t>(out, d);
}
void put_tensor_head(std::string& out, const Tensor& t) { put_shape(out, t.shape()); }
void put_ref(std::string& out, const net::SharedRef& r) {
  append_le<std::uint64_t>(out, r.id);
  append_le<std::int64_t>(out, r.fd);
  append_le<std::uint64_t>(out, r.region_bytes);
  append_le<std::uint64_t>(out, r.offset);
}
void put_tensor(std::string& out, const Tensor& t, Codec c = Codec::kF32, float threshold = 0) {
  const Tensor x = t.contiguous();
  put_tensor_head(out, x);
  append_coded(out, x.data<float>(), static_cast<std::uint64_t>(x.numel()), c, threshold);
}

// Reads fields off the front of a message; the first failure is kept.
class Reader {
 public:
  explicit Reader(std::string_view in, const MakeTensor* make = nullptr) : in_(in), make_(make) {}
  template <typename T>
  T get(const char* field) {
    T v{};
    if (!take(sizeof(T), field)) return v;
    std::memcpy(&v, in_.data() + pos_ - sizeof(T), sizeof(T));
    return v;
  }
  std::string str(const char* field) {
    const auto n = get<std::uint32_t>(field);
    if (!err_.empty()) return "";
    if (n > kMaxKeyBytes) {
      fail(field, fmt::format("length {} over the limit {}", n, kMaxKeyBytes));
      return "";
    }
    if (!take(n, field)) return "";
    return std::string(in_.substr(pos_ - n, n));
  }
  // rank:u8 (<= 8) then dims:i64[rank], each >= 0, their product <= 2^40.
  Shape read_shape(const char* field, std::uint64_t& numel) {
    const auto rank = get<std::uint8_t>(field);
    if (!err_.empty()) return {};
    if (rank > 8) {
      fail(field, fmt::format("rank {} over 8", rank));
      return {};
    }
    Shape shape;
    // `extent` multiplies the dimensions with 0 read as 1, so that a zero
    // among them cannot hide a product that overflows.
    constexpr std::uint64_t kMaxExtent = std::uint64_t{1} << 40;
    std::uint64_t extent = 1;
    numel = 1;
    for (int i = 0; i < rank; ++i) {
      const auto d = get<std::int64_t>(field);
      if (!err_.empty()) return {};
      const auto ud = static_cast<std::uint64_t>(std::max<std::int64_t>(d, 1));
      if (d < 0 || extent > kMaxExtent / ud) {
        fail(field, fmt::format("dimension {} is {}", i, d));
        return {};
      }
      extent *= ud;
      numel *= static_cast<std::uint64_t>(d);
      shape.push_back(d);
    }
    return shape;
  }
  Tensor tensor(const char* field) {
    std::uint64_t numel = 0;
    const Shape shape = read_shape(field, numel);
    if (!err_.empty()) return {};
    // Checked before allocating: a few bytes must not ask for terabytes.
    if (pos_ >= in_.size() || static_cast<unsigned char>(in_[pos_]) > 3) {
      fail(field, pos_ >= in_.size()
                      ? std::string("no codec byte")
                      : fmt::format("unknown codec {}", static_cast<unsigned char>(in_[pos_])));
      return {};
    }
    const auto c = static_cast<Codec>(in_[pos_]);
    codec_ = c;
    if (c == Codec::kTwoBit && in_.size() - pos_ >= 5)
      std::memcpy(&threshold_, in_.data() + pos_ + 1, 4);
    const std::uint64_t need = 1 + (c == Codec::kTwoBit ? 4 : 0) + codec_payload_bytes(c, numel);
    if (need > in_.size() - pos_) {
      fail(field, fmt::format("{} elements in {} need {} bytes, {} are left", numel, codec_name(c),
                              need, in_.size() - pos_));
      return {};
    }
    Tensor t = make_ && *make_ ? (*make_)(shape) : Tensor();
    if (!t.defined() || t.dtype() != DType::kF32 || t.shape() != shape || !t.is_contiguous())
      t = Tensor::empty(shape, DType::kF32);
    auto used = decode_coded(in_.substr(pos_), numel, t.data<float>());
    if (!used.ok()) {
      fail(field, std::string(used.status().message()));
      return {};
    }
    pos_ += *used;
    return t;
  }
  // id:u64 fd:i64 region_bytes:u64 offset:u64, holding at least `bytes`
  // from offset on (checked without overflow).
  net::SharedRef ref(const char* field, std::uint64_t bytes) {
    net::SharedRef r;
    r.id = get<std::uint64_t>(field);
    r.fd = get<std::int64_t>(field);
    r.region_bytes = get<std::uint64_t>(field);
    r.offset = get<std::uint64_t>(field);
    if (!err_.empty()) return r;
    if (r.id == 0 || r.fd < 0 || r.fd > INT32_MAX)
      fail(field, fmt::format("region {} at descriptor {}", r.id, r.fd));
    else if (r.offset > r.region_bytes || bytes > r.region_bytes - r.offset)
      fail(field,
           fmt::format("{} bytes at offset {} of a region of {}", bytes, r.offset, r.region_bytes));
    return r;
  }
  std::vector<std::int64_t> rows(const char* field) {
    const auto n = get<std::uint32_t>(field);
    if (!err_.empty()) return {};
    if (n > (1u << 24)) {
      fail(field, fmt::format("{} rows, over the limit {}", n, 1u << 24));
      return {};
    }
    if (!take(8 * std::size_t{n}, field)) return {};
    std::vector<std::int64_t> v(n);
    if (n) std::memcpy(v.data(), in_.data() + pos_ - 8 * std::size_t{n}, 8 * std::size_t{n});
    return v;
  }
  Codec codec(const char* field) {
    const auto c = get<std::uint8_t>(field);
    if (err_.empty() && c > static_cast<std::uint8_t>(Codec::kBF16))
      fail(field, fmt::format("codec {} (a reply is f32, f16 or bf16)", c));
    return static_cast<Codec>(c);
  }
  Status done() {
    if (err_.empty() && pos_ != in_.size())
      err_ = fmt::format("{} trailing bytes after the message", in_.size() - pos_);
    return err_.empty() ? ok_status() : invalid_argument("ps message: {}", err_);
  }
  bool ok() const { return err_.empty(); }
  // How the last tensor read was coded.
  Codec last_codec() const { return codec_; }
  float last_threshold() const { return threshold_; }

 private:
  bool take(std::size_t n, const char* field) {
    if (!err_.empty()) return false;
    if (n > in_.size() - pos_) {
      fail(field, fmt::format("needs {} bytes, {} are left", n, in_.size() - pos_));
      return false;
    }
    pos_ += n;
    return true;
  }
  void fail(const char* field, const std::string& why) {
    if (err_.empty()) err_ = fmt::format("field '{}' at byte {}: {}", field, pos_, why);
  }
  std::string_view in_;
  const MakeTensor* make_;
  std::size_t pos_ = 0;
  std::string err_;
  Codec codec_ = Codec::kF32;
  float threshold_ = 0;
};

}  // namespace

namespace {
std::string encode_impl(const Request& r, bool data) {
  // encode_head stops after the codec byte of an f32 tensor.
  auto tensor = [&](std::string& out, const Tensor& t) {
    if (data) {
      put_tensor(out, t, r.codec, r.threshold);
    } else {
      put_tensor_head(out, t);
      append_le<std::uint8_t>(out, static_cast<std::uint8_t>(Codec::kF32));
    }
  };
  std::string out(1, static_cast<char>(r.op));
  switch (r.op) {
    case Op::kJoin:
    case Op::kLeave:
    case Op::kHeartbeat:
      append_le<std::int32_t>(out, r.worker);
      break;
    case Op::kInit:
      put_str(out, r.key);
      tensor(out, r.value);
      break;
    case Op::kPush:
      append_le<std::int32_t>(out, r.worker);
      put_str(out, r.key);
      append_le<std::int64_t>(out, r.step);
      append_le<std::uint64_t>(out, r.seq);
      tensor(out, r.value);
      break;
    case Op::kPull:
      put_str(out, r.key);
      append_le<std::uint64_t>(out, r.min_version);
      append_le<std::uint8_t>(out, static_cast<std::uint8_t>(r.reply));
      break;
    case Op::kConfig:
      put_str(out, r.config);
      break;
    case Op::kPushPull:      // pushpull
    case Op::kPushRowsPull:  // pushrowspull: the same with rows
      append_le<std::int32_t>(out, r.worker);
      put_str(out, r.key);
      append_le<std::int64_t>(out, r.step);
      append_le<std::uint64_t>(out, r.seq);
      append_le<double>(out, r.lr);
      append_le<std::uint8_t>(out, static_cast<std::uint8_t>(r.reply));
      if (r.op == Op::kPushRowsPull) put_rows(out, r.rows);
      tensor(out, r.value);
      break;
    case Op::kPushRows:
      append_le<std::int32_t>(out, r.worker);
      put_str(out, r.key);
      append_le<std::int64_t>(out, r.step);
      append_le<std::uint64_t>(out, r.seq);
      append_le<double>(out, r.lr);
      put_rows(out, r.rows);
      tensor(out, r.value);
      break;
    case Op::kPullRows:
      put_str(out, r.key);
      append_le<std::uint64_t>(out, r.min_version);
      append_le<std::uint8_t>(out, static_cast<std::uint8_t>(r.reply));
      put_rows(out, r.rows);
      break;
    case Op::kMapCheck:
      append_le<std::int32_t>(out, r.worker);
      append_le<std::int32_t>(out, r.mem.pid);
      put_ref(out, r.mem.grad);
      break;
    case Op::kShmPushPull:
      append_le<std::int32_t>(out, r.worker);
      put_str(out, r.key);
      append_le<std::int64_t>(out, r.step);
      append_le<std::uint64_t>(out, r.seq);
      append_le<double>(out, r.lr);
      append_le<std::int32_t>(out, r.mem.pid);
      put_shape(out, r.mem.shape);
      put_ref(out, r.mem.grad);
      put_ref(out, r.mem.dst);
      break;
  }
  return out;
}

// Whether `b` is an operation's byte. No default: a new Op is a compile
// error here until it is listed.
bool is_op(std::uint8_t b) {
  switch (static_cast<Op>(b)) {
    case Op::kJoin:
    case Op::kLeave:
    case Op::kHeartbeat:
    case Op::kInit:
    case Op::kPush:
    case Op::kPull:
    case Op::kConfig:
    case Op::kPushPull:
    case Op::kPushRows:
    case Op::kPullRows:
    case Op::kPushRowsPull:
    case Op::kMapCheck:
    case Op::kShmPushPull:
      return true;
  }
  return false;
}

}  // namespace

std::string encode(const Request& r) { return encode_impl(r, true); }
std::string encode_head(const Request& r) { return encode_impl(r, false); }

Result<Request> decode_request(std::string_view in, const MakeTensor& make) {
  Reader rd(in, &make);
  Request r;
  const auto op = rd.get<std::uint8_t>("op");
  if (rd.ok() && !is_op(op)) return invalid_argument("ps message: unknown operation 0x{:02x}", op);
  r.op = static_cast<Op>(op);
  switch (r.op) {
    case Op::kJoin:
    case Op::kLeave:
    case Op::kHeartbeat:
      r.worker = rd.get<std::int32_t>("worker");
      break;
    case Op::kInit:
      r.key = rd.str("key");
      r.value = rd.tensor("value");
      break;
    case Op::kPush:
      r.worker = rd.get<std::int32_t>("worker");
      r.key = rd.str("key");
      r.step = rd.get<std::int64_t>("step");
      r.seq = rd.get<std::uint64_t>("seq");
      r.value = rd.tensor("grad");
      break;
    case Op::kPull:
      r.key = rd.str("key");
      r.min_version = rd.get<std::uint64_t>("min_version");
      r.reply = rd.codec("reply");
      break;
    case Op::kConfig:
      r.config = rd.str("config");
      break;
    case Op::kPushPull:
    case Op::kPushRowsPull:
      r.worker = rd.get<std::int32_t>("worker");
      r.key = rd.str("key");
      r.step = rd.get<std::int64_t>("step");
      r.seq = rd.get<std::uint64_t>("seq");
      r.lr = rd.get<double>("lr");
      r.reply = rd.codec("reply");
      if (r.op == Op::kPushRowsPull) r.rows = rd.rows("rows");
      r.value = rd.tensor("grad");
      if (rd.ok() && !(r.lr >= 0 && r.lr < 1e6))
        return invalid_argument("ps message: field 'lr' is {}, outside [0, 1e6)", r.lr);
      break;
    case Op::kPushRows:
      r.worker = rd.get<std::int32_t>("worker");
      r.key = rd.str("key");
      r.step = rd.get<std::int64_t>("step");
      r.seq = rd.get<std::uint64_t>("seq");
      r.lr = rd.get<double>("lr");
      r.rows = rd.rows("rows");
      r.value = rd.tensor("grad");
      if (rd.ok() && !(r.lr >= 0 && r.lr < 1e6))
        return invalid_argument("ps message: field 'lr' is {}, outside [0, 1e6)", r.lr);
      break;
    case Op::kPullRows:
      r.key = rd.str("key");
      r.min_version = rd.get<std::uint64_t>("min_version");
      r.reply = rd.codec("reply");
      r.rows = rd.rows("rows");
      break;
    case Op::kMapCheck:
      r.worker = rd.get<std::int32_t>("worker");
      r.mem.pid = rd.get<std::int32_t>("pid");
      r.mem.grad = rd.ref("probe", 8);
      if (rd.ok() && r.mem.pid <= 0)
        return invalid_argument("ps message: field 'pid' is {}", r.mem.pid);
      break;
    case Op::kShmPushPull: {
      r.worker = rd.get<std::int32_t>("worker");
      r.key = rd.str("key");
      r.step = rd.get<std::int64_t>("step");
      r.seq = rd.get<std::uint64_t>("seq");
      r.lr = rd.get<double>("lr");
      r.mem.pid = rd.get<std::int32_t>("pid");
      std::uint64_t numel = 0;
      r.mem.shape = rd.read_shape("shape", numel);
      r.mem.grad = rd.ref("grad", 4 * numel);
      r.mem.dst = rd.ref("dst", 4 * numel);
      if (rd.ok() && !(r.lr >= 0 && r.lr < 1e6))
        return invalid_argument("ps message: field 'lr' is {}, outside [0, 1e6)", r.lr);
      if (rd.ok() && r.mem.pid <= 0)
        return invalid_argument("ps message: field 'pid' is {}", r.mem.pid);
      break;
    }
  }
  r.codec = rd.last_codec();
  r.threshold = rd.last_threshold();
  SHOAL_RETURN_IF_ERROR(rd.done());
  return r;
}

void append_pull_reply(std::string& out, std::uint64_t version, const Tensor& value, Codec c) {
  out.reserve(out.size() + 8 + 2 + 8 * static_cast<std::size_t>(value.rank()) +
              codec_payload_bytes(c, static_cast<std::uint64_t>(value.numel())));
  append_le<std::uint64_t>(out, version);
  put_tensor(out, value, c);
}

void append_pull_reply_head(std::string& out, std::uint64_t version, const Tensor& value, Codec c) {
  if (c != Codec::kF32) return append_pull_reply(out, version, value, c);
  append_le<std::uint64_t>(out, version);
  put_tensor_head(out, value);
  append_le<std::uint8_t>(out, static_cast<std::uint8_t>(Codec::kF32));
}

void append_pull_reply_in_place(std::string& out, std::uint64_t version, const Shape& shape) {
  append_le<std::uint64_t>(out, version);
  put_shape(out, shape);
  append_le<std::uint8_t>(out, kInPlace);
}

std::string encode_pull_reply(std::uint64_t version, const Tensor& value, Codec c) {
  std::string out;
  append_pull_reply(out, version, value, c);
  return out;
}

Result<std::pair<std::uint64_t, Tensor>> decode_pull_reply(std::string_view in) {
  Reader rd(in);
  const auto v = rd.get<std::uint64_t>("version");
  Tensor t = rd.tensor("value");
  SHOAL_RETURN_IF_ERROR(rd.done());
  return std::pair{v, std::move(t)};
}

}  // namespace shoal::ps
