// HttpEndpoint: one client address holds at most max_connections_per_address connections,
// so that it cannot take every place while another address's scrape waits, and the endpoint
// at most max_connections, the oldest waiting for a request closed to make room. Real loopback
// sockets: 127.0.0.1 and 127.0.0.2 are two client addresses.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/http_endpoint.h"
#include "base/metrics.h"
#include "tests/base/raw_http_client.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;

constexpr const char* kRequest = "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n";

metrics::Counter& DroppedPerAddress() {
  return metrics::Global()
      .Counter("tessera_http_connections_dropped_total", "", {"reason"})
      .With({"per_address"});
}

// Polls `done` every 10 ms for up to 30 s: the endpoint works on its own thread.
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 3000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

// The answer to one request from `source`, read until the endpoint closes.
std::string Get(int port, const char* source) {
  RawClient client(port, 0, source);
  if (!client.connected()) return std::string("cannot connect from ") + source;
  if (!client.Send(kRequest)) return "cannot send";
  return client.ReadUntilClosed(60s);
}

TEST(HttpEndpointPeerLimitTest, OneAddressHoldsAtMostItsShareAndAnotherIsStillServed) {
  constexpr int kLimit = 3;
  auto options = MetricsOnly();
  options.max_connections_per_address = kLimit;
  options.read_timeout = 600s;  // the held connections stay open for the whole test
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  const int port = (*endpoint)->port();
  const double dropped_before = DroppedPerAddress().value();

  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < kLimit; ++i) {
    held.push_back(std::make_unique<RawClient>(port, 0, "127.0.0.1"));
    ASSERT_TRUE(held.back()->connected());
  }
  // One more from the same address is closed unserved, and counted.
  RawClient extra(port, 0, "127.0.0.1");
  ASSERT_TRUE(extra.connected());  // the kernel accepts it into the backlog; the endpoint closes it
  extra.Send(kRequest);
  bool closed = false;
  const std::string refused = extra.ReadUntilClosed(60s, &closed);
  EXPECT_TRUE(closed) << "the connection past the address's limit was not closed";
  EXPECT_EQ(refused, "") << "closed without an answer";
  EXPECT_TRUE(Eventually([&] { return DroppedPerAddress().value() >= dropped_before + 1; }))
      << "tessera_http_connections_dropped_total{reason=\"per_address\"} did not count it";

  // Another address is served meanwhile, and so is each connection the first address holds.
  EXPECT_EQ(Get(port, "127.0.0.2").rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
  for (auto& client : held) {
    ASSERT_TRUE(client->Send(kRequest));
    EXPECT_EQ(client->ReadUntilClosed(60s).rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
  }
  // Once they have closed, the address has its places back.
  held.clear();
  std::string again;
  EXPECT_TRUE(Eventually([&] {
    again = Get(port, "127.0.0.1");
    return again.rfind("HTTP/1.1 200 OK\r\n", 0) == 0;
  })) << again;
}

metrics::Counter& DroppedIdle() {
  return metrics::Global().Counter("tessera_http_connections_dropped_total", "", {"reason"}).With({"idle"});
}

// Past max_connections the oldest connection waiting for a request is closed, and a new one,
// from another address, is served.
TEST(HttpEndpointPeerLimitTest, PastTheTotalTheOldestWaitingIsClosedToMakeRoom) {
  auto options = MetricsOnly();
  options.max_connections = 2;
  options.max_connections_per_address = 2;
  options.read_timeout = 600s;  // the silent connections stay open unless closed to make room
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  const int port = (*endpoint)->port();
  const double dropped_before = DroppedIdle().value();

  RawClient oldest(port, 0, "127.0.0.1");
  ASSERT_TRUE(oldest.connected());
  // The kernel hands connections over in the order they came: the endpoint holds this one first.
  RawClient newer(port, 0, "127.0.0.1");
  ASSERT_TRUE(newer.connected());
  // A third, from another address, takes the oldest's place and is answered.
  EXPECT_EQ(Get(port, "127.0.0.2").rfind("HTTP/1.1 200 OK\r\n", 0), 0u);
  bool closed = false;
  EXPECT_EQ(oldest.ReadUntilClosed(60s, &closed), "");
  EXPECT_TRUE(closed) << "the oldest connection was not closed past max_connections";
  EXPECT_GE(DroppedIdle().value(), dropped_before + 1);
  // The newer one is still served.
  ASSERT_TRUE(newer.Send(kRequest));
  const std::string answer = newer.ReadUntilClosed(60s);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answer;
}

TEST(HttpEndpointPeerLimitTest, ATotalBelowOneOrBelowThePerAddressLimitIsRefused) {
  auto options = MetricsOnly();
  options.max_connections = 0;
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_FALSE(endpoint.ok());
  EXPECT_EQ(endpoint.status().message(), "HTTP endpoint option max_connections: expected at least 1, got 0");
  options = MetricsOnly();
  options.max_connections = 8;
  options.max_connections_per_address = 9;
  endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_FALSE(endpoint.ok());
  EXPECT_EQ(endpoint.status().message(),
            "HTTP endpoint option max_connections_per_address: expected at most max_connections (8), got 9");
}

TEST(HttpEndpointPeerLimitTest, ALimitBelowOneIsRefused) {
  auto options = MetricsOnly();
  options.max_connections_per_address = 0;
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_FALSE(endpoint.ok());
  EXPECT_EQ(endpoint.status().message(),
            "HTTP endpoint option max_connections_per_address: expected at least 1, got 0");
}

}  // namespace
}  // namespace tessera
