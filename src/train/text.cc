// Text files into token windows for character-level language models.
#include "shoal/train/text.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>

#include "shoal/core/file.h"

namespace shoal::train {

namespace fs = std::filesystem;

namespace {

// The files a PATH names: itself, or a directory's regular files.
Result<std::vector<std::string>> text_files(const std::string& path) {
  std::error_code ec;
  auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return not_found("--data text:{}: no such file or directory", path);
  if (fs::is_regular_file(st)) return std::vector<std::string>{path};
  if (!fs::is_directory(st))
    return invalid_argument("--data text:{}: not a file or a directory", path);
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    auto ls = e.symlink_status(ec);
    if (ec || !fs::is_regular_file(ls) || e.path().extension() == ".dat") continue;
    out.push_back(e.path().string());
  }
  if (ec) return unavailable("--data text:{}: listing the directory: {}", path, ec.message());
  std::sort(out.begin(), out.end());
  if (out.empty()) return not_found("--data text:{}: the directory holds no text files", path);
  return out;
}

// Windows of `t` (token ids) as samples [N, T] (f32 ids) and labels [N, T].
Dataset windows(const std::vector<std::int32_t>& t, std::int64_t ctx, std::string name,
                const std::string& vocab) {
  Dataset d;
  d.name = std::move(name);
  d.vocab = vocab;
  d.num_classes = static_cast<int>(vocab.size());
  const std::int64_t n = (static_cast<std::int64_t>(t.size()) - 1) / ctx;
  d.images = Tensor::empty({n, ctx}, DType::kF32);
  d.labels = Tensor::empty({n, ctx}, DType::kI32);
  float* x = d.images.data<float>();
  std::int32_t* y = d.labels.data<std::int32_t>();
  for (std::int64_t i = 0; i < n * ctx; ++i) {
    x[i] = static_cast<float>(t[static_cast<std::size_t>(i)]);
    y[i] = t[static_cast<std::size_t>(i + 1)];
  }
  return d;
}

}  // namespace

bool is_text_data(std::string_view data) { return data.starts_with("text:"); }

Result<DataSplits> text_splits(std::string_view text, std::string_view name, const TextOptions& o) {
  if (o.context < 1) return invalid_argument("--context must be >= 1, got {}", o.context);
  if (!(o.validation > 0 && o.validation < 1))
    return invalid_argument("the validation share must be in (0, 1), got {}", o.validation);
  std::array<bool, 256> seen{};
  for (unsigned char c : text) seen[c] = true;
  std::string vocab;
  std::array<std::int32_t, 256> id{};
  for (int c = 0; c < 256; ++c)
    if (seen[static_cast<std::size_t>(c)]) {
      id[static_cast<std::size_t>(c)] = static_cast<std::int32_t>(vocab.size());
      vocab.push_back(static_cast<char>(c));
    }
  const auto len = static_cast<std::int64_t>(text.size());
  const auto val = static_cast<std::int64_t>(static_cast<double>(len) * o.validation);
  // Each split needs one window of context + 1 tokens.
  if (len - val < o.context + 1 || val < o.context + 1)
    return invalid_argument(
        "--data text:{}: {} bytes give {} for training and {} for validation; each needs at "
        "least --context + 1 = {}",
        name, len, len - val, val, o.context + 1);
  std::vector<std::int32_t> train, test;
  train.reserve(static_cast<std::size_t>(len - val));
  test.reserve(static_cast<std::size_t>(val));
  for (std::int64_t i = 0; i < len; ++i)
    (i < len - val ? train : test)
        .push_back(id[static_cast<unsigned char>(text[static_cast<std::size_t>(i)])]);
  DataSplits s;
  s.train = windows(train, o.context, fmt::format("text:{}:train", name), vocab);
  s.test = windows(test, o.context, fmt::format("text:{}:validation", name), vocab);
  return s;
}

Result<DataSplits> load_text(std::string_view spec, const TextOptions& o) {
  if (spec.empty()) return invalid_argument("--data text: needs a path: text:FILE or text:DIR");
  std::string text;
  std::size_t start = 0;
  while (start <= spec.size()) {
    std::size_t comma = spec.find(',', start);
    if (comma == std::string_view::npos) comma = spec.size();
    std::string path(spec.substr(start, comma - start));
    start = comma + 1;
    if (path.empty()) return invalid_argument("--data text:{}: an empty path in the list", spec);
    SHOAL_ASSIGN_OR_RETURN(auto files, text_files(path));
    for (const auto& f : files) {
      SHOAL_ASSIGN_OR_RETURN(std::string bytes, read_file(f));
      text += bytes;
      if (static_cast<std::int64_t>(text.size()) > o.max_bytes)
        return invalid_argument("--data text:{}: more than {} bytes of text (at {})", spec,
                                o.max_bytes, f);
    }
  }
  return text_splits(text, spec, o);
}

double unigram_bits(const Dataset& d) {
  std::vector<double> count(static_cast<std::size_t>(std::max(d.num_classes, 1)), 0.0);
  const std::int32_t* y = d.labels.data<std::int32_t>();
  for (std::int64_t i = 0; i < d.labels.numel(); ++i) count[static_cast<std::size_t>(y[i])] += 1;
  double n = static_cast<double>(d.labels.numel()), h = 0;
  for (double c : count)
    if (c > 0) h -= c / n * std::log2(c / n);
  return h;
}

std::string vocab_to_hex(std::string_view vocab) {
  std::string out;
  for (unsigned char c : vocab) out += fmt::format("{:02x}", c);
  return out;
}

Result<std::string> vocab_from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0) return invalid_argument("vocabulary hex has odd length {}", hex.size());
  std::string out;
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    unsigned v = 0;
    for (std::size_t j = i; j < i + 2; ++j) {
      char c = hex[j];
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return invalid_argument("vocabulary hex: '{}' at {} is not a hex digit", c, j);
      v = v * 16 + static_cast<unsigned>(d);
    }
    out.push_back(static_cast<char>(v));
  }
  return out;
}

}  // namespace shoal::train
