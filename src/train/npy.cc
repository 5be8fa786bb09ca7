// NumPy's .npy format (numpy.lib.format, versions 1-3): the magic
// "\x93NUMPY", a version, a little-endian header length, then a Python
// dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (N, 28, 28), }
// padded with spaces, then the raw C-order data. .npz archives are zip files
// of .npy members, read with Debian's libzip.
#include <zip.h>

#include <cstring>
#include <memory>

#include "shoal/core/file.h"
#include "shoal/train/sources.h"

namespace shoal::train {

namespace {

// The value of 'key' in the header dict, up to the next top-level ',' or
// '}' (a tuple counts as one value).
Result<std::string> dict_value(std::string_view h, std::string_view key, std::string_view where) {
  std::string quoted = fmt::format("'{}'", key);
  auto k = h.find(quoted);
  if (k == std::string_view::npos)
    return invalid_argument("{}: .npy header has no '{}' (header: {})", where, key, h);
  auto colon = h.find(':', k + quoted.size());
  if (colon == std::string_view::npos)
    return invalid_argument("{}: .npy header: no ':' after '{}'", where, key);
  std::size_t i = colon + 1, depth = 0;
  std::size_t start = i;
  for (; i < h.size(); ++i) {
    char c = h[i];
    if (c == '(') ++depth;
    if (c == ')' && depth > 0) --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  std::string v(h.substr(start, i - start));
  v.erase(0, v.find_first_not_of(" \t"));
  v.erase(v.find_last_not_of(" \t") + 1);
  return v;
}

Result<Shape> parse_shape(std::string v, std::string_view where) {
  if (v.size() < 2 || v.front() != '(' || v.back() != ')')
    return invalid_argument("{}: .npy shape '{}' is not a tuple", where, v);
  Shape s;
  std::string_view body(v.data() + 1, v.size() - 2);
  while (!body.empty()) {
    auto comma = body.find(',');
    std::string_view tok = body.substr(0, comma);
    while (!tok.empty() && tok.front() == ' ') tok.remove_prefix(1);
    while (!tok.empty() && (tok.back() == ' ' || tok.back() == 'L')) tok.remove_suffix(1);
    if (!tok.empty()) {
      std::int64_t d = 0;
      for (char c : tok) {
        if (c < '0' || c > '9' || d > (std::int64_t{1} << 40))
          return invalid_argument("{}: .npy shape '{}' has a dimension that is not a count", where,
                                  v);
        d = d * 10 + (c - '0');
      }
      s.push_back(d);
    }
    if (comma == std::string_view::npos) break;
    body.remove_prefix(comma + 1);
  }
  return s;
}

// Copies n little-endian elements of type From into a tensor of type To.
template <typename From, typename To>
void widen(const char* src, Tensor& out) {
  To* dst = out.data<To>();
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    From v;
    std::memcpy(&v, src + i * static_cast<std::int64_t>(sizeof(From)), sizeof(From));
    dst[i] = static_cast<To>(v);
  }
}

Result<Tensor> decode(std::string_view descr, const Shape& shape, const char* data,
                      std::string_view where) {
  if (descr.size() < 3 || (descr[0] != '<' && descr[0] != '|'))
    return invalid_argument(
        "{}: .npy element type '{}' is not supported (little-endian bool, int, uint or float; "
        "save with arr.astype('<f4') for instance)",
        where, descr);
  char kind = descr[1];
  std::string_view width = descr.substr(2);
  auto is = [&](char k, std::string_view w) { return kind == k && width == w; };
  auto raw = [&](DType t) {
    Tensor out = Tensor::empty(shape, t);
    std::memcpy(out.raw_data(), data, out.nbytes());
    return out;
  };
  if (is('u', "1") || is('b', "1")) return raw(DType::kU8);
  if (is('f', "4")) return raw(DType::kF32);
  if (is('f', "8")) return raw(DType::kF64);
  if (is('f', "2")) return raw(DType::kF16);
  if (is('i', "4")) return raw(DType::kI32);
  if (is('i', "8")) return raw(DType::kI64);
  Tensor out = Tensor::empty(shape, (is('u', "4") || is('u', "8")) ? DType::kI64 : DType::kI32);
  if (is('i', "1"))
    widen<std::int8_t, std::int32_t>(data, out);
  else if (is('i', "2"))
    widen<std::int16_t, std::int32_t>(data, out);
  else if (is('u', "2"))
    widen<std::uint16_t, std::int32_t>(data, out);
  else if (is('u', "4"))
    widen<std::uint32_t, std::int64_t>(data, out);
  else if (is('u', "8"))
    widen<std::uint64_t, std::int64_t>(data, out);
  else
    return invalid_argument(
        "{}: .npy element type '{}' is not supported (little-endian bool, int, uint or float)",
        where, descr);
  return out;
}

std::size_t descr_bytes(std::string_view descr) {
  std::size_t n = 0;
  for (char c : descr.substr(2)) n = n * 10 + static_cast<std::size_t>(c - '0');
  return n;
}

}  // namespace

Result<Tensor> parse_npy(std::string_view b, std::string_view where) {
  if (b.size() < 10 || b.substr(0, 6) != std::string_view("\x93NUMPY", 6))
    return invalid_argument("{}: not a .npy file (no \\x93NUMPY magic in the first 6 bytes)",
                            where);
  auto u8 = [&](std::size_t i) {
    return static_cast<std::size_t>(static_cast<unsigned char>(b[i]));
  };
  std::size_t major = u8(6), hlen = 0, pre = 0;
  if (major == 1) {
    hlen = u8(8) | (u8(9) << 8);
    pre = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) return invalid_argument("{}: .npy header is truncated", where);
    hlen = u8(8) | (u8(9) << 8) | (u8(10) << 16) | (u8(11) << 24);
    pre = 12;
  } else {
    return invalid_argument("{}: .npy format version {}.{} is not one of 1.0, 2.0, 3.0", where,
                            major, u8(7));
  }
  if (b.size() < pre + hlen)
    return invalid_argument("{}: .npy header says {} bytes, the file has {} after the preamble",
                            where, hlen, b.size() - pre);
  std::string_view h = b.substr(pre, hlen);
  SHOAL_ASSIGN_OR_RETURN(std::string descr, dict_value(h, "descr", where));
  SHOAL_ASSIGN_OR_RETURN(std::string fortran, dict_value(h, "fortran_order", where));
  SHOAL_ASSIGN_OR_RETURN(std::string shape_s, dict_value(h, "shape", where));
  if (descr.size() < 2 || descr.front() != '\'' || descr.back() != '\'')
    return invalid_argument(
        "{}: .npy descr {} is not a simple type (structured arrays are not "
        "supported)",
        where, descr);
  descr = descr.substr(1, descr.size() - 2);
  if (fortran != "False")
    return invalid_argument(
        "{}: the array is stored in Fortran order; save it with np.ascontiguousarray(a)", where);
  SHOAL_ASSIGN_OR_RETURN(Shape shape, parse_shape(shape_s, where));
  // Python objects (ragged lists, strings, mixed types) are pickles, not
  // numbers: before, "needs 0 bytes ... trailing bytes".
  if (descr == "|O")
    return invalid_argument(
        "{}: the array holds Python objects (dtype object: ragged lists or mixed types), not "
        "numbers; save numbers of one type and shape",
        where);
  std::size_t elem = descr.size() >= 3 ? descr_bytes(descr) : 0;
  std::size_t want = static_cast<std::size_t>(num_elements(shape)) * elem;
  std::size_t have = b.size() - pre - hlen;
  if (have != want)
    return invalid_argument("{}: .npy data: shape {} of '{}' needs {} bytes, the file has {} ({})",
                            where, shape_str(shape), descr, want, have,
                            have < want ? "truncated" : "trailing bytes");
  return decode(descr, shape, b.data() + pre + hlen, where);
}

Result<Tensor> read_npy(const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(std::string raw, read_file(path));
  return parse_npy(raw, path);
}

Result<std::vector<std::pair<std::string, Tensor>>> read_npz(const std::string& path) {
  int err = 0;
  std::unique_ptr<zip_t, decltype(&zip_discard)> z(zip_open(path.c_str(), ZIP_RDONLY, &err),
                                                   &zip_discard);
  if (!z) {
    zip_error_t ze;
    zip_error_init_with_code(&ze, err);
    std::string msg = zip_error_strerror(&ze);
    zip_error_fini(&ze);
    return invalid_argument("{}: cannot open as an .npz (zip) archive: {}", path, msg);
  }
  std::vector<std::pair<std::string, Tensor>> out;
  const zip_int64_t n = zip_get_num_entries(z.get(), 0);
  constexpr zip_uint64_t kMax = zip_uint64_t{16} << 30;  // refuse zip bombs past 16 GiB
  for (zip_int64_t i = 0; i < n; ++i) {
    zip_stat_t st;
    if (zip_stat_index(z.get(), static_cast<zip_uint64_t>(i), 0, &st) != 0) continue;
    std::string name = st.name;
    std::string where = fmt::format("{}[{}]", path, name);
    if (!name.ends_with(".npy")) continue;
    if (st.size > kMax) return invalid_argument("{}: member is {} bytes", where, st.size);
    std::unique_ptr<zip_file_t, decltype(&zip_fclose)> f(
        zip_fopen_index(z.get(), static_cast<zip_uint64_t>(i), 0), &zip_fclose);
    if (!f) return invalid_argument("{}: cannot read: {}", where, zip_strerror(z.get()));
    std::string bytes(st.size, '\0');
    zip_int64_t got = zip_fread(f.get(), bytes.data(), st.size);
    if (got < 0 || static_cast<zip_uint64_t>(got) != st.size)
      return invalid_argument("{}: read {} of {} bytes: {}", where, got, st.size,
                              zip_file_strerror(f.get()));
    SHOAL_ASSIGN_OR_RETURN(Tensor t, parse_npy(bytes, where));
    out.emplace_back(name.substr(0, name.size() - 4), std::move(t));
  }
  return out;
}

}  // namespace shoal::train
