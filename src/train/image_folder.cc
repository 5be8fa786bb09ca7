// A directory of images, one subfolder per class (torchvision's
// ImageFolder): classes are the subfolder names in sorted order, images the
// PNG, JPEG, BMP, GIF or PPM/PGM files in them (by extension; other files
// are skipped), decoded by Debian's libstb into u8 [N, C, H, W].
#include <stb/stb_image.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "shoal/core/file.h"
#include "shoal/train/sources.h"

namespace shoal::train {

namespace fs = std::filesystem;

namespace {

bool is_image(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* x : {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".pgm"})
    if (e == x) return true;
  return false;
}

struct Decoded {
  int w = 0, h = 0, c = 0;           // c: 1 (grey) or 3 (colour), as the file has it
  std::vector<std::uint8_t> pixels;  // HWC, c channels
  std::string error;
};

Decoded decode(const std::string& path) {
  Decoded d;
  auto raw = read_file(path);
  if (!raw.ok()) {
    d.error = raw.status().message();
    return d;
  }
  const auto* bytes = reinterpret_cast<const stbi_uc*>(raw->data());
  int len = static_cast<int>(raw->size());
  int w = 0, h = 0, c = 0;
  if (!stbi_info_from_memory(bytes, len, &w, &h, &c)) {
    d.error = fmt::format("{}: not a readable image: {}", path, stbi_failure_reason());
    return d;
  }
  int want = c >= 3 ? 3 : 1;  // alpha dropped
  stbi_uc* px = stbi_load_from_memory(bytes, len, &w, &h, &c, want);
  if (px == nullptr) {
    d.error = fmt::format("{}: cannot decode: {}", path, stbi_failure_reason());
    return d;
  }
  d.w = w;
  d.h = h;
  d.c = want;
  d.pixels.assign(px, px + static_cast<std::size_t>(w) * h * want);
  stbi_image_free(px);
  return d;
}

// HWC with `from` channels to CHW with `to` (1 -> 3 repeats the grey).
void to_chw(const Decoded& d, int to, std::uint8_t* out) {
  const std::int64_t hw = static_cast<std::int64_t>(d.h) * d.w;
  for (int ch = 0; ch < to; ++ch) {
    int src = d.c == 1 ? 0 : ch;
    for (std::int64_t i = 0; i < hw; ++i) out[ch * hw + i] = d.pixels[i * d.c + src];
  }
}

}  // namespace

Result<Dataset> load_image_folder(const std::string& dir, const std::vector<std::string>& classes,
                                  std::vector<std::string>* found_classes) {
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && e.path().filename().string().front() != '.')
      names.push_back(e.path().filename().string());
  if (ec) return not_found("{}: cannot list the folder: {}", dir, ec.message());
  std::sort(names.begin(), names.end());
  if (names.empty())
    return invalid_argument("{}: no class folders (expected {}/<class>/<image files>)", dir, dir);
  // A test split may hold some of the training split's classes (labels by
  // name, so each keeps its training index) and empty class folders; a
  // class the training split does not have is an error naming it.
  const bool test = !classes.empty();
  std::vector<std::string> files;
  std::vector<std::int32_t> labels;
  for (std::size_t k = 0; k < names.size(); ++k) {
    const std::string& name = names[k];
    const auto known = std::find(classes.begin(), classes.end(), name);
    if (test && known == classes.end())
      return invalid_argument("{}/{}: a class the training split does not have (its classes: [{}])",
                              dir, name, fmt::join(classes, ", "));
    const auto label = static_cast<std::int32_t>(test ? known - classes.begin() : k);
    std::vector<std::string> in_class;
    for (const auto& e : fs::directory_iterator(fs::path(dir) / name, ec))
      if (e.is_regular_file() && is_image(e.path())) in_class.push_back(e.path().string());
    if (in_class.empty() && !test)
      return invalid_argument("{}/{}: the class folder holds no PNG/JPEG/BMP/GIF/PPM images", dir,
                              name);
    std::sort(in_class.begin(), in_class.end());
    files.insert(files.end(), in_class.begin(), in_class.end());
    labels.insert(labels.end(), in_class.size(), label);
  }
  if (files.empty())
    return invalid_argument("{}: no PNG/JPEG/BMP/GIF/PPM images in any class folder", dir);
  const auto n = static_cast<std::int64_t>(files.size());
  std::vector<Decoded> img(files.size());
#pragma omp parallel for schedule(dynamic, 16)
  for (std::int64_t i = 0; i < n; ++i) img[static_cast<std::size_t>(i)] = decode(files[i]);
  int channels = 1;
  for (std::size_t i = 0; i < img.size(); ++i) {
    if (!img[i].error.empty()) return invalid_argument("{}", img[i].error);
    if (img[i].w != img[0].w || img[i].h != img[0].h)
      return invalid_argument(
          "{}: the image is {}x{} but {} is {}x{}; all images must have one size (resize them "
          "first)",
          files[i], img[i].w, img[i].h, files[0], img[0].w, img[0].h);
    channels = std::max(channels, img[i].c);
  }
  Dataset d;
  d.name = fs::path(dir).filename().string();
  d.num_classes = static_cast<int>(test ? classes.size() : names.size());
  const std::int64_t per = std::int64_t{channels} * img[0].h * img[0].w;
  d.images = Tensor::empty({n, channels, img[0].h, img[0].w}, DType::kU8);
  d.labels = Tensor::empty({n}, DType::kI32);
  for (std::int64_t i = 0; i < n; ++i) {
    to_chw(img[static_cast<std::size_t>(i)], channels, d.images.data<std::uint8_t>() + i * per);
    d.labels.data<std::int32_t>()[i] = labels[static_cast<std::size_t>(i)];
  }
  if (found_classes) *found_classes = names;
  return d;
}

}  // namespace shoal::train
