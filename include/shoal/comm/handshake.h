// The connection handshake of the comm mesh, as pure functions so it can
// be fuzzed: the connecting (higher) rank sends HELLO (rank, world,
// nonce), the accepting rank answers CHALLENGE (its rank, its nonce, its
// proof), the connector answers PROOF; each proof is HMAC-SHA256 keyed by
// SHA-256(job token) over a role tag, both nonces, both ranks and the world.
#pragma once

#include <string>
#include <string_view>

#include "shoal/core/status.h"
#include "shoal/net/auth.h"

namespace shoal::comm {

using net::kNonceBytes;
inline constexpr std::size_t kProofBytes = net::kMacBytes;

struct Hello {
  int rank = 0, world = 0;
  std::string nonce;
};
struct Challenge {
  int rank = 0;
  std::string nonce, proof;
};

std::string encode_hello(int rank, int world, const std::string& nonce);
Result<Hello> parse_hello(std::string_view payload, std::string_view from);
std::string encode_challenge(int rank, const std::string& nonce, const std::string& proof);
Result<Challenge> parse_challenge(std::string_view payload, std::string_view from);

std::string make_nonce();
// role 'S' (acceptor) or 'C' (connector).
std::string make_proof(const std::string& token, char role, const std::string& client_nonce,
                       const std::string& server_nonce, int client, int server, int world);
bool proof_matches(std::string_view got, const std::string& want);  // constant time

}  // namespace shoal::comm
