#include "shoal/net/auth.h"

#include <sodium.h>

namespace shoal::net {

Status init_crypto() {
  if (sodium_init() < 0) return internal_error("libsodium failed to initialize");
  return ok_status();
}

std::string make_nonce() {
  std::string n(kNonceBytes, '\0');
  randombytes_buf(n.data(), n.size());
  return n;
}

std::string token_mac(const std::string& token, std::string_view msg) {
  static_assert(crypto_auth_hmacsha256_BYTES == kMacBytes);
  unsigned char key[crypto_auth_hmacsha256_KEYBYTES];
  crypto_hash_sha256(key, reinterpret_cast<const unsigned char*>(token.data()), token.size());
  std::string mac(kMacBytes, '\0');
  crypto_auth_hmacsha256(reinterpret_cast<unsigned char*>(mac.data()),
                         reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), key);
  sodium_memzero(key, sizeof key);
  return mac;
}

bool mac_equal(std::string_view got, std::string_view want) {
  return got.size() == want.size() && sodium_memcmp(got.data(), want.data(), want.size()) == 0;
}

std::string store_proof(const std::string& token, char role, std::string_view client_nonce,
                        std::string_view server_nonce) {
  // The tag keeps a store proof from ever passing as a mesh proof.
  std::string msg = "shoal-store/";
  msg.push_back(role);
  msg.append(client_nonce);
  msg.append(server_nonce);
  return token_mac(token, msg);
}

Result<StoreChallenge> parse_store_challenge(std::string_view p, std::string_view from) {
  if (p.size() != kNonceBytes + kMacBytes)
    return invalid_argument("store handshake with {}: challenge has {} bytes, expected {}", from,
                            p.size(), kNonceBytes + kMacBytes);
  return StoreChallenge{std::string(p.substr(0, kNonceBytes)), std::string(p.substr(kNonceBytes))};
}

}  // namespace shoal::net
