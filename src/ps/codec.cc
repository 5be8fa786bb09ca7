#include "shoal/ps/codec.h"

#include <cmath>
#include <cstring>

#include "shoal/tensor/dtype.h"

namespace shoal::ps {

const char* codec_name(Codec c) {
  switch (c) {
    case Codec::kF32:
      return "f32";
    case Codec::kF16:
      return "f16";
    case Codec::kBF16:
      return "bf16";
    case Codec::kTwoBit:
      return "2bit";
  }
  return "?";
}

namespace {

Result<Codec> parse_half(const std::string& s, const std::string& whole) {
  if (s == "none" || s == "f32") return Codec::kF32;
  if (s == "f16") return Codec::kF16;
  if (s == "bf16") return Codec::kBF16;
  return invalid_argument(
      "--ps-compress '{}': '{}' is not one of none, f16, bf16, 2bit:THRESHOLD[,f16|bf16]", whole,
      s);
}

}  // namespace

Result<Compression> parse_compression(const std::string& s) {
  Compression c;
  if (s.rfind("2bit", 0) != 0) {
    SHOAL_ASSIGN_OR_RETURN(c.push, parse_half(s, s));
    c.pull = c.push;
    return c;
  }
  const std::size_t colon = s.find(':');
  if (colon != 4)
    return invalid_argument("--ps-compress '{}': 2bit needs a threshold, as in 2bit:0.005", s);
  const std::size_t comma = s.find(',', colon);
  const std::string t = s.substr(colon + 1, comma == std::string::npos ? comma : comma - colon - 1);
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (t.empty() || *end != '\0' || !(v > 0) || !std::isfinite(v) || v > 1e6)
    return invalid_argument("--ps-compress '{}': threshold '{}' is not a number in (0, 1e6]", s, t);
  c.push = Codec::kTwoBit;
  c.threshold = static_cast<float>(v);
  if (comma != std::string::npos) {
    SHOAL_ASSIGN_OR_RETURN(c.pull, parse_half(s.substr(comma + 1), s));
  }
  return c;
}

std::string compression_text(const Compression& c) {
  if (c.push == Codec::kTwoBit) {
    std::string out = fmt::format("2bit:{}", c.threshold);
    if (c.pull != Codec::kF32) out += fmt::format(",{}", codec_name(c.pull));
    return out;
  }
  return c.push == Codec::kF32 ? "none" : codec_name(c.push);
}

std::uint64_t codec_payload_bytes(Codec c, std::uint64_t n) {
  switch (c) {
    case Codec::kF32:
      return 4 * n;
    case Codec::kF16:
    case Codec::kBF16:
      return 2 * n;
    case Codec::kTwoBit:
      return (n + 3) / 4;
  }
  return 0;
}

void append_coded(std::string& out, const float* x, std::uint64_t n, Codec c, float threshold) {
  out.push_back(static_cast<char>(c));
  const std::size_t at = out.size() + (c == Codec::kTwoBit ? 4 : 0);
  if (c == Codec::kTwoBit) {
    char b[4];
    std::memcpy(b, &threshold, 4);
    out.append(b, 4);
  }
  out.resize(at + codec_payload_bytes(c, n));
  char* p = out.data() + at;
  switch (c) {
    case Codec::kF32:
      std::memcpy(p, x, 4 * n);
      break;
    case Codec::kF16:
      for (std::uint64_t i = 0; i < n; ++i) {
        const std::uint16_t h = float_to_f16(x[i]).bits;
        std::memcpy(p + 2 * i, &h, 2);
      }
      break;
    case Codec::kBF16:
      for (std::uint64_t i = 0; i < n; ++i) {
        const std::uint16_t h = float_to_bf16(x[i]).bits;
        std::memcpy(p + 2 * i, &h, 2);
      }
      break;
    case Codec::kTwoBit: {
      const float half = threshold / 2;
      for (std::uint64_t i = 0; i < n; ++i) {
        const unsigned code = x[i] >= half ? 1u : x[i] <= -half ? 2u : 0u;
        p[i / 4] =
            static_cast<char>(static_cast<unsigned char>(p[i / 4]) | (code << (2 * (i % 4))));
      }
      break;
    }
  }
}

Result<std::size_t> decode_coded(std::string_view in, std::uint64_t n, float* dst) {
  if (in.empty()) return invalid_argument("coded tensor: no codec byte");
  const auto c = static_cast<Codec>(static_cast<unsigned char>(in[0]));
  if (static_cast<unsigned>(c) > 3)
    return invalid_argument("coded tensor: unknown codec {}", static_cast<unsigned>(c));
  std::size_t at = 1;
  float t = 0;
  if (c == Codec::kTwoBit) {
    if (in.size() < 5) return invalid_argument("coded tensor: 2bit without its threshold");
    std::memcpy(&t, in.data() + 1, 4);
    if (!(t > 0) || !std::isfinite(t))
      return invalid_argument("coded tensor: 2bit threshold {} is not a positive number", t);
    at = 5;
  }
  const std::uint64_t need = codec_payload_bytes(c, n);
  if (need > in.size() - at)
    return invalid_argument("coded tensor: {} elements in {} need {} bytes, {} are left", n,
                            codec_name(c), need, in.size() - at);
  const char* p = in.data() + at;
  switch (c) {
    case Codec::kF32:
      std::memcpy(dst, p, 4 * n);
      break;
    case Codec::kF16:
      for (std::uint64_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = f16_to_float(F16{h});
      }
      break;
    case Codec::kBF16:
      for (std::uint64_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_float(BF16{h});
      }
      break;
    case Codec::kTwoBit:
      for (std::uint64_t i = 0; i < n; ++i) {
        const unsigned code = (static_cast<unsigned char>(p[i / 4]) >> (2 * (i % 4))) & 3u;
        if (code == 3)
          return invalid_argument("coded tensor: 2bit element {} has the unused code 3", i);
        dst[i] = code == 1 ? t : code == 2 ? -t : 0.f;
      }
      break;
  }
  return at + need;
}

Status ErrorFeedback::quantize(const std::string& key, const Tensor& grad, Tensor& q) {
  Tensor& r = residual_[key];
  if (!r.defined()) r = Tensor::zeros(grad.shape(), DType::kF32);
  if (r.shape() != grad.shape() || q.shape() != grad.shape())
    return invalid_argument("2bit push of '{}': gradient {}, residual {}, output {}", key,
                            shape_str(grad.shape()), shape_str(r.shape()), shape_str(q.shape()));
  const Tensor g = grad.contiguous();
  const float* gp = g.data<float>();
  float* rp = r.data<float>();
  float* qp = q.data<float>();
  const std::int64_t n = g.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = gp[i] + rp[i];
    const float s = v >= t_ ? t_ : v <= -t_ ? -t_ : 0.f;
    qp[i] = s;
    rp[i] = v - s;
  }
  return ok_status();
}

Status ErrorFeedback::restore(const std::map<std::string, Tensor>& r) {
  for (const auto& [k, v] : r) {
    if (v.dtype() != DType::kF32)
      return invalid_argument("2bit residual of '{}': {}, expected f32", k, dtype_name(v.dtype()));
    residual_[k] = v.contiguous().clone();
  }
  return ok_status();
}

}  // namespace shoal::ps
