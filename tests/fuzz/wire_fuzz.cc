// libFuzzer target for everything Shoal parses off the network before a
// peer is trusted: frame headers (as a stream of frames), store requests,
// and the handshakes' payloads (mesh hello and challenge, store challenge). Invariants checked: no
// crash or sanitizer report, an accepted header never claims more than the
// bound it was read with, and accepted messages re-encode to the same bytes.
// Built and run by `make fuzz` (clang, -fsanitize=fuzzer,address,undefined).
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "ps/wire.h"
#include "shoal/comm/handshake.h"
#include "shoal/net/auth.h"
#include "shoal/net/http_server.h"
#include "shoal/net/socket.h"

using namespace shoal;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::uint8_t> in(data, size);
  // A stream of frames: each header must bound its payload within what is left.
  std::size_t pos = 0;
  while (pos + net::kHeaderBytes <= size) {
    std::uint64_t left = size - pos - net::kHeaderBytes;
    auto h = net::decode_header(in.subspan(pos, net::kHeaderBytes), left, "fuzz");
    if (!h.ok()) break;
    if (h->length > left) std::abort();
    std::uint8_t again[net::kHeaderBytes];
    net::encode_header(*h, again);
    for (std::size_t i = 0; i < net::kHeaderBytes; ++i)
      if (again[i] != data[pos + i]) std::abort();
    pos += net::kHeaderBytes + h->length;
  }
  std::string_view sv(reinterpret_cast<const char*>(data), size);
  char cmd = 0;
  std::string parts[3];
  if (net::parse_store_request(sv, &cmd, parts) &&
      net::pack_store_request(cmd, parts[0], parts[1], parts[2]) != sv)
    std::abort();
  if (auto hello = comm::parse_hello(sv, "fuzz"); hello.ok()) {
    if (hello->rank < 0 || hello->rank >= hello->world) std::abort();
    if (comm::encode_hello(hello->rank, hello->world, hello->nonce) != sv) std::abort();
  }
  if (auto ch = comm::parse_challenge(sv, "fuzz"); ch.ok()) {
    if (comm::encode_challenge(ch->rank, ch->nonce, ch->proof) != sv) std::abort();
    (void)comm::proof_matches(ch->proof, std::string(comm::kProofBytes, 'x'));
  }
  // The store handshake's challenge: exact size, and a proof that never
  // matches one made with another token.
  if (auto sc = net::parse_store_challenge(sv, "fuzz"); sc.ok()) {
    if (sc->nonce.size() != net::kNonceBytes || sc->proof.size() != net::kMacBytes) std::abort();
    if (sc->nonce + sc->proof != sv) std::abort();
    if (net::mac_equal(sc->proof, net::store_proof("token", 'S', "", sc->nonce)) &&
        net::mac_equal(sc->proof, net::store_proof("other", 'S', "", sc->nonce)))
      std::abort();
  }
  // Parameter-server messages: a request that decodes encodes back to the
  // same bytes (every length was checked, nothing trails). Only for f32
  // data: a coded tensor is decoded to f32, and re-coding it need not give
  // the same bits (NaN payloads in f16/bf16, 2-bit padding bits).
  if (auto r = ps::decode_request(sv);
      r.ok() && r->codec == ps::Codec::kF32 && ps::encode(*r) != sv)
    std::abort();
  if (auto p = ps::decode_pull_reply(sv); p.ok()) {
    const std::size_t codec_at = 8 + 1 + 8 * static_cast<std::size_t>(p->second.rank());
    if (codec_at < sv.size() && sv[codec_at] == 0 &&
        ps::encode_pull_reply(p->first, p->second) != sv)
      std::abort();
  }
  // An HTTP request head (the extender's webhook): a head it accepts has
  // a method and a path, and a body within the bound it was read with.
  net::HttpLimits lim;
  lim.max_body_bytes = 1 << 20;
  net::HttpHead hh = net::parse_http_head(sv, lim);
  if (hh.refuse == 0 && (hh.req.method.empty() || hh.body_bytes > lim.max_body_bytes)) std::abort();
  if (hh.refuse != 0 && hh.why.empty()) std::abort();
  return 0;
}
