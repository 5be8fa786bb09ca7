// The head of an HTTP/1.1 request: the request line and the fields the
// server frames a body by. Apart from the server so the fuzzer reaches it.
#include <fmt/format.h>

#include <cctype>
#include <charconv>

#include "shoal/net/http_server.h"

namespace shoal::net {

const char* http_reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

}  // namespace

HttpHead parse_http_head(std::string_view head, const HttpLimits& lim) {
  HttpHead h;
  std::size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  std::size_t a = line.find(' '), b = line.rfind(' ');
  // METHOD SP PATH SP HTTP/x.y, each part non-empty.
  if (a == std::string_view::npos || a == 0 || b <= a + 1 ||
      !line.substr(b + 1).starts_with("HTTP/")) {
    h.refuse = 400, h.why = fmt::format("malformed request line `{}`", line.substr(0, 200));
    return h;
  }
  h.req.method = std::string(line.substr(0, a));
  h.req.path = std::string(line.substr(a + 1, b - a - 1));
  std::string_view version = line.substr(b + 1);
  h.close = version == "HTTP/1.0";
  std::size_t pos = eol == std::string_view::npos ? head.size() : eol + 2;
  while (pos < head.size()) {
    std::size_t end = head.find("\r\n", pos);
    if (end == std::string_view::npos) end = head.size();
    std::string_view field = head.substr(pos, end - pos);
    pos = end + 2;
    std::size_t colon = field.find(':');
    if (colon == std::string_view::npos) continue;
    std::string name = lower(trim(field.substr(0, colon)));
    std::string_view value = trim(field.substr(colon + 1));
    if (name == "content-length") {
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), h.body_bytes);
      if (ec != std::errc() || p != value.data() + value.size()) {
        h.refuse = 400, h.why = fmt::format("Content-Length `{}` is not a number", value);
      } else if (h.body_bytes > lim.max_body_bytes) {
        h.refuse = 413, h.why = fmt::format("a body of {} bytes is over this server's {}",
                                            h.body_bytes, lim.max_body_bytes);
      }
    } else if (name == "transfer-encoding" && lower(value) != "identity") {
      h.refuse = 411, h.why = "send the body with Content-Length (chunked bodies are not read)";
    } else if (name == "connection") {
      std::string v = lower(value);
      if (v == "close") h.close = true;
      if (v == "keep-alive") h.close = false;
    } else if (name == "expect" && lower(value) == "100-continue") {
      h.expect_continue = true;
    } else if (name == "content-type") {
      h.req.content_type = std::string(value);
    }
  }
  return h;
}

}  // namespace shoal::net
