// load_data(): from what --data names to two checked splits.
#include "shoal/train/sources.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "shoal/train/text.h"

namespace shoal::train {

namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kMaxClasses = 65536;

// Labels as i32, each in [0, kMaxClasses); `where` names the array.
Result<Tensor> labels_of(const Tensor& y, std::string_view where) {
  if (y.shape().size() != 1)
    return invalid_argument("{}: labels must be one integer per sample [N], got shape {}", where,
                            shape_str(y.shape()));
  if (is_floating(y.dtype()))
    return invalid_argument("{}: labels must be integers, got {} (use y.astype('int64'))", where,
                            dtype_name(y.dtype()));
  Tensor wide = y.cast(DType::kI64);
  const std::int64_t* v = wide.data<std::int64_t>();
  // The built-in models take their classes from the largest label: a
  // stray 100,000 built a 100,001-class model, 2^24 one that could not be
  // allocated (the Python interpreter aborted).
  for (std::int64_t i = 0; i < y.numel(); ++i)
    if (v[i] < 0 || v[i] >= kMaxClasses)
      return invalid_argument(
          "{}: label {} at index {} is not a class index in [0, {}) (classes are numbered from "
          "0; relabel the data)",
          where, v[i], i, kMaxClasses);
  return wide.cast(DType::kI32);
}

// One NaN pixel makes the normalization's mean NaN and with it every
// input, and training then ends "successfully" at chance: refused here,
// with the first place it occurs.
Status check_finite(const Tensor& x, std::string_view name, std::string_view xs) {
  if (x.dtype() != DType::kF32) return ok_status();
  const float* p = x.data<float>();
  const std::int64_t n = x.numel(), per = n / x.shape()[0];
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i]))
      return invalid_argument(
          "{}: {} holds {} at sample {}, element {} (index {} of {}): inputs must be finite "
          "(clean or impute them first)",
          name, xs, p[i], i / per, i % per, i, n);
  return ok_status();
}

Result<Dataset> split_of(Tensor x, const Tensor& y, std::string_view name, std::string_view xs,
                         std::string_view ys) {
  Dataset d;
  d.name = std::string(name);
  if (x.shape().size() < 2)
    return invalid_argument("{}: samples must be [N, ...] with at least 2 dimensions, got {}", xs,
                            shape_str(x.shape()));
  SHOAL_ASSIGN_OR_RETURN(d.labels, labels_of(y, ys));
  if (x.shape()[0] != d.labels.numel())
    return invalid_argument("{} holds {} samples but {} holds {} labels", xs, x.shape()[0], ys,
                            d.labels.numel());
  if (x.shape()[0] == 0) return invalid_argument("{}: holds no samples (N = 0)", xs);
  if (x.numel() == 0)
    return invalid_argument("{}: samples of shape {} hold no values (a dimension is 0)", xs,
                            shape_str(x.shape()));
  d.images = x.dtype() == DType::kU8 ? std::move(x) : x.cast(DType::kF32);
  SHOAL_RETURN_IF_ERROR(check_finite(d.images, name, xs));
  return d;
}

std::int32_t max_label(const Dataset& d) {
  const std::int32_t* p = d.labels.data<std::int32_t>();
  return *std::max_element(p, p + d.labels.numel());
}

// Both splits: same sample shape and element type; classes from the labels
// unless already set.
Status check_pair(DataSplits& s, std::string_view what, int classes) {
  if (s.train.sample_shape() != s.test.sample_shape())
    return invalid_argument("{}: training samples are {} but test samples are {}", what,
                            shape_str(s.train.sample_shape()), shape_str(s.test.sample_shape()));
  if (s.train.images.dtype() != s.test.images.dtype())
    return invalid_argument("{}: training samples are {} but test samples are {}", what,
                            dtype_name(s.train.images.dtype()), dtype_name(s.test.images.dtype()));
  if (classes == 0) classes = std::max(max_label(s.train), max_label(s.test)) + 1;
  if (classes < 2)
    return invalid_argument("{}: the labels name {} class; training needs at least 2", what,
                            classes);
  s.train.num_classes = s.test.num_classes = classes;
  return ok_status();
}

Result<DataSplits> from_npz(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(auto arrays, read_npz(path));
  std::vector<std::string> names;
  for (const auto& [n, t] : arrays) names.push_back(n);
  auto get = [&](const std::string& key) -> Result<Tensor> {
    for (const auto& [n, t] : arrays)
      if (n == key) return t;
    return invalid_argument(
        "{}: no array '{}' (found [{}]; Shoal reads x_train, y_train, x_test, y_test as "
        "np.savez writes them)",
        path, key, fmt::join(names, ", "));
  };
  SHOAL_ASSIGN_OR_RETURN(Tensor xtr, get("x_train"));
  SHOAL_ASSIGN_OR_RETURN(Tensor ytr, get("y_train"));
  SHOAL_ASSIGN_OR_RETURN(Tensor xte, get("x_test"));
  SHOAL_ASSIGN_OR_RETURN(Tensor yte, get("y_test"));
  return make_splits(xtr, ytr, xte, yte, fs::path(path).stem().string());
}

Result<DataSplits> from_npy_dir(const std::string& dir) {
  std::vector<Tensor> a;
  for (const char* n : {"x_train", "y_train", "x_test", "y_test"}) {
    SHOAL_ASSIGN_OR_RETURN(Tensor t,
                           read_npy((fs::path(dir) / (std::string(n) + ".npy")).string()));
    a.push_back(std::move(t));
  }
  return make_splits(a[0], a[1], a[2], a[3], fs::path(dir).filename().string());
}

Result<DataSplits> from_image_folders(const std::string& dir) {
  std::error_code ec;
  std::string test;
  for (const char* n : {"test", "val"})
    if (test.empty() && fs::is_directory(fs::path(dir) / n, ec)) test = n;
  if (test.empty())
    return not_found(
        "{}: has train/ but neither test/ nor val/ (one class folder per class in each)", dir);
  DataSplits s;
  std::vector<std::string> classes;
  SHOAL_ASSIGN_OR_RETURN(s.train,
                         load_image_folder((fs::path(dir) / "train").string(), {}, &classes));
  SHOAL_ASSIGN_OR_RETURN(s.test,
                         load_image_folder((fs::path(dir) / test).string(), classes, nullptr));
  s.train.name = fs::path(dir).filename().string() + ":train";
  s.test.name = fs::path(dir).filename().string() + ":" + test;
  SHOAL_RETURN_IF_ERROR(check_pair(s, dir, static_cast<int>(classes.size())));
  return s;
}

}  // namespace

Result<DataSplits> make_splits(Tensor x_train, Tensor y_train, Tensor x_test, Tensor y_test,
                               std::string_view name) {
  DataSplits s;
  SHOAL_ASSIGN_OR_RETURN(s.train, split_of(std::move(x_train), y_train,
                                           fmt::format("{}:train", name), "x_train", "y_train"));
  SHOAL_ASSIGN_OR_RETURN(s.test, split_of(std::move(x_test), y_test, fmt::format("{}:test", name),
                                          "x_test", "y_test"));
  auto st = check_pair(s, name, 0);
  if (!st.ok()) return st;
  return s;
}

Result<DataSplits> load_data(const std::string& data, std::int64_t context) {
  if (is_text_data(data)) {
    TextOptions o;
    o.context = context;
    return load_text(std::string_view(data).substr(5), o);
  }
  std::error_code ec;
  if (data.ends_with(".npz")) {
    if (!fs::is_regular_file(data, ec)) return not_found("--data {}: no such file", data);
    return from_npz(data);
  }
  if (fs::is_directory(data, ec)) {
    if (fs::exists(fs::path(data) / "x_train.npy", ec)) return from_npy_dir(data);
    if (fs::is_directory(fs::path(data) / "train", ec)) return from_image_folders(data);
  }
  SHOAL_ASSIGN_OR_RETURN(std::string dir, resolve_data_dir(data));
  DataSplits s;
  auto tr = load_idx_dataset(dir, "train");
  // Some IDX files but not all: name the one missing, not every format.
  auto holds_idx = [&] {
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().filename().string().find("-ubyte") != std::string::npos) return true;
    return false;
  };
  if (!tr.ok() && tr.status().code() == StatusCode::kNotFound && holds_idx())
    return tr.status().with_context(fmt::format("--data {}", data));
  if (!tr.ok() && tr.status().code() == StatusCode::kNotFound)
    return not_found(
        "--data {}: no dataset found: expected IDX files (train-images-idx3-ubyte...), NumPy "
        "arrays (x_train.npy, y_train.npy, x_test.npy, y_test.npy), or image folders "
        "(train/<class>/*.png and test/<class>/...)",
        data);
  if (!tr.ok()) return tr.status();
  s.train = std::move(tr).value();
  SHOAL_ASSIGN_OR_RETURN(s.test, load_idx_dataset(dir, "t10k"));
  return s;
}

}  // namespace shoal::train
