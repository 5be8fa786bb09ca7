#include "shoal/train/data.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "shoal/core/env.h"
#include "shoal/tensor/philox.h"
#include "shoal/tensor/safetensors.h"

namespace shoal::train {
namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMaxInflated = std::size_t{2} << 30;  // 2 GiB: refuse gzip bombs

Result<std::string> gunzip(std::string_view in, std::string_view where) {
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) return internal_error("{}: inflateInit2", where);
  std::string out;
  out.resize(std::max<std::size_t>(in.size() * 4, 1 << 16));
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    if (zs.total_out == out.size()) {
      if (out.size() >= kMaxInflated) {
        inflateEnd(&zs);
        return invalid_argument("{}: gzip stream inflates past {} bytes", where, kMaxInflated);
      }
      out.resize(std::min(out.size() * 2, kMaxInflated));
    }
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + zs.total_out);
    zs.avail_out = static_cast<uInt>(out.size() - zs.total_out);
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) {
      inflateEnd(&zs);
      return invalid_argument("{}: gzip stream is truncated (ends after {} compressed bytes)",
                              where, in.size());
    }
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
      std::string msg = zs.msg ? zs.msg : "unknown";
      inflateEnd(&zs);
      return invalid_argument("{}: corrupt gzip stream at compressed byte {}: {}", where,
                              zs.total_in, msg);
    }
  }
  out.resize(zs.total_out);
  inflateEnd(&zs);
  return out;
}

const char* idx_type_name(unsigned code) {
  switch (code) {
    case 0x08:
      return "u8";
    case 0x09:
      return "i8";
    case 0x0B:
      return "i16";
    case 0x0C:
      return "i32";
    case 0x0D:
      return "f32";
    case 0x0E:
      return "f64";
    default:
      return "unknown";
  }
}

}  // namespace

Result<IdxArray> parse_idx(std::string_view b, std::string_view where) {
  if (b.size() < 4)
    return invalid_argument("{}: IDX header: file has {} bytes, the magic number needs 4", where,
                            b.size());
  auto u8 = [&](std::size_t i) { return static_cast<unsigned>(static_cast<unsigned char>(b[i])); };
  if (u8(0) != 0 || u8(1) != 0)
    return invalid_argument(
        "{}: IDX magic: first two bytes must be 0, got 0x{:02x}{:02x} (not an IDX file?)", where,
        u8(0), u8(1));
  unsigned type = u8(2), ndim = u8(3);
  if (type != 0x08)
    return invalid_argument(
        "{}: IDX type code 0x{:02x} ({}) is not supported; Shoal reads u8 "
        "(0x08) IDX files",
        where, type, idx_type_name(type));
  if (ndim < 1 || ndim > 4)
    return invalid_argument("{}: IDX dimension count {} is out of range 1..4", where, ndim);
  std::size_t header = 4 + 4 * static_cast<std::size_t>(ndim);
  if (b.size() < header)
    return invalid_argument("{}: IDX header: {} dimensions need {} header bytes, file has {}",
                            where, ndim, header, b.size());
  IdxArray a;
  std::uint64_t total = 1;
  for (unsigned d = 0; d < ndim; ++d) {
    std::size_t o = 4 + 4 * d;
    std::uint64_t v =
        (std::uint64_t{u8(o)} << 24) | (u8(o + 1) << 16) | (u8(o + 2) << 8) | u8(o + 3);
    if (v == 0 && d > 0) return invalid_argument("{}: IDX dimension {} is 0", where, d);
    total *= v;
    if (total > (std::uint64_t{1} << 34))
      return invalid_argument("{}: IDX dimensions multiply past 2^34 elements", where);
    a.dims.push_back(static_cast<std::int64_t>(v));
  }
  std::size_t have = b.size() - header;
  if (have != total)
    return invalid_argument(
        "{}: IDX data: dimensions {} need {} bytes after the {}-byte header, "
        "file has {} ({})",
        where, shape_str(a.dims), total, header, have,
        have < total ? "truncated" : "trailing bytes");
  a.data.assign(b.begin() + static_cast<std::ptrdiff_t>(header), b.end());
  return a;
}

Result<IdxArray> read_idx(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(std::string raw, read_file(path));
  if (raw.size() >= 2 && static_cast<unsigned char>(raw[0]) == 0x1f &&
      static_cast<unsigned char>(raw[1]) == 0x8b) {
    SHOAL_ASSIGN_OR_RETURN(std::string plain, gunzip(raw, path));
    return parse_idx(plain, path);
  }
  return parse_idx(raw, path);
}

Result<std::string> resolve_data_dir(const std::string& data) {
  std::error_code ec;
  if (fs::is_directory(data, ec)) return data;
  std::vector<std::string> tried;
  if (data == "fashion-mnist" || data == "mnist") {
    std::vector<std::string> roots;
    if (auto e = env::get("SHOAL_DATA_DIR")) roots.push_back(*e);
    roots.push_back("/usr/share/datasets");
    for (const auto& r : roots) {
      std::string p = (fs::path(r) / data).string();
      if (fs::is_directory(p, ec)) return p;
      tried.push_back(p);
    }
    return not_found(
        "dataset '{}' not found (looked in {}); install it with `apt-get install "
        "dataset-{}` or pass --data DIR with its IDX files",
        data, fmt::join(tried, ", "), data == "mnist" ? "mnist" : "fashion-mnist");
  }
  return not_found(
      "--data '{}': not a directory and not a known dataset name "
      "(fashion-mnist, mnist)",
      data);
}

namespace {
Result<std::string> find_idx(const std::string& dir, const std::string& split,
                             const std::string& kind, int ndim) {
  std::vector<std::string> names = {
      fmt::format("{}-{}-idx{}-ubyte", split, kind, ndim),
      fmt::format("{}-{}.idx{}-ubyte", split, kind, ndim),
  };
  std::error_code ec;
  for (const auto& n : names)
    for (const char* ext : {"", ".gz"}) {
      std::string p = (fs::path(dir) / (n + ext)).string();
      if (fs::exists(p, ec)) return p;
    }
  return not_found("{}: no {} file for split '{}' (expected {}[.gz])", dir, kind, split, names[0]);
}
}  // namespace

Result<Dataset> load_idx_dataset(const std::string& dir, const std::string& split,
                                 int num_classes) {
  SHOAL_ASSIGN_OR_RETURN(std::string ip, find_idx(dir, split, "images", 3));
  SHOAL_ASSIGN_OR_RETURN(std::string lp, find_idx(dir, split, "labels", 1));
  SHOAL_ASSIGN_OR_RETURN(IdxArray im, read_idx(ip));
  SHOAL_ASSIGN_OR_RETURN(IdxArray lb, read_idx(lp));
  if (im.dims.size() != 3)
    return invalid_argument("{}: images must have 3 dimensions [N, H, W], got {}", ip,
                            shape_str(im.dims));
  if (lb.dims.size() != 1)
    return invalid_argument("{}: labels must have 1 dimension [N], got {}", lp, shape_str(lb.dims));
  if (im.dims[0] != lb.dims[0])
    return invalid_argument("{} has {} images but {} has {} labels", ip, im.dims[0], lp,
                            lb.dims[0]);
  if (im.dims[0] == 0) return invalid_argument("{}: the file holds no images (N = 0)", ip);
  for (std::size_t i = 0; i < lb.data.size(); ++i)
    if (lb.data[i] >= num_classes)
      return invalid_argument("{}: label {} at index {} is outside the {} classes [0, {})", lp,
                              static_cast<int>(lb.data[i]), i, num_classes, num_classes);
  Dataset d;
  d.name = fmt::format("{}:{}", fs::path(dir).filename().string(), split);
  d.num_classes = num_classes;
  d.images = Tensor::empty(im.dims, DType::kU8);
  std::memcpy(d.images.data<std::uint8_t>(), im.data.data(), im.data.size());
  d.labels = Tensor::empty(lb.dims, DType::kI32);
  std::copy(lb.data.begin(), lb.data.end(), d.labels.data<std::int32_t>());
  return d;
}

Shape Dataset::sample_shape() const {
  const Shape& s = images.shape();
  if (s.size() == 3) return {1, s[1], s[2]};
  return Shape(s.begin() + 1, s.end());
}

Dataset Dataset::take_first(std::int64_t n) const {
  if (n <= 0 || n >= size()) return *this;
  Dataset s = *this;
  Shape dims = images.shape();
  dims[0] = n;
  s.images = Tensor::empty(dims, images.dtype());
  std::memcpy(s.images.raw_data(), images.raw_data(), s.images.nbytes());
  Shape ldims = labels.shape();
  ldims[0] = n;
  s.labels = Tensor::empty(ldims, labels.dtype());
  std::memcpy(s.labels.raw_data(), labels.raw_data(), s.labels.nbytes());
  return s;
}

std::pair<float, float> pixel_stats(const Dataset& d) {
  if (d.tokens()) return {0.f, 1.f};
  const bool u8 = d.images.dtype() == DType::kU8;
  const std::uint8_t* p = u8 ? d.images.data<std::uint8_t>() : nullptr;
  const float* f = u8 ? nullptr : d.images.data<float>();
  std::int64_t n = d.images.numel();
  double s = 0, s2 = 0;
#pragma omp parallel for reduction(+ : s, s2) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    double v = u8 ? p[i] / 255.0 : f[i];
    s += v;
    s2 += v * v;
  }
  double mean = n ? s / static_cast<double>(n) : 0.0;
  double var = n ? s2 / static_cast<double>(n) - mean * mean : 1.0;
  return {static_cast<float>(mean), static_cast<float>(std::sqrt(std::max(var, 1e-12)))};
}

// ---------------------------------------------------------------- Loader

Loader::Loader(const Dataset& d, LoaderOptions o) : d_(d), o_(o) {
  SHOAL_CHECK(o_.batch > 0 && o_.world > 0 && o_.rank >= 0 && o_.rank < o_.world,
              "Loader: batch {} rank {} world {}", o_.batch, o_.rank, o_.world);
  if (o_.global == 0) {  // even shares: rank r's batch of each batch * world
    o_.global = o_.batch * o_.world;
    o_.offset = o_.rank * o_.batch;
  }
  SHOAL_CHECK(o_.offset >= 0 && o_.offset + o_.batch <= o_.global,
              "Loader: a share of {} at {} of a global batch of {}", o_.batch, o_.offset,
              o_.global);
  SHOAL_CHECK(!o_.augment || d_.sample_shape().size() == 3,
              "Loader: augmentation needs [C, H, W] samples, not {}", shape_str(d_.sample_shape()));
  SHOAL_CHECK(d_.images.dtype() == DType::kU8 || d_.images.dtype() == DType::kF32,
              "Loader: samples must be u8 or f32");
  if (o_.prefetch > 0) {
    ring_.resize(static_cast<std::size_t>(o_.prefetch) + 1);
    start_worker();
  }
}

Loader::~Loader() { stop_worker(); }

std::int64_t Loader::batches_per_epoch() const {
  std::int64_t g = o_.global, n = d_.size();
  return o_.drop_last ? n / g : (n + g - 1) / g;
}

const std::vector<std::int64_t>& Loader::permutation(std::int64_t epoch) const {
  if (perm_epoch_ == epoch) return perm_;
  std::int64_t n = d_.size();
  perm_.resize(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) perm_[static_cast<std::size_t>(i)] = i;
  if (o_.shuffle) {
    // Fisher-Yates driven by Philox(seed, stream 2^32 + epoch): the same on every rank.
    PhiloxRng rng(o_.seed, (std::uint64_t{1} << 32) + static_cast<std::uint64_t>(epoch));
    for (std::int64_t i = n - 1; i > 0; --i) {
      auto blk = rng.next_block();
      std::uint64_t r = (std::uint64_t{blk[0]} << 32) | blk[1];
      auto j = static_cast<std::int64_t>(r % static_cast<std::uint64_t>(i + 1));
      std::swap(perm_[static_cast<std::size_t>(i)], perm_[static_cast<std::size_t>(j)]);
    }
  }
  perm_epoch_ = epoch;
  return perm_;
}

std::vector<std::int64_t> Loader::batch_indices(std::int64_t epoch, std::int64_t index) const {
  std::lock_guard<std::mutex> lk(perm_mu_);
  const auto& p = permutation(epoch);
  std::int64_t n = d_.size();
  std::int64_t start = index * o_.global + o_.offset;
  std::int64_t end = std::min(start + o_.batch, n);
  std::vector<std::int64_t> out;
  for (std::int64_t i = start; i < end; ++i) out.push_back(p[static_cast<std::size_t>(i)]);
  return out;
}

namespace {
// One sample, normalized: v * scale + shift (u8 or f32 source).
template <typename T>
void copy_sample(const T* in, float* out, std::int64_t n, float scale, float shift) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]) * scale + shift;
}

// A random crop (pad 2) and flip of a [C, H, W] sample, the same shift for
// every channel.
template <typename T>
void augment_sample(const T* im, float* out, const Shape& cs, std::array<std::uint32_t, 4> blk,
                    float scale, float shift) {
  const std::int64_t c = cs[0], h = cs[1], w = cs[2];
  int dy = static_cast<int>(blk[0] % 5) - 2, dx = static_cast<int>(blk[1] % 5) - 2;
  bool flip = (blk[2] & 1u) != 0;
  for (std::int64_t ch = 0; ch < c; ++ch)
    for (std::int64_t r = 0; r < h; ++r)
      for (std::int64_t col = 0; col < w; ++col) {
        std::int64_t sr = r + dy, sc = (flip ? w - 1 - col : col) + dx;
        float v = (sr >= 0 && sr < h && sc >= 0 && sc < w)
                      ? static_cast<float>(im[(ch * h + sr) * w + sc])
                      : 0.f;
        out[(ch * h + r) * w + col] = v * scale + shift;
      }
}
}  // namespace

void Loader::fill(Batch& b, std::int64_t epoch, std::int64_t index) const {
  std::vector<std::int64_t> idx = batch_indices(epoch, index);
  auto n = static_cast<std::int64_t>(idx.size());
  const Shape cs = d_.sample_shape();
  const std::int64_t per = num_elements(cs);
  if (!b.images.defined() || b.images.shape()[0] != n) {
    Shape bs = cs;
    bs.insert(bs.begin(), n);
    b.images = Tensor::empty(bs, DType::kF32);
    Shape ls = d_.labels.shape();
    ls[0] = n;
    b.labels = Tensor::empty(ls, DType::kI32);
  }
  const std::int64_t lper = d_.labels_per_sample();
  b.epoch = epoch;
  b.index = index;
  const bool u8 = d_.images.dtype() == DType::kU8;
  const std::int32_t* lab = d_.labels.data<std::int32_t>();
  float* dst = b.images.data<float>();
  std::int32_t* y = b.labels.data<std::int32_t>();
  const float scale = 1.f / ((u8 ? 255.f : 1.f) * o_.stddev), shift = -o_.mean / o_.stddev;
  for (std::int64_t s = 0; s < n; ++s) {
    std::int64_t k = idx[static_cast<std::size_t>(s)];
    std::copy_n(lab + k * lper, lper, y + s * lper);
    float* out = dst + s * per;
    if (!o_.augment) {
      if (u8)
        copy_sample(d_.images.data<std::uint8_t>() + k * per, out, per, scale, shift);
      else
        copy_sample(d_.images.data<float>() + k * per, out, per, scale, shift);
      continue;
    }
    // Keyed by (seed, epoch, sample): independent of batch layout and threads.
    PhiloxRng rng(o_.seed ^ 0x5eed0a06u, static_cast<std::uint64_t>(epoch));
    auto blk = rng.block(static_cast<std::uint64_t>(k));
    if (u8)
      augment_sample(d_.images.data<std::uint8_t>() + k * per, out, cs, blk, scale, shift);
    else
      augment_sample(d_.images.data<float>() + k * per, out, cs, blk, scale, shift);
  }
}

void Loader::start_worker() {
  stop_ = false;
  consumed_ = produced_ = 0;
  thread_ = std::thread([this] { worker(); });
}

void Loader::stop_worker() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Loader::worker() {
  const auto slots = static_cast<std::int64_t>(ring_.size());
  const std::int64_t bpe = std::max<std::int64_t>(batches_per_epoch(), 1);
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    // Slot of the batch the consumer holds (consumed_ - 1) stays untouched.
    cv_.wait(lk, [&] { return stop_ || produced_ - consumed_ < slots - 1; });
    if (stop_) return;
    std::int64_t k = produced_;
    lk.unlock();
    std::int64_t pos = base_index_ + k;
    fill(ring_[static_cast<std::size_t>(k % slots)], base_epoch_ + pos / bpe, pos % bpe);
    lk.lock();
    ++produced_;
    cv_.notify_all();
  }
}

void Loader::seek(std::int64_t epoch, std::int64_t index) {
  stop_worker();
  base_epoch_ = next_epoch_ = epoch;
  base_index_ = next_index_ = index;
  if (o_.prefetch > 0) start_worker();
}

const Batch& Loader::next() {
  const std::int64_t bpe = std::max<std::int64_t>(batches_per_epoch(), 1);
  std::int64_t e = next_epoch_, i = next_index_;
  if (++next_index_ >= bpe) {
    next_index_ = 0;
    ++next_epoch_;
  }
  if (o_.prefetch <= 0) {
    fill(current_, e, i);
    return current_;
  }
  std::unique_lock<std::mutex> lk(mu_);
  // Taking batch consumed_ releases the one before it.
  cv_.wait(lk, [&] { return produced_ > consumed_; });
  const Batch& b =
      ring_[static_cast<std::size_t>(consumed_ % static_cast<std::int64_t>(ring_.size()))];
  ++consumed_;
  lk.unlock();
  cv_.notify_all();
  return b;
}

}  // namespace shoal::train
