// Character-level language-modeling data: `--data text:PATH[,PATH...]`.
// Each PATH is a text file, or a directory whose regular files are read in
// name order (symbolic links and fortune's ".dat" index files skipped, so
// Debian's /usr/share/games/fortunes reads as its text). The bytes are the
// characters: the vocabulary is the distinct bytes in sorted order (so a
// UTF-8 letter outside ASCII is two or three tokens), and both splits share
// it. The first 90% of the text trains, the last 10% validates; each split
// is cut into windows of `context` tokens whose labels are the same window
// shifted by one (sample i: x = t[iT, iT+T), y = t[iT+1, iT+T+1)).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "shoal/core/status.h"
#include "shoal/train/sources.h"

namespace shoal::train {

// True for "text:..." (the prefix load_data dispatches on).
bool is_text_data(std::string_view data);

struct TextOptions {
  std::int64_t context = 64;           // tokens per sample
  double validation = 0.1;             // share of the text, taken from its end
  std::int64_t max_bytes = 1LL << 30;  // refuse larger corpora (memory: 8 bytes per token)
};

// `spec` without the "text:" prefix: comma-separated files or directories.
Result<DataSplits> load_text(std::string_view spec, const TextOptions& o);

// The splits of text already in memory (tests, Python); `name` labels it.
Result<DataSplits> text_splits(std::string_view text, std::string_view name, const TextOptions& o);

// Entropy in bits per token of the training labels' token frequencies: the
// loss a model that ignores context cannot beat.
double unigram_bits(const Dataset& d);

// The vocabulary as hex (two digits per byte) for checkpoint metadata, and back.
std::string vocab_to_hex(std::string_view vocab);
Result<std::string> vocab_from_hex(std::string_view hex);

}  // namespace shoal::train
