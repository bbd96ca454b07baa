// HttpEndpoint: routes, refusals by `authorize`, event streams and their bound, exclusive port.
#include "base/http_endpoint.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <thread>

namespace tessera {
namespace {

HttpEndpointOptions Options() {
  HttpEndpointOptions options;
  options.routes.push_back({"/metrics", [](const HttpRequest&) {
                              return HttpResponse{200, "text/plain; version=0.0.4", "up 1\n", {}};
                            }, nullptr});
  options.routes.push_back({"/api/echo", [](const HttpRequest& r) {
                              auto it = r.params.find("q");
                              return HttpResponse{200, "text/plain", it == r.params.end() ? "" : it->second, {}};
                            }, nullptr});
  options.routes.push_back({"/events", nullptr, [](const HttpRequest&, const EventSender& send) {
                              for (int i = 0; i < 3; ++i) {
                                if (!send("round", "{\"round\":" + std::to_string(i) + "}")) return;
                              }
                            }});
  return options;
}

TEST(HttpEndpointTest, ServesRoutesAndSaysWhatIsNotThere) {
  auto endpoint = HttpEndpoint::Start(Options());
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  httplib::Client client("127.0.0.1", (*endpoint)->port());
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->body, "up 1\n");
  EXPECT_EQ(metrics->get_header_value("Content-Type"), "text/plain; version=0.0.4");
  auto echo = client.Get("/api/echo?q=hello");
  ASSERT_TRUE(echo);
  EXPECT_EQ(echo->body, "hello");
  auto missing = client.Get("/nope%0Aforged");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->body.find('\n'), missing->body.size() - 1) << "the path is shown escaped: " << missing->body;
  EXPECT_EQ((*endpoint)->url(), "http://127.0.0.1:" + std::to_string((*endpoint)->port()));
}

TEST(HttpEndpointTest, AuthorizeRefusesBeforeAnyHandlerRuns) {
  auto options = Options();
  options.authorize = [](const HttpRequest& r) {
    if (r.authorization.empty()) return UnauthenticatedError("an operator credential is needed");
    if (r.authorization != "Bearer right") return PermissionDeniedError("wrong token");
    return Status::Ok();
  };
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok());
  httplib::Client client("127.0.0.1", (*endpoint)->port());
  auto none = client.Get("/metrics");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(none->body, "an operator credential is needed\n");
  auto wrong = client.Get("/metrics", {{"Authorization", "Bearer wrong"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 403);
  auto right = client.Get("/metrics", {{"Authorization", "Bearer right"}});
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200);
}

TEST(HttpEndpointTest, EventStreamsSendEventsAndAreBounded) {
  auto options = Options();
  std::atomic<bool> release{false};
  options.routes.push_back({"/hold", nullptr, [&](const HttpRequest&, const EventSender& send) {
                              while (!release.load() && send("", "")) std::this_thread::sleep_for(std::chrono::milliseconds(20));
                            }});
  options.max_streams = 1;
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok());
  httplib::Client client("127.0.0.1", (*endpoint)->port());
  auto events = client.Get("/events");
  ASSERT_TRUE(events);
  EXPECT_EQ(events->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_EQ(events->body,
            "event: round\ndata: {\"round\":0}\n\nevent: round\ndata: {\"round\":1}\n\nevent: round\ndata: {\"round\":2}\n\n");
  // One stream held open: the next is refused until it closes.
  std::atomic<int> holder_status{0};
  std::atomic<bool> holding{false};
  std::thread holder([&] {
    httplib::Client c("127.0.0.1", (*endpoint)->port());
    // Streamed: the response's status is known as soon as its headers arrive.
    auto r = c.Get(
        "/hold",
        [&](const httplib::Response& response) {
          holder_status = response.status;
          holding = true;
          return true;
        },
        [](const char*, size_t) { return true; });
    if (!holding) holder_status = r ? r->status : -1;
  });
  for (int i = 0; i < 500 && !holding && holder_status == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(holder_status.load(), 200) << "the first stream is held open";
  httplib::Client second("127.0.0.1", (*endpoint)->port());
  int refused_status = 0;
  std::string refused_body;
  for (int i = 0; i < 200 && refused_status != 503; ++i) {
    if (auto r = second.Get("/events")) {
      refused_status = r->status;
      refused_body = r->body;
    }
    if (refused_status != 503) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(refused_status, 503);
  EXPECT_NE(refused_body.find("too many open event streams (at most 1)"), std::string::npos) << refused_body;
  release = true;
  holder.join();
  int again = 0;
  for (int i = 0; i < 200 && again != 200; ++i) {
    if (auto r = second.Get("/events")) again = r->status;
    if (again != 200) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(again, 200) << "the slot is free again once the held stream ends";
}

TEST(HttpEndpointTest, APortInUseIsRefused) {
  auto first = HttpEndpoint::Start(Options());
  ASSERT_TRUE(first.ok());
  auto options = Options();
  options.port = (*first)->port();
  auto second = HttpEndpoint::Start(std::move(options));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().message(), "cannot listen on 127.0.0.1:" + std::to_string((*first)->port()) +
                                           " for HTTP (in use, or not an address of this machine)");
}

TEST(HttpEndpointTest, StopEndsAnOpenStream) {
  auto options = Options();
  options.routes.push_back({"/forever", nullptr, [](const HttpRequest&, const EventSender& send) {
                              while (send("", "")) std::this_thread::sleep_for(std::chrono::milliseconds(20));
                            }});
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok());
  std::thread reader([port = (*endpoint)->port()] {
    httplib::Client c("127.0.0.1", port);
    c.Get("/forever");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  (*endpoint)->Stop();  // returns: the stream noticed
  reader.join();
}

}  // namespace
}  // namespace tessera
