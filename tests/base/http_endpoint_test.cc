// HttpEndpoint: routes, refusals by `authorize`, event streams and their bound, exclusive port.
#include "base/http_endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "tests/base/raw_http_client.h"

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

// An event stream's reader ends a line at CR, LF or CR LF: each of them in an event's data
// starts a new data line, so that no text inside it is read as a field of its own.
TEST(HttpEndpointTest, EveryLineBreakInAnEventsDataStartsADataLine) {
  auto options = Options();
  options.routes.push_back({"/breaks", nullptr, [](const HttpRequest&, const EventSender& send) {
                              send("note", "a\rretry: 1\r\nb\nc\r");
                            }});
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok());
  httplib::Client client("127.0.0.1", (*endpoint)->port());
  auto events = client.Get("/breaks");
  ASSERT_TRUE(events);
  EXPECT_EQ(events->body, "event: note\ndata: a\ndata: retry: 1\ndata: b\ndata: c\ndata: \n\n");
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

TEST(HttpEndpointTest, TooManyHeaderLinesAreRefusedBeforeAuthorizeAndTheConnectionCloses) {
  auto options = Options();
  std::atomic<int> authorized{0};
  options.authorize = [&](const HttpRequest&) {
    ++authorized;
    return Status::Ok();
  };
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok());
  RawClient client((*endpoint)->port());
  ASSERT_TRUE(client.connected());
  std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 200; ++i) request += "X-Filler-" + std::to_string(i) + ": v\r\n";
  client.Send(request);  // no blank line: the server must not wait for one
  bool closed = false;
  const std::string answer = client.ReadUntilClosed(std::chrono::seconds(30), &closed);
  EXPECT_EQ(answer.rfind("HTTP/1.1 431 ", 0), 0u) << answer;
  EXPECT_NE(answer.find("more than 64 header lines"), std::string::npos) << answer;
  EXPECT_NE(answer.find("Connection: close"), std::string::npos) << answer;
  EXPECT_TRUE(closed);
  EXPECT_EQ(authorized.load(), 0);
}

TEST(HttpEndpointTest, AHeadThatTricklesInPastTheReadTimeoutIsCutOff) {
  auto options = Options();
  options.read_timeout = std::chrono::seconds(1);
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok());
  RawClient client((*endpoint)->port());
  ASSERT_TRUE(client.connected());
  // A header line every 100 ms, each well inside the read timeout, for up to 20 s, until the
  // server answers: sending on past its lingering close would draw a reset, which can discard
  // the answer before it is read on a loaded machine.
  client.Send("GET /metrics HTTP/1.1\r\n");
  std::string answer;
  bool closed = false;
  for (int i = 0; i < 200 && !closed && answer.empty(); ++i) {
    if (!client.Send("X-" + std::to_string(i) + ": v\r\n")) break;
    answer += client.ReadUntilClosed(std::chrono::milliseconds(100), &closed);
  }
  answer += client.ReadUntilClosed(std::chrono::seconds(5), &closed);
  EXPECT_TRUE(closed) << "the server gave up on the head";
  EXPECT_EQ(answer.rfind("HTTP/1.1 408 ", 0), 0u) << answer;
}

TEST(HttpEndpointTest, AnIdleConnectionIsClosedAfterTheReadTimeout) {
  auto options = Options();
  options.read_timeout = std::chrono::seconds(1);
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok());
  RawClient client((*endpoint)->port());
  ASSERT_TRUE(client.connected());
  bool closed = false;
  EXPECT_EQ(client.ReadUntilClosed(std::chrono::seconds(20), &closed), "") << "nothing was asked";
  EXPECT_TRUE(closed);
}

// Clients that connect and send nothing hold no thread and take no place in the queue: with
// one thread and more silent connections than the queue holds, a request is still answered,
// long before their read timeout.
TEST(HttpEndpointTest, ConnectionsThatSendNothingDoNotKeepARequestWaiting) {
  auto options = Options();
  options.threads = 1;
  options.read_timeout = std::chrono::seconds(600);
  options.max_connections_per_address = 100;  // every connection here is from 127.0.0.1
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok());
  std::vector<std::unique_ptr<RawClient>> silent;
  for (int i = 0; i < 80; ++i) {
    silent.push_back(std::make_unique<RawClient>((*endpoint)->port()));
    ASSERT_TRUE(silent.back()->connected());
  }
  RawClient client((*endpoint)->port());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Send("GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"));
  bool closed = false;
  const std::string answer = client.ReadUntilClosed(std::chrono::seconds(60), &closed);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answer;
  EXPECT_NE(answer.find("\r\n\r\nup 1\n"), std::string::npos) << answer;
  EXPECT_TRUE(closed);
  EXPECT_FALSE(silent.back()->ClosedByServer()) << "a silent client within its read timeout stays connected";
}

// Heads that arrive a byte at a time are read in the poll, not on a thread: with one thread
// and clients that have sent part of a head and nothing since, a whole request is still
// answered, long before their read timeout.
TEST(HttpEndpointTest, HeadsStillArrivingDoNotKeepARequestWaiting) {
  auto options = Options();
  options.threads = 1;
  options.read_timeout = std::chrono::seconds(600);
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok());
  std::vector<std::unique_ptr<RawClient>> slow;
  for (const std::string part : {"G", "GET /metrics HTTP/1.1\r\n", "GET /metrics HTTP/1.1\r\nX-A: b\r\n"}) {
    slow.push_back(std::make_unique<RawClient>((*endpoint)->port()));
    ASSERT_TRUE(slow.back()->connected());
    ASSERT_TRUE(slow.back()->Send(part));
  }
  RawClient client((*endpoint)->port());
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.Send("GET /metrics HTTP/1.1\r\n"));
  ASSERT_TRUE(client.Send("Connection: close\r\n\r\n"));
  bool closed = false;
  const std::string answer = client.ReadUntilClosed(std::chrono::seconds(60), &closed);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answer;
  EXPECT_TRUE(closed);
  // The slow ones are answered once their heads are whole.
  ASSERT_TRUE(slow.back()->Send("Connection: close\r\n\r\n"));
  closed = false;
  const std::string late = slow.back()->ReadUntilClosed(std::chrono::seconds(60), &closed);
  EXPECT_EQ(late.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << late;
  EXPECT_TRUE(closed);
  EXPECT_FALSE(slow.front()->ClosedByServer()) << "a slow client within its read timeout stays connected";
}

// A kept-alive connection between its requests holds no thread either: with one thread, a
// client that keeps its connection open after a request leaves the next client served, and
// is served again itself on the same connection.
TEST(HttpEndpointTest, AKeptAliveConnectionBetweenRequestsDoesNotKeepOthersWaiting) {
  auto options = Options();
  options.threads = 1;
  options.read_timeout = std::chrono::seconds(600);
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok());
  RawClient kept((*endpoint)->port());
  ASSERT_TRUE(kept.connected());
  ASSERT_TRUE(kept.Send("GET /api/echo?q=first HTTP/1.1\r\n\r\n"));
  std::string first;
  for (int i = 0; i < 600 && first.find("\r\n\r\nfirst") == std::string::npos; ++i) {
    first += kept.ReadUntilClosed(std::chrono::milliseconds(100));
  }
  ASSERT_NE(first.find("Connection: keep-alive\r\n\r\nfirst"), std::string::npos) << first;

  RawClient other((*endpoint)->port());
  ASSERT_TRUE(other.connected());
  ASSERT_TRUE(other.Send("GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"));
  bool closed = false;
  const std::string answer = other.ReadUntilClosed(std::chrono::seconds(60), &closed);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answer;
  EXPECT_TRUE(closed);

  ASSERT_TRUE(kept.Send("GET /api/echo?q=second HTTP/1.1\r\nConnection: close\r\n\r\n"));
  closed = false;
  const std::string second = kept.ReadUntilClosed(std::chrono::seconds(60), &closed);
  EXPECT_NE(second.find("\r\n\r\nsecond"), std::string::npos) << second;
  EXPECT_TRUE(closed);
}

TEST(HttpEndpointTest, KeepsAConnectionForSeveralRequestsIncludingPipelinedOnes) {
  auto endpoint = HttpEndpoint::Start(Options());
  ASSERT_TRUE(endpoint.ok());
  RawClient client((*endpoint)->port());
  ASSERT_TRUE(client.connected());
  client.Send("GET /api/echo?q=one HTTP/1.1\r\n\r\nHEAD /metrics HTTP/1.1\r\n\r\nGET /api/echo?q=two HTTP/1.1\r\nConnection: close\r\n\r\n");
  bool closed = false;
  const std::string answer = client.ReadUntilClosed(std::chrono::seconds(20), &closed);
  EXPECT_TRUE(closed) << "closed after the request that asked";
  const size_t first = answer.find("\r\n\r\none");
  const size_t head = answer.find("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: 5\r\n");
  const size_t second = answer.find("\r\n\r\ntwo");
  EXPECT_NE(first, std::string::npos) << answer;
  EXPECT_NE(head, std::string::npos) << answer;
  EXPECT_NE(second, std::string::npos) << answer;
  EXPECT_TRUE(first < head && head < second) << "in order: " << answer;
  EXPECT_EQ(answer.find("up 1"), std::string::npos) << "HEAD has no body: " << answer;
  EXPECT_EQ(answer.substr(answer.size() - 3), "two");
}

TEST(HttpEndpointTest, OtherMethodsAndBodiesAreRefused) {
  auto endpoint = HttpEndpoint::Start(Options());
  ASSERT_TRUE(endpoint.ok());
  const int port = (*endpoint)->port();
  struct Case {
    std::string request;
    std::string status_line;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 405 ", "GET and HEAD only, not 'POST'"},
           {"GET /metrics HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody", "HTTP/1.1 413 ", "no body"},
           {"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "HTTP/1.1 413 ", "no body"},
           {"GET /metrics HTTP/3\r\n\r\n", "HTTP/1.1 400 ", "HTTP/1.x"},
           {"GET /" + std::string(9000, 'a') + " HTTP/1.1\r\n\r\n", "HTTP/1.1 414 ", "longer than 8192"},
           {"HEAD /events HTTP/1.1\r\n\r\n", "HTTP/1.1 405 ", "Allow: GET\r\n"},
       }) {
    RawClient client(port);
    ASSERT_TRUE(client.connected());
    client.Send(c.request);
    if (c.status_line == "HTTP/1.1 405 " && c.request[0] == 'H') client.Send("GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
    bool closed = false;
    const std::string answer = client.ReadUntilClosed(std::chrono::seconds(20), &closed);
    EXPECT_EQ(answer.rfind(c.status_line, 0), 0u) << c.request.substr(0, 60) << " -> " << answer.substr(0, 200);
    EXPECT_NE(answer.find(c.says), std::string::npos) << answer.substr(0, 300);
    EXPECT_TRUE(closed) << c.request.substr(0, 60);
  }
}

TEST(HttpEndpointTest, HeadersAHandlerSetCannotSplitTheResponse) {
  auto options = Options();
  options.routes.push_back({"/split", [](const HttpRequest&) {
                              return HttpResponse{200, "text/plain", "ok", {{"X-Good", "yes"}, {"X-Bad", "a\r\nSet-Cookie: x=1"}}};
                            }, nullptr});
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok());
  httplib::Client client("127.0.0.1", (*endpoint)->port());
  auto r = client.Get("/split");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("X-Good"), "yes");
  EXPECT_FALSE(r->has_header("X-Bad"));
  EXPECT_FALSE(r->has_header("Set-Cookie"));
}

TEST(HttpEndpointTest, AnEventStreamWhoseReaderLeftEnds) {
  auto options = Options();
  std::atomic<bool> ended{false};
  options.routes.push_back({"/quiet", nullptr, [&](const HttpRequest&, const EventSender& send) {
                              // Only keep-alive checks, which write nothing for 15 s: the reader's
                              // going must still be noticed.
                              for (int i = 0; i < 3000 && send("", ""); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
                              ended = true;
                            }});
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok());
  {
    RawClient client((*endpoint)->port());
    ASSERT_TRUE(client.connected());
    client.Send("GET /quiet HTTP/1.1\r\n\r\n");
    const std::string head = client.ReadUntilClosed(std::chrono::milliseconds(500));
    EXPECT_NE(head.find("Content-Type: text/event-stream"), std::string::npos) << head;
  }
  for (int i = 0; i < 2000 && !ended; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(ended.load()) << "the handler's send() failed once the reader closed";
}

}  // namespace
}  // namespace tessera
