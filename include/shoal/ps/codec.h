// How a tensor's values travel between workers and parameter servers
// (issue 14): f32 as they are; f16 or bf16 (half the bytes, rounded to
// nearest); or two bits per element for gradients, MXNet's "2bit" scheme:
// each element is -t, 0 or +t for a threshold t, and what a worker could
// not send stays behind in its residual (error feedback), added to the
// next gradient of the same key. Servers always keep f32 master weights:
// a compressed push is widened before the optimizer sees it.
//
// On the wire a coded tensor's data is: codec:u8, then for kTwoBit the
// threshold:f32, then the payload (f32: 4n bytes, f16/bf16: 2n, two-bit:
// ceil(n/4) bytes, element i in bits 2*(i%4) of byte i/4: 0 = 0, 1 = +t,
// 2 = -t; 3 is refused).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "shoal/core/status.h"
#include "shoal/tensor/tensor.h"

namespace shoal::ps {

enum class Codec : std::uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kTwoBit = 3 };
const char* codec_name(Codec c);

// The job's choice: what pushes and pulls carry.
struct Compression {
  Codec push = Codec::kF32;
  Codec pull = Codec::kF32;  // never kTwoBit: weights are not quantized
  float threshold = 0;       // kTwoBit pushes
  bool operator==(const Compression&) const = default;
};
// "none", "f16", "bf16" (both directions), "2bit:T" (pushes in two bits
// with threshold T > 0, pulls f32) or "2bit:T,bf16" (pulls bf16). Errors
// name the text and what is allowed.
Result<Compression> parse_compression(const std::string& s);
std::string compression_text(const Compression& c);

// Payload bytes of n elements (after the codec byte and threshold).
std::uint64_t codec_payload_bytes(Codec c, std::uint64_t n);

// Appends codec, threshold (two-bit) and payload for n f32 values. Two-bit
// rounds each value to the nearest of -t, 0, +t: exact for what
// ErrorFeedback::quantize produced.
void append_coded(std::string& out, const float* x, std::uint64_t n, Codec c, float threshold);

// Reads one coded payload of n elements at the front of `in` into `dst`
// (n f32); returns the bytes used. Errors name the codec and the problem
// (unknown codec, too few bytes, a two-bit code 3, a bad threshold).
Result<std::size_t> decode_coded(std::string_view in, std::uint64_t n, float* dst);

// Error feedback for two-bit pushes, kept per key on the sender: quantize()
// sends q = round(g + r) and keeps r' = g + r - q, so that over any number
// of pushes the sum of what was sent equals the sum of the gradients minus
// the residual left behind: nothing is lost, only delayed.
class ErrorFeedback {
 public:
  explicit ErrorFeedback(float threshold) : t_(threshold) {}
  // Writes q (values -t, 0, +t) for `grad` into `q` (same shape, f32). A
  // restored residual of another shape is an error naming both.
  Status quantize(const std::string& key, const Tensor& grad, Tensor& q);
  float threshold() const { return t_; }
  // Per key; saved with the worker's checkpoints and restored from them.
  const std::map<std::string, Tensor>& residuals() const { return residual_; }
  Status restore(const std::map<std::string, Tensor>& r);

 private:
  float t_;
  std::map<std::string, Tensor> residual_;
};

}  // namespace shoal::ps
