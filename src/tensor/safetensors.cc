#include "shoal/tensor/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

namespace shoal {
namespace {

// safetensors dtype names <-> ours.
const char* st_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF64:
      return "F64";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
  }
  return "?";
}

bool st_parse(const std::string& s, DType* out) {
  for (DType t : kAllDTypes)
    if (s == st_name(t)) {
      *out = t;
      return true;
    }
  return false;
}

constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference reader's bound

}  // namespace

const Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

Result<SafetensorsFile> parse_safetensors(std::string_view bytes, std::string_view where) {
  if (bytes.size() < 8)
    return data_loss("{}: file is {} bytes, too short for the 8-byte header length", where,
                     bytes.size());
  std::uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<unsigned char>(bytes[i]);
  if (hlen > kMaxHeaderBytes)
    return data_loss("{}: header length {} exceeds the {}-byte limit", where, hlen,
                     kMaxHeaderBytes);
  if (hlen > bytes.size() - 8)
    return data_loss("{}: header length {} runs past the end of the {}-byte file", where, hlen,
                     bytes.size());
  std::string_view header = bytes.substr(8, hlen);
  // JSON parsers keep the last of duplicate keys; a header naming one tensor
  // twice is ambiguous (which bytes are the weights?), so it is refused.
  std::set<std::string> seen;
  std::string duplicate;
  auto on_key = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key && depth == 1 && duplicate.empty() &&
        !seen.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json j = nlohmann::json::parse(header.begin(), header.end(), on_key, false);
  if (j.is_discarded())
    return data_loss("{}: header (bytes 8..{}) is not valid JSON", where, 8 + hlen);
  if (!duplicate.empty())
    return data_loss("{}: header names tensor '{}' more than once", where, duplicate);
  if (!j.is_object()) return data_loss("{}: header is not a JSON object", where);
  std::string_view data = bytes.substr(8 + hlen);
  const std::uint64_t data_size = data.size();

  SafetensorsFile file;
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return data_loss("{}: __metadata__ is not an object", where);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return data_loss("{}: __metadata__ value of '{}' is not a string", where, m.key());
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) return data_loss("{}: tensor '{}': entry is not an object", where, name);
    for (auto f = v.begin(); f != v.end(); ++f)
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        return data_loss("{}: tensor '{}': unknown field '{}'", where, name, f.key());
    Entry e;
    e.name = name;
    if (!v.contains("dtype") || !v["dtype"].is_string())
      return data_loss("{}: tensor '{}': field 'dtype' missing or not a string", where, name);
    if (!st_parse(v["dtype"].get<std::string>(), &e.dtype))
      return data_loss("{}: tensor '{}': field 'dtype': unsupported dtype '{}'", where, name,
                       v["dtype"].get<std::string>());
    if (!v.contains("shape") || !v["shape"].is_array())
      return data_loss("{}: tensor '{}': field 'shape' missing or not an array", where, name);
    std::uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0)
        return data_loss("{}: tensor '{}': field 'shape' has a non-integer or negative entry",
                         where, name);
      auto dim = d.get<std::uint64_t>();
      e.shape.push_back(static_cast<std::int64_t>(dim));
      if (dim != 0 && numel > std::numeric_limits<std::uint64_t>::max() / 16 / dim) overflow = true;
      numel *= dim;
    }
    if (overflow)
      return data_loss("{}: tensor '{}': field 'shape' {} overflows", where, name,
                       shape_str(e.shape));
    const auto& off = v.contains("data_offsets") ? v["data_offsets"] : nlohmann::json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_integer() ||
        !off[1].is_number_integer() || off[0].get<std::int64_t>() < 0 ||
        off[1].get<std::int64_t>() < 0)
      return data_loss("{}: tensor '{}': field 'data_offsets' must be two non-negative integers",
                       where, name);
    e.begin = off[0].get<std::uint64_t>();
    e.end = off[1].get<std::uint64_t>();
    if (e.begin > e.end || e.end > data_size)
      return data_loss(
          "{}: tensor '{}': field 'data_offsets' [{}, {}) outside the {}-byte data area", where,
          name, e.begin, e.end, data_size);
    std::uint64_t want = numel * dtype_size(e.dtype);
    if (e.end - e.begin != want)
      return data_loss("{}: tensor '{}': field 'data_offsets' spans {} bytes but {} {} needs {}",
                       where, name, e.end - e.begin, st_name(e.dtype), shape_str(e.shape), want);
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  std::uint64_t cursor = 0;
  for (const Entry& e : entries) {
    if (e.begin < cursor)
      return data_loss(
          "{}: tensor '{}': field 'data_offsets' [{}, {}) overlaps the previous tensor", where,
          e.name, e.begin, e.end);
    if (e.begin > cursor)
      return data_loss("{}: tensor '{}': gap of {} bytes before it in the data area", where, e.name,
                       e.begin - cursor);
    cursor = e.end;
  }
  if (cursor != data_size)
    return data_loss("{}: data area is {} bytes but tensors cover {}", where, data_size, cursor);
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin) std::memcpy(t.raw_data(), data.data() + e.begin, e.end - e.begin);
    if (e.dtype == DType::kBool) {
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        auto b = static_cast<const unsigned char*>(t.raw_data())[i];
        if (b > 1)
          return data_loss("{}: tensor '{}': bool element {} has byte value {}", where, e.name, i,
                           b);
      }
    }
    file.tensors.emplace_back(e.name, std::move(t));
  }
  return file;
}

std::string serialize_safetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    nlohmann::ordered_json e;
    e["dtype"] = st_name(t.dtype());
    e["shape"] = t.shape();
    e["data_offsets"] = {off, off + t.nbytes()};
    off += t.nbytes();
    h[name] = e;
  }
  std::string hs = h.dump();
  while ((8 + hs.size()) % 8 != 0) hs.push_back(' ');  // keep the data 8-byte aligned
  std::string out(8, '\0');
  std::uint64_t n = hs.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += hs;
  out.reserve(out.size() + off);
  for (const auto& [name, t] : tensors) {
    Tensor c = t.contiguous();
    out.append(static_cast<const char*>(c.raw_data()), c.nbytes());
  }
  return out;
}

Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  for (const auto& [name, t] : tensors)
    if (name == "__metadata__")
      return invalid_argument("{}: tensor name '__metadata__' is reserved", path);
  return write_file_atomic(path, serialize_safetensors(tensors, metadata));
}

Result<SafetensorsFile> read_safetensors(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  return parse_safetensors(bytes, path);
}

}  // namespace shoal
