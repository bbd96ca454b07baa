// HttpEndpoint: what is done where no serving thread is held. Refusals written from the poll,
// whole, while every serving thread is busy; a 408 written whole although the socket takes it
// only later.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

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

namespace tessera {
namespace {

using namespace std::chrono_literals;

HttpEndpointOptions MetricsOnly() {
  HttpEndpointOptions options;
  options.routes.push_back({"/metrics", [](const HttpRequest&) {
                              return HttpResponse{200, "text/plain; version=0.0.4", "up 1\n", {}};
                            }, nullptr});
  return options;
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
