// Proof of the job token, shared by the comm mesh's handshake and the
// rendezvous store's: HMAC-SHA256 keyed by SHA-256(token), nonces from the
// system's CSPRNG (libsodium), comparison in constant time. Pure functions
// (so the handshakes can be fuzzed); thread-safe after sodium_init().
#pragma once

#include <string>
#include <string_view>

#include "shoal/core/status.h"

namespace shoal::net {

inline constexpr std::size_t kNonceBytes = 16;
inline constexpr std::size_t kMacBytes = 32;

// Initializes libsodium once (idempotent); an error when it cannot.
Status init_crypto();
std::string make_nonce();
// HMAC-SHA256 of msg under SHA-256(token); kMacBytes bytes.
std::string token_mac(const std::string& token, std::string_view msg);
bool mac_equal(std::string_view got, std::string_view want);  // constant time

// The store handshake. The client sends HELLO = its nonce; the server
// answers CHALLENGE = its nonce + its proof; the client checks that proof
// (an impostor store cannot answer it) and sends PROOF; the server serves
// requests only after checking it. Role 'S' server, 'C' client.
std::string store_proof(const std::string& token, char role, std::string_view client_nonce,
                        std::string_view server_nonce);
struct StoreChallenge {
  std::string nonce, proof;
};
Result<StoreChallenge> parse_store_challenge(std::string_view payload, std::string_view from);

}  // namespace shoal::net
