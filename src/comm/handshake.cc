#include "shoal/comm/handshake.h"

#include "shoal/net/auth.h"

namespace shoal::comm {
namespace {
void put32(std::string& s, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}
std::uint32_t get32(std::string_view s, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i)
    v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<std::size_t>(i)]);
  return v;
}
}  // namespace

std::string encode_hello(int rank, int world, const std::string& nonce) {
  std::string h;
  put32(h, static_cast<std::uint32_t>(rank));
  put32(h, static_cast<std::uint32_t>(world));
  return h + nonce;
}

Result<Hello> parse_hello(std::string_view p, std::string_view from) {
  if (p.size() != 8 + kNonceBytes)
    return invalid_argument("handshake from {}: hello has {} bytes, expected {}", from, p.size(),
                            8 + kNonceBytes);
  Hello h;
  std::uint32_t r = get32(p, 0), w = get32(p, 4);
  if (w < 1 || w > 65535 || r >= w)
    return invalid_argument("handshake from {}: hello claims rank {} of world {}", from, r, w);
  h.rank = static_cast<int>(r);
  h.world = static_cast<int>(w);
  h.nonce = std::string(p.substr(8));
  return h;
}

std::string encode_challenge(int rank, const std::string& nonce, const std::string& proof) {
  std::string c;
  put32(c, static_cast<std::uint32_t>(rank));
  return c + nonce + proof;
}

Result<Challenge> parse_challenge(std::string_view p, std::string_view from) {
  if (p.size() != 4 + kNonceBytes + kProofBytes)
    return invalid_argument("handshake with {}: challenge has {} bytes, expected {}", from,
                            p.size(), 4 + kNonceBytes + kProofBytes);
  Challenge c;
  std::uint32_t r = get32(p, 0);
  if (r > 65535) return invalid_argument("handshake with {}: challenge from rank {}", from, r);
  c.rank = static_cast<int>(r);
  c.nonce = std::string(p.substr(4, kNonceBytes));
  c.proof = std::string(p.substr(4 + kNonceBytes));
  return c;
}

std::string make_nonce() { return net::make_nonce(); }

std::string make_proof(const std::string& token, char role, const std::string& nc,
                       const std::string& ns, int client, int server, int world) {
  std::string msg(1, role);
  msg += nc + ns;
  put32(msg, static_cast<std::uint32_t>(client));
  put32(msg, static_cast<std::uint32_t>(server));
  put32(msg, static_cast<std::uint32_t>(world));
  return net::token_mac(token, msg);
}

bool proof_matches(std::string_view got, const std::string& want) {
  return net::mac_equal(got, want);
}

}  // namespace shoal::comm
