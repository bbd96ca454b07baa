// A raw connection to an HTTP endpoint, for what a library client would not send; for the
// tests of base/http_endpoint.h.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "base/http_endpoint.h"

namespace tessera {

// An endpoint's options serving /metrics alone, with a fixed body.
inline HttpEndpointOptions MetricsOnly() {
  HttpEndpointOptions options;
  options.routes.push_back({"/metrics", [](const HttpRequest&) {
                              return HttpResponse{200, "text/plain; version=0.0.4", "up 1\n", {}};
                            }, nullptr});
  return options;
}

// A raw connection, for what a library client would not send.
class RawClient {
 public:
  // `receive_buffer`: the socket's receive buffer in bytes, set before it connects; 0 leaves
  // the system's. `source`: the loopback address it connects from ("127.0.0.2"); null leaves
  // the system's choice (127.0.0.1).
  explicit RawClient(int port, int receive_buffer = 0, const char* source = nullptr)
      : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    if (receive_buffer > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    if (source != nullptr) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      if (::inet_pton(AF_INET, source, &from.sin_addr) != 1 ||
          ::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0) {
        return;  // not connected()
      }
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~RawClient() { ::close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;
  int fd() const { return fd_; }
  bool connected() const { return connected_; }
  bool Send(const std::string& bytes) { return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()); }
  // What arrives until the server closes, or until `limit` passes.
  std::string ReadUntilClosed(std::chrono::milliseconds limit, bool* closed = nullptr) {
    std::string out;
    const auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      char buffer[4096];
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) {
        if (closed != nullptr) *closed = true;
        break;
      }
      out.append(buffer, static_cast<size_t>(n));
    }
    return out;
  }
  // Whether the server has closed the connection (a read sees the end).
  bool ClosedByServer() {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    char c;
    return ::recv(fd_, &c, 1, MSG_PEEK) <= 0;
  }

 private:
  int fd_;
  bool connected_ = false;
};

}  // namespace tessera
