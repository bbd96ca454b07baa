// A small HTTP(S) server for what a daemon shows to people and to Prometheus: /metrics, the
// coordinator's dashboard and its read-only JSON, and server-sent event streams. GET and HEAD.
//
// Every request is checked by `authorize` before its handler runs (the coordinator lets
// operators in: a client certificate of the operator role, or the admin token as a bearer
// token). Everything a client sends is bounded before it is looked at: the TLS handshake and
// each request's head must arrive within the read timeout, whole; the request line and each
// header line at most 8 KiB, at most 64 header lines, 32 KiB in all (base/http_request.h); no
// body; at most 20 requests a connection. A connection takes a thread only while a request of
// its own is being answered: each request's head is read by the poll that accepts connections,
// as its bytes arrive, a refused one is answered there, and before its first request and
// between requests it waits there, at most the read timeout, so that clients that connect and
// send nothing, send a head a byte at a time, send heads that are refused, or keep a connection
// open between requests, hold no thread. The endpoint holds at most max_connections
// connections (256) at once, whatever they are doing: past them the oldest waiting in the poll
// is closed to make room. TLS handshakes are worked on by two threads of their own, one step of one client
// address's handshakes at a time, as their bytes arrive, so that a client that opens handshake
// after handshake slows neither the poll nor, by more than one step, another address's.
// `threads` connections are served at once, at most 64 more wait, the rest are closed; event
// streams are bounded apart. One client address holds at most max_connections_per_address
// connections, whatever they are doing; more from it are closed as soon as they are accepted,
// so that one address cannot take every place. The daemons set both limits from their
// --metrics-max-connections and --metrics-max-connections-per-address flags
// (base/http_limit_flags.h). Connections closed unserved are counted in
// tessera_http_connections_dropped_total{reason} (per_address, queue, idle) of the process's
// metrics. The port is bound without SO_REUSEPORT, so a second daemon cannot
// share it.
//
// Our own, on POSIX sockets and OpenSSL: a library server read every header line a client sent
// before any check could run.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"

namespace tessera {

struct HttpRequest {
  std::string path;
  std::map<std::string, std::string> params;  // the query string's, first value of each
  std::string authorization;                  // the Authorization header, if any
  // The client certificate the TLS handshake verified against the client CA, if any.
  bool client_certificate = false;
  std::string client_cn;
  std::string client_ou;
  std::string client_serial;  // upper-case hex in whole bytes, as BN_bn2hex prints it
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// An event stream's writer: send() one `data:` event (false once the client is gone or the
// endpoint stops); the handler returns when it is done or send() fails. Each line break in
// the data (CR, LF or CR LF) starts a `data:` line of its own.
using EventSender = std::function<bool(const std::string& event_name, const std::string& data)>;

struct HttpRoute {
  std::string path;  // exact, or a prefix when it ends in '/'
  std::function<HttpResponse(const HttpRequest&)> handler;                 // a plain GET, or
  std::function<void(const HttpRequest&, const EventSender&)> stream;      // text/event-stream
};

struct HttpEndpointOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 picks one
  // TLS when cert_pem is set; with client_ca_pem, clients may (not must) present a
  // certificate, which `authorize` then sees. No session is resumed: each connection is
  // verified afresh.
  std::string cert_pem;
  std::string key_pem;
  std::string client_ca_pem;
  // The reason a request is refused (its status: 401 for kUnauthenticated, 403 otherwise),
  // or Ok. Unset: everyone may read.
  std::function<Status(const HttpRequest&)> authorize;
  std::vector<HttpRoute> routes;
  int threads = 8;                 // connections served at once
  int max_streams = 4;             // open event streams at once; more get 503
  // Connections the endpoint holds at once, of every address, from their accept until they
  // close (waiting for a request in the poll, in their TLS handshake, queued, being answered,
  // streaming); at least 1. Past it the oldest waiting in the poll is closed to make room, the
  // new one itself when none waits there. Each is a file descriptor.
  int max_connections = 256;
  // Connections one client address may hold at once, counted as max_connections counts them;
  // from 1 to max_connections. 64: a quarter of max_connections' default.
  int max_connections_per_address = 64;
  // The TLS handshake, a request's head (from its first byte), the wait for a kept-alive
  // connection's next request, and each wait for a slow reader to take a response's bytes.
  std::chrono::seconds read_timeout{5};
  std::chrono::seconds stream_heartbeat{15};  // a comment line keeps proxies from closing a quiet stream
};

class HttpEndpoint {
 public:
  static Result<std::unique_ptr<HttpEndpoint>> Start(HttpEndpointOptions options);
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  int port() const { return port_; }
  bool tls() const { return tls_; }
  // "https://127.0.0.1:PORT" as a browser would open it.
  std::string url() const;
  // Ends open event streams and stops serving. Idempotent.
  void Stop();

 private:
  HttpEndpoint() = default;
  struct Shared;
  std::shared_ptr<Shared> shared_;
  std::vector<std::thread> threads_;  // the connections' threads, then the one accepting
  std::string host_;
  int port_ = 0;
  bool tls_ = false;
};

}  // namespace tessera
