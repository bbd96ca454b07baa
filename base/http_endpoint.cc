#include "base/http_endpoint.h"

#include <httplib.h>
#include <netinet/in.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "base/escape.h"

namespace tessera {

struct HttpEndpoint::Shared {
  std::atomic<bool> stopping{false};
  std::atomic<int> streams{0};
};

namespace {

std::string SubjectField(X509* cert, int nid) {
  X509_NAME* name = X509_get_subject_name(cert);
  const int index = name ? X509_NAME_get_index_by_NID(name, nid, -1) : -1;
  if (index < 0) return "";
  ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, index));
  const unsigned char* bytes = ASN1_STRING_get0_data(data);
  return std::string(reinterpret_cast<const char*>(bytes), static_cast<size_t>(ASN1_STRING_length(data)));
}

// Loads PEM text into the context: the certificate chain, the key, and the client CA, with
// client certificates asked for but not required (the bearer token is the other way in).
bool SetUpTls(SSL_CTX& ctx, const std::string& cert_pem, const std::string& key_pem, const std::string& ca_pem) {
  SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
  BIO* cert_bio = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  X509* cert = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  bool ok = cert != nullptr && SSL_CTX_use_certificate(&ctx, cert) == 1;
  while (ok) {  // the rest of the chain
    X509* extra = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
    if (extra == nullptr) break;
    if (SSL_CTX_add_extra_chain_cert(&ctx, extra) != 1) {
      X509_free(extra);
      ok = false;
    }
  }
  ERR_clear_error();
  X509_free(cert);
  BIO_free(cert_bio);
  BIO* key_bio = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  ok = ok && key != nullptr && SSL_CTX_use_PrivateKey(&ctx, key) == 1 && SSL_CTX_check_private_key(&ctx) == 1;
  EVP_PKEY_free(key);
  BIO_free(key_bio);
  if (ok && !ca_pem.empty()) {
    X509_STORE* store = SSL_CTX_get_cert_store(&ctx);
    STACK_OF(X509_NAME)* names = sk_X509_NAME_new_null();
    BIO* ca_bio = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
    int loaded = 0;
    while (X509* ca = PEM_read_bio_X509(ca_bio, nullptr, nullptr, nullptr)) {
      X509_STORE_add_cert(store, ca);
      sk_X509_NAME_push(names, X509_NAME_dup(X509_get_subject_name(ca)));
      X509_free(ca);
      ++loaded;
    }
    ERR_clear_error();
    BIO_free(ca_bio);
    SSL_CTX_set_client_CA_list(&ctx, names);
    SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER, nullptr);
    ok = loaded > 0;
  }
  return ok;
}

HttpRequest ToRequest(const httplib::Request& req) {
  HttpRequest out;
  out.path = req.path;
  for (const auto& [key, value] : req.params) out.params.emplace(key, value);
  out.authorization = req.get_header_value("Authorization");
  if (req.ssl != nullptr) {
    SSL* ssl = const_cast<SSL*>(req.ssl);
    if (X509* peer = SSL_get1_peer_certificate(ssl)) {
      if (SSL_get_verify_result(ssl) == X509_V_OK) {
        out.client_certificate = true;
        out.client_cn = SubjectField(peer, NID_commonName);
        out.client_ou = SubjectField(peer, NID_organizationalUnitName);
        if (BIGNUM* serial = ASN1_INTEGER_to_BN(X509_get0_serialNumber(peer), nullptr)) {
          if (char* hex = BN_bn2hex(serial)) {
            out.client_serial = hex;
            OPENSSL_free(hex);
          }
          BN_free(serial);
        }
      }
      X509_free(peer);
    }
  }
  return out;
}

void Apply(const HttpResponse& from, httplib::Response& to) {
  to.status = from.status;
  for (const auto& [key, value] : from.headers) to.set_header(key, value);
  to.set_content(from.body, from.content_type);
}

}  // namespace

Result<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(HttpEndpointOptions options) {
  std::unique_ptr<HttpEndpoint> endpoint(new HttpEndpoint());
  endpoint->shared_ = std::make_shared<Shared>();
  endpoint->host_ = options.host;
  if (!options.cert_pem.empty()) {
    const std::string cert = options.cert_pem, key = options.key_pem, ca = options.client_ca_pem;
    auto server = std::make_unique<httplib::SSLServer>(
        [cert, key, ca](SSL_CTX& ctx) { return SetUpTls(ctx, cert, key, ca); });
    if (!server->is_valid()) return InvalidArgumentError("the HTTP endpoint's TLS certificate, key or client CA did not load");
    endpoint->server_ = std::move(server);
    endpoint->tls_ = true;
  } else {
    endpoint->server_ = std::make_unique<httplib::Server>();
  }
  httplib::Server& server = *endpoint->server_;
  const int threads = std::max(1, options.threads);
  server.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  // The port is this daemon's alone: SO_REUSEADDR for quick restarts, never SO_REUSEPORT.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server.set_read_timeout(options.read_timeout);
  server.set_write_timeout(options.read_timeout);
  server.set_payload_max_length(0);
  server.set_keep_alive_max_count(20);

  auto shared = endpoint->shared_;
  auto authorize = options.authorize;
  auto routes = std::make_shared<std::vector<HttpRoute>>(std::move(options.routes));
  const int max_streams = std::max(1, options.max_streams);
  const auto heartbeat = options.stream_heartbeat;
  server.Get(".*", [shared, authorize, routes, max_streams, heartbeat](const httplib::Request& req,
                                                                      httplib::Response& res) {
    HttpRequest request = ToRequest(req);
    if (authorize) {
      if (Status s = authorize(request); !s.ok()) {
        HttpResponse refusal;
        refusal.status = s.code() == StatusCode::kUnauthenticated ? 401 : 403;
        refusal.body = s.message() + "\n";
        if (refusal.status == 401) refusal.headers.emplace_back("WWW-Authenticate", "Bearer");
        Apply(refusal, res);
        return;
      }
    }
    const HttpRoute* route = nullptr;
    for (const auto& r : *routes) {
      const bool prefix = !r.path.empty() && r.path.back() == '/' && r.path.size() > 1;
      if (request.path == r.path || (prefix && request.path.rfind(r.path, 0) == 0)) {
        route = &r;
        break;
      }
    }
    if (route == nullptr) {
      Apply({404, "text/plain; charset=utf-8", "no page " + EscapeUntrusted(request.path, 128) + " here\n", {}}, res);
      return;
    }
    if (route->handler) {
      Apply(route->handler(request), res);
      return;
    }
    if (shared->streams.fetch_add(1) >= max_streams) {
      shared->streams.fetch_sub(1);
      Apply({503, "text/plain; charset=utf-8",
             "too many open event streams (at most " + std::to_string(max_streams) + "); try again later\n", {}},
            res);
      return;
    }
    res.set_header("Cache-Control", "no-store");
    // The slot is given back once: when the stream ends, or when the response is dropped
    // without streaming (httplib may copy a response, and every copy calls the releaser).
    auto released = std::make_shared<std::atomic<bool>>(false);
    auto give_back = [shared, released] {
      if (!released->exchange(true)) shared->streams.fetch_sub(1);
    };
    auto stream = route->stream;
    res.set_chunked_content_provider(
        "text/event-stream",
        [shared, stream, request, heartbeat, give_back](size_t, httplib::DataSink& sink) {
          auto last_write = std::chrono::steady_clock::now();
          EventSender send = [&](const std::string& name, const std::string& data) {
            if (shared->stopping.load() || !sink.is_writable()) return false;
            std::string frame;
            if (name.empty() && data.empty()) {
              if (std::chrono::steady_clock::now() - last_write < heartbeat) return true;
              frame = ": keep-alive\n\n";
            } else {
              if (!name.empty()) frame += "event: " + name + "\n";
              size_t start = 0;
              for (size_t nl = data.find('\n');; nl = data.find('\n', start)) {
                frame += "data: " + data.substr(start, nl == std::string::npos ? std::string::npos : nl - start) + "\n";
                if (nl == std::string::npos) break;
                start = nl + 1;
              }
              frame += "\n";
            }
            last_write = std::chrono::steady_clock::now();
            return sink.write(frame.data(), frame.size());
          };
          stream(request, send);
          give_back();
          sink.done();
          return true;
        },
        [give_back](bool) { give_back(); });
  });

  const int port = options.port == 0 ? server.bind_to_any_port(options.host) :
                   (server.bind_to_port(options.host, options.port) ? options.port : -1);
  if (port <= 0) {
    return UnavailableError("cannot listen on " + options.host + ":" + std::to_string(options.port) +
                            " for HTTP (in use, or not an address of this machine)");
  }
  endpoint->port_ = port;
  httplib::Server* raw = endpoint->server_.get();
  auto listening_ended = std::make_shared<std::atomic<bool>>(false);
  endpoint->listener_ = std::make_unique<std::thread>([raw, listening_ended] {
    raw->listen_after_bind();
    listening_ended->store(true);
  });
  // Stop() before the listener runs would find nothing to stop, and the listener would then
  // run forever: wait until it is up (or has given up).
  while (!raw->is_running() && !listening_ended->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (listening_ended->load()) {
    endpoint->listener_->join();
    return UnavailableError("cannot serve HTTP on " + options.host + ":" + std::to_string(port));
  }
  return endpoint;
}

std::string HttpEndpoint::url() const {
  const bool v6 = host_.find(':') != std::string::npos;
  return std::string(tls_ ? "https" : "http") + "://" + (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

void HttpEndpoint::Stop() {
  if (!server_) return;
  shared_->stopping.store(true);
  server_->stop();
  if (listener_ && listener_->joinable()) listener_->join();
}

HttpEndpoint::~HttpEndpoint() { Stop(); }

}  // namespace tessera
