#include "shoal/train/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <filesystem>

#include "shoal/core/env.h"
#include "shoal/core/file.h"
#include "shoal/core/logging.h"
#include "shoal/tensor/safetensors.h"

namespace shoal::train {
namespace fs = std::filesystem;

std::int64_t CheckpointState::get_int(const std::string& key, std::int64_t dflt) const {
  auto it = meta.find(key);
  if (it == meta.end()) return dflt;
  auto v = env::parse_int(it->second, key);
  return v.ok() ? *v : dflt;
}

std::uint32_t checkpoint_crc(const std::map<std::string, Tensor>& tensors) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto& [name, t] : tensors) {
    crc = crc32(crc, reinterpret_cast<const Bytef*>(name.data()), static_cast<uInt>(name.size()));
    Tensor c = t.contiguous();
    const auto* p = static_cast<const Bytef*>(c.raw_data());
    std::size_t n = c.nbytes();
    while (n > 0) {  // crc32 takes uInt lengths
      auto chunk = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
      crc = crc32(crc, p, chunk);
      p += chunk;
      n -= chunk;
    }
  }
  return static_cast<std::uint32_t>(crc);
}

Status save_checkpoint(const std::string& path, const CheckpointState& s) {
  std::vector<std::pair<std::string, Tensor>> list(s.tensors.begin(), s.tensors.end());
  std::map<std::string, std::string> meta = s.meta;
  meta["format"] = kCheckpointFormat;
  meta["crc32"] = fmt::format("{:08x}", checkpoint_crc(s.tensors));
  return write_safetensors(path, list, meta);
}

Result<CheckpointState> load_checkpoint(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return load_sharded_checkpoint(path);
  SHOAL_ASSIGN_OR_RETURN(SafetensorsFile f, read_safetensors(path));
  auto fmt_it = f.metadata.find("format");
  if (fmt_it == f.metadata.end() || fmt_it->second != kCheckpointFormat)
    return invalid_argument("{}: not a Shoal checkpoint (metadata format is '{}', expected '{}')",
                            path, fmt_it == f.metadata.end() ? "" : fmt_it->second,
                            kCheckpointFormat);
  CheckpointState s;
  for (auto& [name, t] : f.tensors) s.tensors[name] = t;
  s.meta = f.metadata;
  auto crc_it = s.meta.find("crc32");
  if (crc_it == s.meta.end()) return invalid_argument("{}: metadata has no crc32", path);
  std::string have = fmt::format("{:08x}", checkpoint_crc(s.tensors));
  if (have != crc_it->second)
    return data_loss(
        "{}: checksum mismatch (metadata crc32 {}, tensors hash to {}): the file "
        "is corrupted",
        path, crc_it->second, have);
  return s;
}

Result<std::string> CheckpointDir::save(std::int64_t step, const CheckpointState& s) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return unavailable("creating checkpoint directory {}: {}", dir_, ec.message());
  std::string path = (fs::path(dir_) / fmt::format("ckpt-{:010d}.safetensors", step)).string();
  SHOAL_RETURN_IF_ERROR(save_checkpoint(path, s));
  prune();
  return path;
}

std::string CheckpointDir::partial(std::int64_t step) const {
  return (fs::path(dir_) / fmt::format("ckpt-{:010d}.partial", step)).string();
}

Result<std::string> CheckpointDir::publish(std::int64_t step) {
  std::string path = (fs::path(dir_) / fmt::format("ckpt-{:010d}", step)).string();
  std::error_code ec;
  fs::remove_all(path, ec);  // a checkpoint of the same step from an earlier run
  fs::rename(partial(step), path, ec);
  if (ec) return unavailable("renaming {} to {}: {}", partial(step), path, ec.message());
  prune();
  return path;
}

void CheckpointDir::clean() const {
  if (int n = remove_dead_temporaries(dir_); n > 0)
    SHOAL_LOG_INFO("removed {} temporary file{} of checkpoint writers that died in {}", n,
                   n == 1 ? "" : "s", dir_);
}

void CheckpointDir::prune() const {
  clean();
  auto all = list();
  std::error_code ec;
  for (std::size_t i = static_cast<std::size_t>(std::max(keep_, 1)); i < all.size(); ++i)
    fs::remove_all(all[i], ec);
}

std::vector<std::string> CheckpointDir::list() const {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return out;
  // ckpt-<10 digits>.safetensors files and ckpt-<10 digits>/ directories
  // (no <regex>: GCC 12 warns inside it under sanitizers)
  auto is_ckpt = [](const std::string& f, bool dir) {
    const std::string pre = "ckpt-", suf = dir ? "" : ".safetensors";
    if (f.size() != pre.size() + 10 + suf.size() || f.rfind(pre, 0) != 0 ||
        f.compare(pre.size() + 10, suf.size(), suf) != 0)
      return false;
    return std::all_of(f.begin() + 5, f.begin() + 15, [](char c) { return c >= '0' && c <= '9'; });
  };
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (is_ckpt(e.path().filename().string(), e.is_directory(ec))) out.push_back(e.path().string());
  // Zero-padded step: lexical order is step order (a file and a directory of
  // one step: the directory, "ckpt-N" < "ckpt-N.safetensors", comes second).
  std::sort(out.rbegin(), out.rend());
  return out;
}

Result<std::pair<std::string, CheckpointState>> CheckpointDir::load_latest(
    std::vector<std::string>* refused) const {
  for (const auto& p : list()) {
    auto s = load_checkpoint(p);
    if (s.ok()) return std::make_pair(p, std::move(s).value());
    if (refused) refused->push_back(s.status().to_string());
  }
  return not_found("no loadable checkpoint in {}", dir_);
}

}  // namespace shoal::train
