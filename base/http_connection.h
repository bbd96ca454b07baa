// One accepted connection of base/http_endpoint.cc, plaintext or TLS, on a non-blocking
// socket. The handshake, reads and TryWrite never wait (the endpoint's poll does); WriteAll waits
// for room, each wait bounded, so that a thread answering a request is held no longer than its
// deadline.
// Internal to the endpoint.
#pragma once

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string_view>

namespace tessera::http_internal {

using Clock = std::chrono::steady_clock;

class Connection {
 public:
  // What TryRead returns when nothing has arrived yet: wait for want() in the poll.
  static constexpr ssize_t kWouldBlock = -2;

  Connection(int fd, int stop_fd) : fd_(fd), stop_fd_(stop_fd) {}
  ~Connection() {
    if (ssl_ != nullptr) {
      ERR_clear_error();
      if (handshaken_) SSL_shutdown(ssl_);  // one try at close_notify; never waits
      SSL_free(ssl_);
    }
    ::close(fd_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Serves TLS from now on; TryHandshake then completes the handshake.
  bool StartTls(SSL_CTX* ctx) {
    ssl_ = SSL_new(ctx);
    return ssl_ != nullptr && SSL_set_fd(ssl_, fd_) == 1;
  }

  // As much of the TLS handshake as what has arrived allows: 1 done, 0 not yet (wait for
  // want()), -1 failed.
  int TryHandshake() {
    ERR_clear_error();
    const int done = SSL_accept(ssl_);
    if (done == 1) {
      handshaken_ = true;
      return 1;
    }
    return Wants(SSL_get_error(ssl_, done)) ? 0 : -1;
  }
  bool handshaken() const { return handshaken_; }

  // What has arrived, up to `size` bytes, without waiting: > 0 bytes read, 0 the peer closed,
  // kWouldBlock nothing yet (wait for want()), -1 the connection failed.
  ssize_t TryRead(char* data, size_t size) {
    for (;;) {
      if (ssl_ != nullptr) {
        ERR_clear_error();
        const int n = SSL_read(ssl_, data, static_cast<int>(std::min<size_t>(size, 1 << 30)));
        if (n > 0) return n;
        const int error = SSL_get_error(ssl_, n);
        if (error == SSL_ERROR_ZERO_RETURN) return 0;
        if (error == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && (n == 0 || errno == 0)) return 0;
        return Wants(error) ? kWouldBlock : -1;
      }
      const ssize_t n = ::recv(fd_, data, size, 0);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      want_ = POLLIN;
      return kWouldBlock;
    }
  }
  // As much of `data` as the socket takes now, without waiting: > 0 bytes written, kWouldBlock
  // none yet (wait for want()), -1 the connection failed. After kWouldBlock, the next call
  // passes the same bytes again (TLS retries the record it began).
  ssize_t TryWrite(std::string_view data) {
    for (;;) {
      if (ssl_ != nullptr) {
        ERR_clear_error();
        const int n = SSL_write(ssl_, data.data(), static_cast<int>(std::min<size_t>(data.size(), 1 << 30)));
        if (n > 0) return n;
        return Wants(SSL_get_error(ssl_, n)) ? kWouldBlock : -1;
      }
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n > 0) return n;
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return -1;
      want_ = POLLOUT;
      return kWouldBlock;
    }
  }
  // The poll event the last TryHandshake, TryRead or TryWrite is waiting for: POLLIN or POLLOUT.
  short want() const { return want_; }

  // Writes it all: each wait for room at most `stall`, the whole before `deadline`.
  bool WriteAll(std::string_view data, std::chrono::milliseconds stall, Clock::time_point deadline) {
    while (!data.empty()) {
      const Clock::time_point until = std::min(deadline, Clock::now() + stall);
      if (ssl_ != nullptr) {
        ERR_clear_error();
        const int n = SSL_write(ssl_, data.data(), static_cast<int>(std::min<size_t>(data.size(), 1 << 30)));
        if (n > 0) {
          data.remove_prefix(static_cast<size_t>(n));
          continue;
        }
        if (!WaitFor(SSL_get_error(ssl_, n), until)) return false;
      } else {
        const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
        if (n > 0) {
          data.remove_prefix(static_cast<size_t>(n));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return false;
        if (!Wait(POLLOUT, until)) return false;
      }
    }
    return true;
  }

  // After a refusal whose request was not read to its end, in the endpoint's poll: the write
  // side is closed (StartLingeringClose, once) and what the client still sends is read and
  // dropped (DropInput, each time input arrives) until it returns false or kLinger has passed,
  // so that the close is not a reset that would discard the refusal before the client reads it.
  static constexpr auto kLinger = std::chrono::seconds(1);
  void StartLingeringClose() {
    if (ssl_ != nullptr && handshaken_) {
      ERR_clear_error();
      SSL_shutdown(ssl_);
      handshaken_ = false;
    }
    ::shutdown(fd_, SHUT_WR);
  }
  // Reads and drops what has arrived; false once the peer closed, the read failed, or 256 KiB
  // have been dropped.
  bool DropInput() {
    char sink[4096];
    const ssize_t n = ::recv(fd_, sink, sizeof(sink), 0);
    if (n <= 0) return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    dropped_ += static_cast<size_t>(n);
    return dropped_ < (size_t{256} << 10);
  }

  int fd() const { return fd_; }

  // The peer closed or reset its side (an event stream's reader went away).
  bool PeerGone() const {
    pollfd p{fd_, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
  }

  SSL* ssl() const { return ssl_; }

 private:
  bool Wants(int ssl_error) {
    if (ssl_error == SSL_ERROR_WANT_READ) want_ = POLLIN;
    else if (ssl_error == SSL_ERROR_WANT_WRITE) want_ = POLLOUT;
    else return false;
    return true;
  }

  bool WaitFor(int ssl_error, Clock::time_point deadline) {
    if (ssl_error == SSL_ERROR_WANT_READ) return Wait(POLLIN, deadline);
    if (ssl_error == SSL_ERROR_WANT_WRITE) return Wait(POLLOUT, deadline);
    return false;
  }

  bool Wait(short events, Clock::time_point deadline) {
    for (;;) {
      // Rounded up: with under a millisecond left, a truncated wait of 0 ended it before the
      // deadline.
      const Clock::time_point now = Clock::now();
      if (now >= deadline) return false;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
      pollfd p[2] = {{fd_, events, 0}, {stop_fd_, POLLIN, 0}};
      const int n = ::poll(p, 2, static_cast<int>(std::min<long long>(left + 1, 60'000)));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || p[1].revents != 0) return false;
      if (p[0].revents != 0) return (p[0].revents & POLLNVAL) == 0;
    }
  }

  int fd_;
  int stop_fd_;
  SSL* ssl_ = nullptr;
  bool handshaken_ = false;
  short want_ = POLLIN;
  size_t dropped_ = 0;  // by the lingering close
};

}  // namespace tessera::http_internal
