// HttpEndpoint: what is done where no serving thread is held. TLS handshakes on threads of
// their own, taking turns by client address; refusals written from the poll, whole, while
// every serving thread is busy; a 408 written whole although the socket takes it only later.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/http_endpoint.h"
#include "tests/base/raw_http_client.h"
#include "tests/base/slow_handshake_identity.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;

// A TLS ClientHello, as a client's first bytes: written by a client that talks to memory.
std::string ClientHello() {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL* ssl = SSL_new(ctx);
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  SSL_set_bio(ssl, in, out);
  SSL_set_connect_state(ssl);
  SSL_do_handshake(ssl);  // wants the server's answer, with the ClientHello written
  char* data = nullptr;
  const long size = BIO_get_mem_data(out, &data);
  std::string hello(data, static_cast<size_t>(std::max(0L, size)));
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  return hello;
}

// One HTTPS request from `source` (a loopback address), on a blocking socket whose reads and
// writes each give up after 60 s: the answer, or what went wrong.
std::string HttpsGet(int port, const char* source, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval limit{60, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    ::close(fd);
    return std::string("cannot connect from ") + source;
  }
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  std::string answer = "no handshake";
  if (SSL_connect(ssl) == 1) {
    answer.clear();
    SSL_write(ssl, request.data(), static_cast<int>(request.size()));
    char buffer[4096];
    for (int n; (n = SSL_read(ssl, buffer, sizeof(buffer))) > 0;) answer.append(buffer, static_cast<size_t>(n));
  }
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  ::close(fd);
  return answer;
}

// Handshakes are worked on by threads of their own, one step of one client address's at a
// time: with a key that costs every handshake tens of milliseconds, a client from another
// address is served while most of a flood of ClientHellos, all sent before it, is still
// unanswered. A poll that did the handshakes itself reached the later client only after
// answering every ClientHello that arrived before it.
TEST(HttpEndpointPollTest, AFloodOfHandshakesFromOneAddressDoesNotHoldUpAnother) {
  auto options = MetricsOnly();
  options.cert_pem = testing::kSlowHandshakeCertPem;
  options.key_pem = testing::kSlowHandshakeKeyPem;
  options.read_timeout = 600s;
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  const std::string hello = ClientHello();
  ASSERT_FALSE(hello.empty());
  // Within the listening socket's backlog of 64, so that they are accepted in this order.
  constexpr int kFlood = 48;
  std::vector<std::unique_ptr<RawClient>> flood;
  for (int i = 0; i < kFlood; ++i) {
    flood.push_back(std::make_unique<RawClient>((*endpoint)->port()));
    ASSERT_TRUE(flood.back()->connected());
    ASSERT_TRUE(flood.back()->Send(hello));
  }
  const std::string answer =
      HttpsGet((*endpoint)->port(), "127.0.0.2", "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
  if (answer == "cannot connect from 127.0.0.2") GTEST_SKIP() << "no second loopback address here";
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answer;
  int answered = 0;
  for (const auto& client : flood) {
    pollfd p{client->fd(), POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) ++answered;
  }
  EXPECT_LT(answered, kFlood) << "every ClientHello sent before the request was answered before it";
}

// Refused heads (malformed, another method, a body) are answered and closed by the poll that
// read them: with the one serving thread held by a request that has not been answered yet,
// each refusal still arrives, whole, and its connection closes.
TEST(HttpEndpointPollTest, RefusalsAreAnsweredWhileEveryThreadIsBusy) {
  auto options = MetricsOnly();
  options.threads = 1;
  options.read_timeout = 600s;
  std::mutex mu;
  std::condition_variable changed;
  bool held = false;
  bool release = false;
  options.routes.push_back({"/hold", [&](const HttpRequest&) {
                              std::unique_lock<std::mutex> lock(mu);
                              held = true;
                              changed.notify_all();
                              changed.wait(lock, [&] { return release; });
                              return HttpResponse{200, "text/plain", "released\n", {}};
                            }, nullptr});
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok());
  // Lets the handler go however the test ends, before the endpoint stops.
  struct Release {
    std::mutex& mu;
    std::condition_variable& changed;
    bool& release;
    ~Release() {
      std::lock_guard<std::mutex> lock(mu);
      release = true;
      changed.notify_all();
    }
  } release_at_end{mu, changed, release};
  RawClient holder((*endpoint)->port());
  ASSERT_TRUE(holder.connected());
  ASSERT_TRUE(holder.Send("GET /hold HTTP/1.1\r\nConnection: close\r\n\r\n"));
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(changed.wait_for(lock, 60s, [&] { return held; })) << "the held request never reached its handler";
  }
  std::string many_lines = "GET /metrics HTTP/1.1\r\n";
  for (int i = 0; i < 200; ++i) many_lines += "X-Filler-" + std::to_string(i) + ": v\r\n";
  struct Case {
    std::string request;
    std::string status_line;
  };
  for (const Case& c : std::vector<Case>{
           {many_lines, "HTTP/1.1 431 "},
           {"GET /metrics HTTP/3\r\n\r\n", "HTTP/1.1 400 "},
           {"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 405 "},
           {"GET /metrics HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody", "HTTP/1.1 413 "},
       }) {
    RawClient client((*endpoint)->port());
    ASSERT_TRUE(client.connected());
    client.Send(c.request);
    bool closed = false;
    const std::string answer = client.ReadUntilClosed(20s, &closed);
    EXPECT_NE(answer.find(c.status_line), std::string::npos) << c.request.substr(0, 40) << " -> " << answer;
    EXPECT_NE(answer.find("Connection: close\r\n"), std::string::npos) << answer;
    EXPECT_TRUE(closed) << c.request.substr(0, 40);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
    changed.notify_all();
  }
  bool closed = false;
  EXPECT_NE(holder.ReadUntilClosed(60s, &closed).find("released"), std::string::npos);
  // A refused head pipelined after one that is answered goes back to the poll to be refused.
  RawClient pipelined((*endpoint)->port());
  ASSERT_TRUE(pipelined.connected());
  pipelined.Send("GET /metrics HTTP/1.1\r\n\r\nGET /metrics HTTP/3\r\n\r\n");
  closed = false;
  const std::string answers = pipelined.ReadUntilClosed(20s, &closed);
  EXPECT_EQ(answers.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answers;
  EXPECT_NE(answers.find("HTTP/1.1 400 "), std::string::npos) << answers;
  EXPECT_TRUE(closed);
}

// The accepted socket of `client` in this process: the endpoint's end of the connection.
int ServerEnd(const RawClient& client) {
  sockaddr_storage mine{};
  socklen_t mine_size = sizeof(mine);
  ::getsockname(client.fd(), reinterpret_cast<sockaddr*>(&mine), &mine_size);
  for (int attempt = 0; attempt < 3000; ++attempt) {
    for (int fd = 0; fd < 4096; ++fd) {
      sockaddr_storage peer{};
      socklen_t peer_size = sizeof(peer);
      if (fd == client.fd() || ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_size) != 0) continue;
      if (peer_size == mine_size && std::memcmp(&peer, &mine, mine_size) == 0) return fd;
    }
    std::this_thread::sleep_for(10ms);  // not accepted yet
  }
  return -1;
}

// A head cut off by the read timeout is answered with 408 even when the socket cannot take the
// answer at once (earlier answers the client has not read yet fill it; here bytes written to
// the endpoint's end stand in for them): the 408 follows them as the client reads, then the
// connection closes. One write that found the socket full lost it.
TEST(HttpEndpointPollTest, A408IsWrittenWholeWhenTheSocketTakesItOnlyLater) {
  auto options = MetricsOnly();
  constexpr auto kReadTimeout = 4s;
  options.read_timeout = kReadTimeout;
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok());
  RawClient client((*endpoint)->port(), /*receive_buffer=*/4096);
  ASSERT_TRUE(client.connected());
  const int server_end = ServerEnd(client);
  ASSERT_GE(server_end, 0) << "the endpoint never accepted the connection";
  // Fills the endpoint's send buffer, and the client's receive buffer behind it, until they
  // take nothing more twice over (an acknowledgement may free a little room at first).
  size_t filled = 0;
  const std::string junk(4096, 'j');
  for (int quiet = 0; quiet < 2;) {
    const ssize_t n = ::send(server_end, junk.data(), junk.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      filled += static_cast<size_t>(n);
      quiet = 0;
      continue;
    }
    ASSERT_TRUE(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) << std::strerror(errno);
    ++quiet;
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(client.Send("GET /metrics HTTP/1.1\r\n"));
  // Past the read timeout, well within the 408's own time to be written.
  std::this_thread::sleep_for(kReadTimeout + 1500ms);
  bool closed = false;
  const std::string answer = client.ReadUntilClosed(60s, &closed);
  ASSERT_GE(answer.size(), filled);
  EXPECT_EQ(answer.find_first_not_of('j'), filled);
  EXPECT_EQ(answer.compare(filled, 13, "HTTP/1.1 408 "), 0) << answer.substr(filled);
  EXPECT_NE(answer.find("did not arrive within 4 s"), std::string::npos) << answer.substr(filled);
  EXPECT_TRUE(closed);
}

}  // namespace
}  // namespace tessera
