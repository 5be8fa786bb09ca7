// Where training data comes from, beyond IDX files: NumPy arrays (.npy
// files or one .npz archive, the layout Keras's datasets use) and a
// directory of images with one subfolder per class (torchvision's
// ImageFolder layout), decoded with Debian's libstb. load_data() picks the
// format from what `--data` names and returns both splits, checked to agree
// with each other: sample shape, element type, classes.
//
//   --data fashion-mnist | mnist        Debian's dataset packages (IDX)
//   --data DIR                          IDX files ({train,t10k}-images-idx3-ubyte...)
//   --data DIR                          x_train.npy y_train.npy x_test.npy y_test.npy
//   --data FILE.npz                     arrays x_train y_train x_test y_test
//   --data DIR                          DIR/train/<class>/*.png|jpg, DIR/test (or val)/<class>/...
//   --data text:PATH[,PATH...]          text files: characters as tokens (train/text.h)
//
// Samples: u8 arrays are pixels (scaled by 1/255 at load time), any other
// number type becomes f32 features. Labels: integers in [0, classes), the
// classes being the largest label + 1 over both splits (NumPy) or the class
// folders in sorted order (images).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shoal/core/status.h"
#include "shoal/tensor/tensor.h"
#include "shoal/train/data.h"

namespace shoal::train {

struct DataSplits {
  Dataset train, test;
};

// Reads the training and test splits `data` names (see above). Errors name
// the file or folder and what was expected. `context` is the tokens per
// sample of text data (the GPT's --context); other data ignore it.
Result<DataSplits> load_data(const std::string& data, std::int64_t context = 64);

// Builds the splits from arrays already in memory (the Python bindings):
// images u8 or any number type (-> f32) with N first, labels integers [N].
Result<DataSplits> make_splits(Tensor x_train, Tensor y_train, Tensor x_test, Tensor y_test,
                               std::string_view name);

// One NumPy array: .npy version 1-3, little-endian bool, int, uint or
// float of 1-8 bytes, C order, as a tensor of the nearest Shoal type (u8,
// i32, i64, f16, f32, f64; bool as u8). `where` names it in errors.
Result<Tensor> parse_npy(std::string_view bytes, std::string_view where);
Result<Tensor> read_npy(const std::string& path);
// Every array of an .npz archive (stored or deflated), by name without ".npy".
Result<std::vector<std::pair<std::string, Tensor>>> read_npz(const std::string& path);

// A directory with one subfolder per class; every image must have the size
// of the first, and a grey image among colour ones is widened to RGB.
// `classes` (when not empty) must be the class folders found.
Result<Dataset> load_image_folder(const std::string& dir, const std::vector<std::string>& classes,
                                  std::vector<std::string>* found_classes);

}  // namespace shoal::train
