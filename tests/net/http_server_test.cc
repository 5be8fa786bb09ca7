// The webhook server: keep-alive and pipelined requests answered in order,
// bodies framed by Content-Length even when they arrive in pieces, bad
// heads and oversized bodies refused with the status that names them, and
// a client that stalls does not hold up another.
#include "shoal/net/http_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <thread>

namespace shoal::net {
namespace {

std::unique_ptr<HttpServer> echo_server(HttpLimits lim = {}) {
  auto s = HttpServer::start(
      "127.0.0.1", 0,
      [](const HttpRequest& r) {
        return HttpResponse{200, "text/plain", r.method + " " + r.path + " [" + r.body + "]"};
      },
      lim);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::move(*s) : nullptr;
}

Socket dial(const HttpServer& s) {
  auto c = Socket::connect("127.0.0.1", s.port(), Deadline::after_seconds(5));
  EXPECT_TRUE(c.ok());
  return std::move(*c);
}

// Reads until `answers` whole responses (head + Content-Length body) or
// the peer closes; bounded by 5 s.
std::string read_answers(Socket& c, int answers) {
  std::string got;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until) {
    int whole = 0;
    std::size_t at = 0;
    while (true) {
      std::size_t end = got.find("\r\n\r\n", at);
      if (end == std::string::npos) break;
      std::size_t len_at = got.find("Content-Length: ", at);
      std::size_t len = std::stoul(got.substr(len_at + 16));
      if (got.size() < end + 4 + len) break;
      at = end + 4 + len;
      ++whole;
    }
    if (whole >= answers) return got;
    char buf[4096];
    ssize_t n = ::recv(c.fd(), buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return got;
    if (n > 0)
      got.append(buf, static_cast<std::size_t>(n));
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return got;
}

void send(Socket& c, const std::string& s) {
  ASSERT_TRUE(c.send_all(s.data(), s.size(), Deadline::after_seconds(5)).ok());
}

TEST(HttpServer, KeepAliveAndPipelinedRequestsAreAnsweredInOrder) {
  auto s = echo_server();
  Socket c = dial(*s);
  send(c,
       "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
       "POST /prioritize HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc");
  std::string got = read_answers(c, 2);
  std::size_t a = got.find("POST /filter [hello]"), b = got.find("POST /prioritize [abc]");
  ASSERT_NE(a, std::string::npos) << got;
  ASSERT_NE(b, std::string::npos) << got;
  EXPECT_LT(a, b);
  // The same connection serves a third request, its body in two pieces.
  send(c, "POST /filter HTTP/1.1\r\nContent-Length: 6\r\n\r\nabc");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  send(c, "def");
  EXPECT_NE(read_answers(c, 1).find("[abcdef]"), std::string::npos);
  EXPECT_EQ(s->answered(), 3);
}

TEST(HttpServer, BadHeadsAndBodiesGetTheStatusThatNamesThem) {
  HttpLimits lim;
  lim.max_body_bytes = 100;
  lim.max_header_bytes = 1024;
  auto s = echo_server(lim);
  auto status_of = [&](const std::string& req) {
    Socket c = dial(*s);
    send(c, req);
    std::string got = read_answers(c, 1);
    return got.substr(0, got.find("\r\n"));
  };
  EXPECT_EQ(status_of("POST /f HTTP/1.1\r\nContent-Length: 101\r\n\r\n"),
            "HTTP/1.1 413 Content Too Large");
  EXPECT_EQ(status_of("POST /f HTTP/1.1\r\nContent-Length: 1x\r\n\r\n"),
            "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(
      status_of("POST /f HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
      "HTTP/1.1 411 Length Required");
  EXPECT_EQ(status_of("GARBAGE\r\n\r\n"), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status_of(" /f HTTP/1.1\r\n\r\n"), "HTTP/1.1 400 Bad Request");  // no method
  EXPECT_EQ(status_of("POST /f SHTTP\r\n\r\n"), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status_of("POST /f HTTP/1.1\r\nX: " + std::string(2000, 'a')),
            "HTTP/1.1 431 Request Header Fields Too Large");
  // Connection: close is honoured: the answer, then the server closes.
  Socket c = dial(*s);
  send(c, "GET /x HTTP/1.1\r\nConnection: close\r\n\r\n");
  std::string got = read_answers(c, 2);  // asks for two: returns when closed
  EXPECT_NE(got.find("GET /x []"), std::string::npos);
  EXPECT_NE(got.find("Connection: close"), std::string::npos);
}

TEST(HttpServer, AStalledClientDoesNotHoldUpAnotherAndIsDroppedAtItsDeadline) {
  HttpLimits lim;
  lim.request_seconds = 1;
  auto s = echo_server(lim);
  Socket slow = dial(*s);
  send(slow, "POST /f HTTP/1.1\r\nContent-Length: 10\r\n\r\nab");  // 8 bytes never come
  Socket quick = dial(*s);
  auto t0 = std::chrono::steady_clock::now();
  send(quick, "POST /g HTTP/1.1\r\nContent-Length: 1\r\n\r\nz");
  EXPECT_NE(read_answers(quick, 1).find("[z]"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
  // The stalled one is closed within its 1 s deadline (+ the 200 ms poll).
  std::string rest = read_answers(slow, 1);
  EXPECT_TRUE(rest.empty()) << rest;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2500));
}

TEST(HttpServer, AHandlerThatThrowsIsA500AndTheServerServesOn) {
  int calls = 0;
  auto s = HttpServer::start("127.0.0.1", 0, [&](const HttpRequest&) -> HttpResponse {
    if (++calls == 1) throw std::runtime_error("boom");
    return {200, "text/plain", "fine"};
  });
  ASSERT_TRUE(s.ok());
  Socket c = dial(**s);
  send(c, "GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n");
  std::string got = read_answers(c, 2);
  EXPECT_NE(got.find("500 Internal Server Error"), std::string::npos) << got;
  EXPECT_NE(got.find("boom"), std::string::npos);
  EXPECT_NE(got.find("fine"), std::string::npos);
}

}  // namespace
}  // namespace shoal::net
