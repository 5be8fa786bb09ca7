// Datasets and the loader. IDX files (the MNIST / Fashion-MNIST format,
// optionally gzip-compressed) are read whole and checked: magic, type code,
// dimensions and sizes, with errors that name the file and the field (the
// other formats, NumPy and image folders, are in train/sources.h). The
// Loader turns a Dataset into normalized f32 batches: a per-epoch
// permutation drawn from a seed, optional crop/flip augmentation keyed by
// (seed, epoch, sample) so results do not depend on threads, a prefetch
// thread, and a (rank, world) shard of one shared permutation for data
// parallelism. A Loader is used by one consumer thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shoal/core/status.h"
#include "shoal/tensor/tensor.h"

namespace shoal::train {

// One IDX file: element type u8 (the only one the datasets use; others are
// refused by name) and its dimensions.
struct IdxArray {
  Shape dims;
  std::vector<std::uint8_t> data;
};
Result<IdxArray> read_idx(const std::string& path);
// Parses an IDX image already in memory (decompressed); `where` names it.
Result<IdxArray> parse_idx(std::string_view bytes, std::string_view where);

// Samples and their classes. Images are u8 (pixels, scaled by 1/255) or
// f32 (features, taken as they are): [N, H, W] (one channel, as IDX files
// hold them), [N, C, H, W], or [N, F] and other shapes a model flattens.
struct Dataset {
  std::string name;  // "fashion-mnist:train"
  Tensor images;     // u8 or f32 [N, ...]
  Tensor labels;     // i32 [N] (or [N, T]: one class per token), each in [0, num_classes)
  int num_classes = 10;
  // Token datasets (train/text.h): the images are token ids held as f32
  // (exact below 2^24), passed to the model as they are, and vocab[id] is
  // the byte token id stands for. Empty for every other dataset.
  std::string vocab;
  bool tokens() const { return !vocab.empty(); }
  std::int64_t size() const { return labels.defined() ? labels.shape()[0] : 0; }
  // Labels per sample: 1, or T for a token dataset.
  std::int64_t labels_per_sample() const { return size() ? labels.numel() / size() : 1; }
  // One sample as the model sees it: [N, H, W] data gives [1, H, W].
  Shape sample_shape() const;
  std::int64_t sample_numel() const { return num_elements(sample_shape()); }
  // The first n samples (all when n <= 0 or n >= size()).
  Dataset take_first(std::int64_t n) const;
};

// Finds the directory for `data`: an existing directory is used as given;
// "fashion-mnist" and "mnist" are looked up under $SHOAL_DATA_DIR and
// /usr/share/datasets (Debian's dataset-fashion-mnist). The error lists
// where it looked and how to install the package.
Result<std::string> resolve_data_dir(const std::string& data);
// Loads split "train" or "t10k" from dir ({split}-images-idx3-ubyte[.gz]
// and {split}-labels-idx1-ubyte[.gz], or the dotted MNIST names). Every
// label must be a class in [0, num_classes) (10 for MNIST and
// Fashion-MNIST); one outside is an error naming the file, index and value.
Result<Dataset> load_idx_dataset(const std::string& dir, const std::string& split,
                                 int num_classes = 10);

struct LoaderOptions {
  std::int64_t batch = 64;
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool augment = false;     // random crop (pad 2) and horizontal flip ([C, H, W] samples)
  int prefetch = 2;         // batches prepared ahead by the worker thread; 0 = none
  int rank = 0, world = 1;  // shard of each global batch (batch * world samples)
  // Samples per global batch and where this rank's `batch` of them start
  // (0: batch * world and rank * batch; uneven shares give both).
  std::int64_t global = 0, offset = 0;
  float mean = 0.f, stddev = 1.f;  // x = (pixel/255 - mean) / stddev; f32 data: (v - mean) / stddev
  bool drop_last = true;           // false: a final smaller batch (eval)
};

// Mean and standard deviation over a dataset of pixel/255 (u8) or of the
// values themselves (f32); (0, 1) for token datasets, whose ids are not
// normalized.
std::pair<float, float> pixel_stats(const Dataset& d);

struct Batch {
  Tensor images;                      // f32 [b, ...sample_shape()]
  Tensor labels;                      // i32 [b] or [b, T]
  std::int64_t epoch = 0, index = 0;  // batch `index` of `epoch`
};

class Loader {
 public:
  Loader(const Dataset& d, LoaderOptions o);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Batches per epoch for this rank (the same on every rank: the tail that
  // does not fill a global batch is dropped when drop_last).
  std::int64_t batches_per_epoch() const;
  // Positions the loader at batch `index` of `epoch` (resume); the next
  // call to next() returns it.
  void seek(std::int64_t epoch, std::int64_t index);
  // The next batch, valid until the following call. Crosses epochs.
  const Batch& next();
  // Sample indices (into the dataset) of batch `index` of `epoch` for this
  // rank; a pure function of (seed, epoch, rank, world).
  std::vector<std::int64_t> batch_indices(std::int64_t epoch, std::int64_t index) const;

 private:
  void fill(Batch& b, std::int64_t epoch, std::int64_t index) const;
  const std::vector<std::int64_t>& permutation(std::int64_t epoch) const;
  void start_worker();
  void stop_worker();
  void worker();

  const Dataset& d_;
  LoaderOptions o_;
  mutable std::int64_t perm_epoch_ = -1;
  mutable std::vector<std::int64_t> perm_;
  mutable std::mutex perm_mu_;
  // Ring of prepared batches: the worker fills slots [head, head+prefetch).
  std::vector<Batch> ring_;
  std::int64_t next_epoch_ = 0, next_index_ = 0;  // what next() returns next
  std::int64_t consumed_ = 0, produced_ = 0;      // ring counters
  std::int64_t base_epoch_ = 0, base_index_ = 0;  // position of counter 0
  bool stop_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
  Batch current_;
};

}  // namespace shoal::train
