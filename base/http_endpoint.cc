#include "base/http_endpoint.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>

#include "base/escape.h"
#include "base/http_connection.h"
#include "base/http_peer_limit.h"
#include "base/http_request.h"
#include "base/http_tls.h"
#include "base/metrics.h"

namespace tessera {

namespace {

using http_internal::Clock;
using http_internal::Connection;
using http_internal::FillPeer;
using http_internal::PeerConnections;
using http_internal::SetUpTls;

// Connections accepted while every thread is busy wait in a queue of at most this many; more
// are closed at once.
constexpr size_t kMaxWaitingConnections = 64;
// Requests on one connection before it is closed, and the longest a response may take to write
// (a client that reads a byte now and then holds a thread no longer).
constexpr int kMaxRequestsPerConnection = 20;
constexpr auto kResponseDeadline = std::chrono::seconds(120);
constexpr size_t kReadChunk = 16 * 1024;
// TLS handshakes are worked on by threads of their own, not by the poll: a full handshake is
// a private-key operation, a millisecond or more of CPU, and a client that opens handshake
// after handshake would otherwise slow accepting and reading heads for everyone. At most one
// step of one client address's handshakes is worked on at a time, so that such a client delays
// another's handshake by one step at most.
constexpr size_t kHandshakeThreads = 2;

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

// A header a handler set goes out only when it cannot break the head: a token name, a value
// without line breaks or NUL.
bool SafeHeader(const std::string& name, const std::string& value) {
  if (name.empty()) return false;
  for (const char c : name) {
    if (c <= 0x20 || c == ':' || c == 0x7f) return false;
  }
  return value.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos;
}

std::string ResponseHead(int status, const std::string& content_type, const std::string* body,
                         const std::vector<std::pair<std::string, std::string>>& headers, bool keep_alive, bool chunked) {
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + ReasonPhrase(status) + "\r\n";
  const bool no_body = status == 204 || status == 304;
  if (!no_body && SafeHeader("Content-Type", content_type)) head += "Content-Type: " + content_type + "\r\n";
  if (body != nullptr && !no_body) head += "Content-Length: " + std::to_string(body->size()) + "\r\n";
  if (chunked) head += "Transfer-Encoding: chunked\r\n";
  for (const auto& [name, value] : headers) {
    if (SafeHeader(name, value)) head += name + ": " + value + "\r\n";
  }
  head += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return head;
}

// The client's address (its bytes, without the port), whose handshakes take turns and whose
// connections are counted against max_connections_per_address.
std::string PeerAddress(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address).sin_addr;
    return std::string(reinterpret_cast<const char*>(&v4), sizeof(v4));
  }
  if (address.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address).sin6_addr;
    return std::string(reinterpret_cast<const char*>(&v6), sizeof(v6));
  }
  return "";
}

// A connection and where it stands between the threads that serve it, the handshake threads
// and the poll it waits in while idle.
struct Client {
  Client(int fd, int stop_fd, std::string address, PeerConnections::Slot slot)
      : slot(std::move(slot)), connection(fd, stop_fd), address(std::move(address)) {}
  PeerConnections::Slot slot;  // its address's count, given back once the connection has closed
  Connection connection;
  std::string address;         // PeerAddress
  bool started = false;        // its first bytes arrived (its TLS handshake, if any, begun)
  bool handshake_due = false;  // its handshake's next step has input: it waits for a handshake thread
  bool failed = false;         // its handshake failed, or its time ran out, on a handshake thread
  HttpRequest peer;            // filled once the handshake is done
  HttpHeadReader reader;
  int served = 0;                // requests answered
  Clock::time_point idle_until;  // while in the poll: when the read timeout closes it
  std::string refusal;           // a refusal's bytes the socket has not taken yet
  bool closing = false;          // refused: its input is dropped until it closes or idle_until
};

// Connections closed unserved, by why: counted for the process's /metrics.
metrics::CounterFamily& DroppedConnections() {
  return metrics::Global().Counter("tessera_http_connections_dropped_total",
                                   "Connections the HTTP endpoint closed unserved: per_address (its client address "
                                   "held max_connections_per_address already), queue (every thread busy and the "
                                   "queue full), idle (the oldest waiting for a request, closed to keep the "
                                   "connections within max_connections)",
                                   {"reason"});
}

}  // namespace

struct HttpEndpoint::Shared {
  HttpEndpointOptions options;
  std::unique_ptr<PeerConnections> peers;
  metrics::Counter& dropped_per_address = DroppedConnections().With({"per_address"});
  metrics::Counter& dropped_queue = DroppedConnections().With({"queue"});
  metrics::Counter& dropped_idle = DroppedConnections().With({"idle"});
  SSL_CTX* ssl_ctx = nullptr;
  int listen_fd = -1;
  int stop_fd = -1;
  int wake_fd = -1;  // tells the accepting thread that connections came back idle
  std::atomic<bool> stopping{false};
  std::atomic<int> streams{0};
  std::mutex mu;
  std::condition_variable waiting_changed;
  std::deque<std::unique_ptr<Client>> waiting;   // connections with input no thread has taken yet
  std::vector<std::unique_ptr<Client>> returned;  // idle again after a request, for the poll
  std::condition_variable handshakes_changed;
  std::deque<std::unique_ptr<Client>> handshakes;  // a handshake step due, for the handshake threads
  std::vector<std::unique_ptr<Client>> shaken;     // back from a handshake step, for the poll

  ~Shared() {
    waiting.clear();
    returned.clear();
    handshakes.clear();
    shaken.clear();
    if (wake_fd >= 0) ::close(wake_fd);
    if (listen_fd >= 0) ::close(listen_fd);
    if (stop_fd >= 0) ::close(stop_fd);
    if (ssl_ctx != nullptr) SSL_CTX_free(ssl_ctx);
  }

  void Accept();
  // In the accepting thread: reads what has arrived of the client's request head, without
  // waiting, once a handshake thread has done its TLS handshake (until then it is marked
  // handshake_due when input arrives). kReady once a head is whole and to be answered, for a
  // thread; a head that is refused is answered here.
  enum class Step { kWait, kReady, kClose };
  Step Progress(Client& client);
  // In the accepting thread: answers the client with `status` and closes it, writing what the
  // socket takes now and the rest as it takes it, within the read timeout.
  Step Refuse(Client& client, int status, const std::string& body,
              const std::vector<std::pair<std::string, std::string>>& headers = {}, bool with_body = true);
  Step WriteRefusal(Client& client);
  // In the accepting thread: the client's read timeout has passed. True while it is still
  // being answered or lingers.
  bool TimedOut(Client& client);
  // A handshake thread: one step of a client's TLS handshake at a time, as far as its input
  // goes, then back to the poll.
  void Handshake();
  void Serve();
  // Answers the client's requests whose heads have arrived whole; true when it is to wait in
  // the poll for its next one, false when it is to close.
  bool ServeConnection(Client& client);
  // Answers one request; false when the connection is to close after it.
  bool Answer(Connection& connection, const HttpRequestHead& head, const HttpRequest& peer, bool last);
  void Stream(Connection& connection, const HttpRoute& route, const HttpRequest& request, bool chunked);
};

void HttpEndpoint::Shared::Accept() {
  // A connection is handed to a thread only once a request's head has arrived whole: the head
  // is read here, as its bytes arrive (the TLS handshake before it on the handshake threads), so
  // that connections that send nothing, or send a head a byte at a time, cannot hold every
  // thread, nor fill the queue, each for a read timeout, while a scrape waits behind them.
  std::deque<std::unique_ptr<Client>> idle;  // roughly in the order their timeouts end
  std::set<std::string> shaking;  // addresses with a client on the handshake threads
  size_t on_handshake_threads = 0;
  std::vector<pollfd> polled;
  for (;;) {
    polled.assign({{listen_fd, POLLIN, 0}, {stop_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}});
    auto next = Clock::time_point::max();
    for (const auto& c : idle) {
      // One whose handshake step is due has its input already: it waits for a handshake
      // thread, not for its socket (a negative descriptor is not polled).
      polled.push_back({c->handshake_due ? -1 : c->connection.fd(), c->closing ? short{POLLIN} : c->connection.want(), 0});
      next = std::min(next, c->idle_until);
    }
    int wait_ms = -1;
    if (next != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
      wait_ms = static_cast<int>(std::clamp<long long>(left, 0, 60'000));
    }
    const int n = ::poll(polled.data(), polled.size(), wait_ms);
    if (stopping.load() || (n > 0 && polled[1].revents != 0)) return;  // `idle` closes them
    if (n < 0) continue;
    // Those whose head is whole go to the threads; those idle past the read timeout close.
    std::deque<std::unique_ptr<Client>> still;
    auto keep = [&](std::unique_ptr<Client> client) {
      // A head that goes on trickling in is cut off at its deadline all the same.
      if (Clock::now() < client->idle_until || TimedOut(*client)) still.push_back(std::move(client));
    };
    auto place = [&](std::unique_ptr<Client> client) {
      const Step step = Progress(*client);
      if (step == Step::kWait) {
        keep(std::move(client));
      } else if (step == Step::kReady) {
        std::lock_guard<std::mutex> lock(mu);
        if (waiting.size() < kMaxWaitingConnections) {
          waiting.push_back(std::move(client));
          waiting_changed.notify_one();
        } else {
          dropped_queue.Inc();
        }
      }
    };
    const Clock::time_point now = Clock::now();
    for (size_t i = 0; i < idle.size(); ++i) {
      if (polled[i + 3].revents != 0) {
        place(std::move(idle[i]));
      } else if (now < idle[i]->idle_until || TimedOut(*idle[i])) {
        still.push_back(std::move(idle[i]));
      }
    }
    if (polled[2].revents != 0) {
      uint64_t count = 0;
      [[maybe_unused]] const ssize_t drained = ::read(wake_fd, &count, sizeof(count));
      std::vector<std::unique_ptr<Client>> back;
      std::vector<std::unique_ptr<Client>> stepped;
      {
        std::lock_guard<std::mutex> lock(mu);
        back.swap(returned);
        stepped.swap(shaken);
      }
      for (auto& client : stepped) {
        --on_handshake_threads;
        shaking.erase(client->address);
        if (client->failed) continue;  // closed as `client` goes
        // Done: read at once, TLS may hold the request already. Not yet: wait for its input.
        if (client->connection.handshaken()) {
          place(std::move(client));
        } else {
          keep(std::move(client));
        }
      }
      // Read at once: bytes of the next request may already be held (by TLS, or pipelined).
      for (auto& client : back) place(std::move(client));
    }
    if ((polled[0].revents & POLLIN) != 0) {
      sockaddr_storage address{};
      socklen_t address_size = sizeof(address);
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&address), &address_size,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        std::string peer = PeerAddress(address);
        PeerConnections::Slot slot = peers->Take(peer);
        if (!slot.held()) {
          // Its address holds its share of the connections already: closed at once, as the
          // connections past the queue are, so that one address cannot hold them all.
          ::close(fd);
          dropped_per_address.Inc();
        } else {
          auto client = std::make_unique<Client>(fd, stop_fd, std::move(peer), std::move(slot));
          client->idle_until = Clock::now() + options.read_timeout;
          still.push_back(std::move(client));
        }
      } else if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: wait a little rather than spin on the same refusal.
        pollfd s{stop_fd, POLLIN, 0};
        ::poll(&s, 1, 50);
      }
    }
    // Due handshake steps go to the handshake threads, the longest waiting first, one client
    // of an address at a time; the rest wait here, their read timeout running.
    std::vector<std::unique_ptr<Client>> due;
    for (auto& client : still) {
      if (on_handshake_threads == kHandshakeThreads) break;
      if (!client->handshake_due || !shaking.insert(client->address).second) continue;
      ++on_handshake_threads;
      due.push_back(std::move(client));
    }
    if (!due.empty()) {
      still.erase(std::remove(still.begin(), still.end(), nullptr), still.end());
      std::lock_guard<std::mutex> lock(mu);
      for (auto& client : due) handshakes.push_back(std::move(client));
      handshakes_changed.notify_all();
    }
    // Connections with nothing to answer yet (new ones, those whose TLS handshake or request
    // head is still arriving, kept-alive ones between requests) wait here, not on a thread of
    // their own; past max_connections, counting those on the handshake threads, queued and
    // being answered, the oldest here is closed (a new one itself when it is alone here).
    while (!still.empty() && peers->Held() > static_cast<size_t>(options.max_connections)) {
      still.pop_front();  // its slot is given back as it closes
      dropped_idle.Inc();
    }
    idle.swap(still);
  }
}

void HttpEndpoint::Shared::Handshake() {
  for (;;) {
    std::unique_ptr<Client> client;
    {
      std::unique_lock<std::mutex> lock(mu);
      handshakes_changed.wait(lock, [&] { return stopping.load() || !handshakes.empty(); });
      if (stopping.load()) return;
      client = std::move(handshakes.front());
      handshakes.pop_front();
    }
    client->handshake_due = false;
    if (Clock::now() >= client->idle_until) {
      client->failed = true;  // its read timeout passed while it waited for this thread
    } else {
      const int done = client->connection.TryHandshake();
      if (done < 0) client->failed = true;
      if (done > 0) {
        FillPeer(client->connection.ssl(), client->peer);
        client->idle_until = Clock::now() + options.read_timeout;  // the wait for the first request
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      shaken.push_back(std::move(client));
    }
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = ::write(wake_fd, &one, sizeof(one));
  }
}

HttpEndpoint::Shared::Step HttpEndpoint::Shared::Progress(Client& client) {
  Connection& connection = client.connection;
  if (!client.refusal.empty()) return WriteRefusal(client);
  if (client.closing) return connection.DropInput() ? Step::kWait : Step::kClose;
  if (!client.started) {
    client.started = true;
    int one = 1;
    ::setsockopt(connection.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (ssl_ctx != nullptr) {
      if (!connection.StartTls(ssl_ctx)) return Step::kClose;
      client.idle_until = Clock::now() + options.read_timeout;  // the handshake, from its first byte
    }
  }
  if (ssl_ctx != nullptr && !connection.handshaken()) {
    client.handshake_due = true;  // its input is taken by a handshake thread
    return Step::kWait;
  }
  HttpHeadReader& reader = client.reader;
  char chunk[kReadChunk];
  while (reader.state() == HttpHeadReader::State::kNeedMore) {
    const ssize_t n = connection.TryRead(chunk, sizeof(chunk));
    if (n == Connection::kWouldBlock) return Step::kWait;
    if (n <= 0) return Step::kClose;
    // The whole head must arrive within the read timeout from its first byte.
    if (reader.empty()) client.idle_until = Clock::now() + options.read_timeout;
    reader.Feed(std::string_view(chunk, static_cast<size_t>(n)));
  }
  // Refused heads are answered here, holding no thread.
  if (reader.state() == HttpHeadReader::State::kRefused) return Refuse(client, reader.status(), reader.reason() + "\n");
  const HttpRequestHead& head = reader.head();
  if (head.method != "GET" && head.method != "HEAD") {
    return Refuse(client, 405, "this port serves GET and HEAD only, not " + QuoteUntrusted(head.method, 16) + "\n",
                  {{"Allow", "GET, HEAD"}});
  }
  // The body's bytes are not read, so nothing after them can be.
  if (head.has_body) return Refuse(client, 413, "requests to this port carry no body\n", {}, head.method == "GET");
  return Step::kReady;
}

HttpEndpoint::Shared::Step HttpEndpoint::Shared::Refuse(
    Client& client, int status, const std::string& body, const std::vector<std::pair<std::string, std::string>>& headers,
    bool with_body) {
  client.refusal = ResponseHead(status, "text/plain; charset=utf-8", &body, headers, false, false) + (with_body ? body : "");
  client.idle_until = Clock::now() + options.read_timeout;
  return WriteRefusal(client);
}

HttpEndpoint::Shared::Step HttpEndpoint::Shared::WriteRefusal(Client& client) {
  while (!client.refusal.empty()) {
    const ssize_t n = client.connection.TryWrite(client.refusal);
    if (n == Connection::kWouldBlock) return Step::kWait;  // the rest when the socket takes it
    if (n < 0) return Step::kClose;
    client.refusal.erase(0, static_cast<size_t>(n));
  }
  // Written: the request may not have been read to its end, so the close lingers.
  client.connection.StartLingeringClose();
  client.closing = true;
  client.idle_until = Clock::now() + Connection::kLinger;
  return Step::kWait;
}

bool HttpEndpoint::Shared::TimedOut(Client& client) {
  // Only a head cut off part way is told why; a connection silent since its last answer (or
  // its handshake), or whose refusal or lingering close ran out of time, just closes.
  if (client.closing || !client.refusal.empty() || client.reader.empty() || stopping.load()) return false;
  // Into a send buffer that may still hold earlier answers the client has not read: what fits
  // now, the rest as the client reads, within the read timeout.
  const std::string body =
      "the request's head did not arrive within " + std::to_string(options.read_timeout.count()) + " s\n";
  return Refuse(client, 408, body) == Step::kWait;
}

void HttpEndpoint::Shared::Serve() {
  for (;;) {
    std::unique_ptr<Client> client;
    {
      std::unique_lock<std::mutex> lock(mu);
      waiting_changed.wait(lock, [&] { return stopping.load() || !waiting.empty(); });
      if (stopping.load()) return;
      client = std::move(waiting.front());
      waiting.pop_front();
    }
    if (!ServeConnection(*client)) continue;  // closed as `client` goes
    client->idle_until = Clock::now() + options.read_timeout;
    {
      std::lock_guard<std::mutex> lock(mu);
      returned.push_back(std::move(client));
    }
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = ::write(wake_fd, &one, sizeof(one));
  }
}

bool HttpEndpoint::Shared::ServeConnection(Client& client) {
  Connection& connection = client.connection;
  HttpHeadReader& reader = client.reader;
  for (; client.served < kMaxRequestsPerConnection; ++client.served) {
    // The next request's head goes on arriving in the poll, not here, and a refused one is
    // answered there.
    const HttpRequestHead& head = reader.head();
    if (reader.state() != HttpHeadReader::State::kDone || (head.method != "GET" && head.method != "HEAD") ||
        head.has_body) {
      return !stopping.load();
    }
    if (!Answer(connection, reader.head(), client.peer, client.served + 1 == kMaxRequestsPerConnection)) return false;
    reader.Restart(reader.rest());
  }
  return false;
}

bool HttpEndpoint::Shared::Answer(Connection& connection, const HttpRequestHead& head, const HttpRequest& peer,
                                  bool last) {
  const auto stall = std::chrono::duration_cast<std::chrono::milliseconds>(options.read_timeout);
  const Clock::time_point deadline = Clock::now() + kResponseDeadline;
  bool keep_alive = head.keep_alive && !last && !stopping.load();
  const bool head_only = head.method == "HEAD";
  auto respond = [&](const HttpResponse& response) {
    std::string out = ResponseHead(response.status, response.content_type, &response.body, response.headers,
                                   keep_alive, false);
    if (!head_only && response.status != 204) out += response.body;
    return connection.WriteAll(out, stall, deadline) && keep_alive;
  };
  auto text = [](int status, std::string body) {
    return HttpResponse{status, "text/plain; charset=utf-8", std::move(body), {}};
  };
  // Other methods and bodies were refused in the poll.
  HttpRequest request = peer;
  request.path = head.path;
  request.params = head.params;
  request.authorization = head.authorization;
  if (options.authorize) {
    if (Status s = options.authorize(request); !s.ok()) {
      HttpResponse refusal = text(s.code() == StatusCode::kUnauthenticated ? 401 : 403, s.message() + "\n");
      if (refusal.status == 401) refusal.headers.emplace_back("WWW-Authenticate", "Bearer");
      return respond(refusal);
    }
  }
  const HttpRoute* route = nullptr;
  for (const auto& r : options.routes) {
    const bool prefix = !r.path.empty() && r.path.back() == '/' && r.path.size() > 1;
    if (request.path == r.path || (prefix && request.path.rfind(r.path, 0) == 0)) {
      route = &r;
      break;
    }
  }
  if (route == nullptr) return respond(text(404, "no page " + EscapeUntrusted(request.path, 128) + " here\n"));
  if (route->handler) return respond(route->handler(request));
  if (head_only) {
    HttpResponse refusal = text(405, "an event stream is read with GET\n");
    refusal.headers.emplace_back("Allow", "GET");
    return respond(refusal);
  }
  const int max_streams = std::max(1, options.max_streams);
  if (streams.fetch_add(1) >= max_streams) {
    streams.fetch_sub(1);
    return respond(text(503, "too many open event streams (at most " + std::to_string(max_streams) +
                                 "); try again later\n"));
  }
  Stream(connection, *route, request, head.minor_version >= 1);
  streams.fetch_sub(1);
  return false;  // a stream's connection closes when the stream ends
}

void HttpEndpoint::Shared::Stream(Connection& connection, const HttpRoute& route, const HttpRequest& request,
                                  bool chunked) {
  const auto stall = std::chrono::duration_cast<std::chrono::milliseconds>(options.read_timeout);
  const std::string head =
      ResponseHead(200, "text/event-stream", nullptr, {{"Cache-Control", "no-store"}}, false, chunked);
  if (!connection.WriteAll(head, stall, Clock::now() + stall)) return;
  auto last_write = Clock::now();
  bool failed = false;
  EventSender send = [&](const std::string& name, const std::string& data) {
    if (failed || stopping.load() || connection.PeerGone()) return false;
    std::string frame;
    if (name.empty() && data.empty()) {
      if (Clock::now() - last_write < options.stream_heartbeat) return true;
      frame = ": keep-alive\n\n";
    } else {
      if (!name.empty()) frame += "event: " + name + "\n";
      // A reader ends a line at CR, LF or CR LF: each starts a data line of its own.
      size_t start = 0;
      for (size_t nl = data.find_first_of("\r\n");; nl = data.find_first_of("\r\n", start)) {
        frame += "data: " + data.substr(start, nl == std::string::npos ? std::string::npos : nl - start) + "\n";
        if (nl == std::string::npos) break;
        start = nl + (data.compare(nl, 2, "\r\n") == 0 ? 2 : 1);
      }
      frame += "\n";
    }
    if (chunked) {
      char size[24];
      std::snprintf(size, sizeof(size), "%zx\r\n", frame.size());
      frame = size + frame + "\r\n";
    }
    last_write = Clock::now();
    failed = !connection.WriteAll(frame, stall, Clock::now() + kResponseDeadline);
    return !failed;
  };
  route.stream(request, send);
  if (chunked && !failed && !stopping.load()) connection.WriteAll("0\r\n\r\n", stall, Clock::now() + stall);
}

Result<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(HttpEndpointOptions options) {
  std::unique_ptr<HttpEndpoint> endpoint(new HttpEndpoint());
  auto shared = std::make_shared<Shared>();
  endpoint->shared_ = shared;
  endpoint->host_ = options.host;
  // A TLS write to a peer that went away raises SIGPIPE (OpenSSL writes with write(2)): ignore
  // it unless the program handles it, so the write fails instead.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  if (!options.cert_pem.empty()) {
    shared->ssl_ctx = SSL_CTX_new(TLS_server_method());
    if (shared->ssl_ctx == nullptr ||
        !SetUpTls(*shared->ssl_ctx, options.cert_pem, options.key_pem, options.client_ca_pem)) {
      ERR_clear_error();
      return InvalidArgumentError("the HTTP endpoint's TLS certificate, key or client CA did not load");
    }
    SSL_CTX_set_options(shared->ssl_ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET);
    // No session is resumed: every connection's certificate is verified afresh (a resumed one
    // would skip that, letting an expired certificate back in). With client certificates asked
    // for, OpenSSL fails the handshake of a client that offers a session this context could
    // resume; with none issued or cached, an offered session is a full handshake.
    SSL_CTX_set_session_cache_mode(shared->ssl_ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(shared->ssl_ctx, 0);
    SSL_CTX_set_mode(shared->ssl_ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    endpoint->tls_ = true;
  }
  const std::string where = options.host + ":" + std::to_string(options.port);
  const std::string refused = "cannot listen on " + where + " for HTTP (in use, or not an address of this machine)";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (options.port < 0 || options.port > 65535) return UnavailableError(refused);
  // A numeric host is used as it is. A name is looked up with no deadline: the endpoint starts
  // with its daemon, which waits for it before it serves.
  const std::string service = std::to_string(options.port);
  if (::getaddrinfo(options.host.c_str(), service.c_str(), &hints, &found) != 0) {
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    if (::getaddrinfo(options.host.c_str(), service.c_str(), &hints, &found) != 0) return UnavailableError(refused);
  }
  for (addrinfo* a = found; a != nullptr && shared->listen_fd < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    // The port is this daemon's alone: SO_REUSEADDR for quick restarts, never SO_REUSEPORT.
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      shared->listen_fd = fd;
    } else {
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (shared->listen_fd < 0) return UnavailableError(refused);
  sockaddr_storage bound{};
  socklen_t bound_size = sizeof(bound);
  if (::getsockname(shared->listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_size) != 0) {
    return UnavailableError(refused);
  }
  endpoint->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                      : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  shared->stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  shared->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (shared->stop_fd < 0 || shared->wake_fd < 0) return UnavailableError("cannot serve HTTP on " + where + ": " + std::strerror(errno));
  if (options.max_connections < 1) {
    return InvalidArgumentError("HTTP endpoint option max_connections: expected at least 1, got " +
                                std::to_string(options.max_connections));
  }
  if (options.max_connections_per_address < 1) {
    return InvalidArgumentError("HTTP endpoint option max_connections_per_address: expected at least 1, got " +
                                std::to_string(options.max_connections_per_address));
  }
  if (options.max_connections_per_address > options.max_connections) {
    return InvalidArgumentError("HTTP endpoint option max_connections_per_address: expected at most max_connections (" +
                                std::to_string(options.max_connections) + "), got " +
                                std::to_string(options.max_connections_per_address));
  }
  shared->peers = std::make_unique<PeerConnections>(static_cast<size_t>(options.max_connections_per_address));
  shared->options = std::move(options);
  const int threads = std::max(1, shared->options.threads);
  for (int i = 0; i < threads; ++i) endpoint->threads_.emplace_back([shared] { shared->Serve(); });
  if (shared->ssl_ctx != nullptr) {
    for (size_t i = 0; i < kHandshakeThreads; ++i) endpoint->threads_.emplace_back([shared] { shared->Handshake(); });
  }
  endpoint->threads_.emplace_back([shared] { shared->Accept(); });
  return endpoint;
}

std::string HttpEndpoint::url() const {
  const bool v6 = host_.find(':') != std::string::npos;
  return std::string(tls_ ? "https" : "http") + "://" + (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

void HttpEndpoint::Stop() {
  if (!shared_ || shared_->stopping.exchange(true)) return;
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t written = ::write(shared_->stop_fd, &one, sizeof(one));
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->waiting_changed.notify_all();
    shared_->handshakes_changed.notify_all();
  }
  for (auto& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

HttpEndpoint::~HttpEndpoint() { Stop(); }

}  // namespace tessera
