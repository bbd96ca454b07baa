// Thin RAII TCP helpers shared by TcpStore and the p2p transport. Every blocking helper
// takes a deadline and uses poll(); none waits forever. Errors are UNAVAILABLE (the peer
// closed or reset) or DEADLINE_EXCEEDED, with `who` (e.g. "rank 3") in the message.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "base/status.h"

struct addrinfo;  // <netdb.h>

namespace tessera::collectives {

class TcpSocket {
 public:
  TcpSocket() = default;
  explicit TcpSocket(int fd) : fd_(fd) {}
  ~TcpSocket() { Close(); }
  TcpSocket(TcpSocket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  TcpSocket& operator=(TcpSocket&& other) noexcept {
    if (this != &other) {
      Close();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  TcpSocket(const TcpSocket&) = delete;
  TcpSocket& operator=(const TcpSocket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Close();
  // Wakes any thread blocked on this socket (shutdown(2)) without closing the fd.
  void Shutdown();

  Status SetNonBlocking(bool on);
  // TCP_NODELAY, and SO_SNDBUF/SO_RCVBUF when buffer_bytes > 0 (0 keeps autotuning).
  Status Tune(int buffer_bytes);

  // Blocking-with-deadline exact transfers (the socket may be blocking or not).
  Status SendAll(const void* data, size_t bytes, std::chrono::steady_clock::time_point deadline,
                 const std::string& who);
  Status RecvAll(void* data, size_t bytes, std::chrono::steady_clock::time_point deadline,
                 const std::string& who);

 private:
  int fd_ = -1;
};

// Listens on `address`:`port` (port 0: any free port). Returns the socket and bound port.
// A numeric address (IPv4 or IPv6 literal, or "" for every address) is used as it is, with no
// lookup. A name is looked up as ConnectTcp looks one up: with `deadline`, on a helper thread
// waited for until then (DEADLINE_EXCEEDED naming the address when the resolver has not
// answered); without one, getaddrinfo blocks for as long as the resolver takes, and a name
// that does not resolve is INVALID_ARGUMENT.
Result<std::pair<TcpSocket, int>> ListenTcp(const std::string& address, int port, int backlog);
Result<std::pair<TcpSocket, int>> ListenTcp(const std::string& address, int port, int backlog,
                                            std::optional<std::chrono::steady_clock::time_point> deadline);
// Accepts one connection before the deadline.
Result<TcpSocket> AcceptTcp(TcpSocket& listener, std::chrono::steady_clock::time_point deadline);
// Connects to host:port, retrying refused connections until the deadline. Every attempt is
// bounded by the deadline too (a peer that drops SYNs, or whose accept queue is full, is
// DEADLINE_EXCEEDED then, not after the kernel's minutes of retries). The socket is blocking.
// A numeric host (IPv4 or IPv6 literal) is used as it is, with no lookup. A name is looked
// up (getaddrinfo) on a helper thread that the call waits for until the deadline: a resolver
// that does not answer by then makes the call DEADLINE_EXCEEDED naming the host, and the
// thread is left to finish on its own and free its answer (see PauseHostLookups for what
// that means to a process that forks). A name that does not resolve is
// looked up again after each backoff until the deadline, like a refused connection (a peer's
// name may be published in DNS after the peer starts); the error then carries the
// resolver's reason.
Result<TcpSocket> ConnectTcp(const std::string& host, int port,
                             std::chrono::steady_clock::time_point deadline,
                             const std::string& who);
// The lookup ConnectTcp uses for a host that is not numeric: getaddrinfo's signature and
// result. Tests replace it (nullptr restores getaddrinfo); lookups that start afterwards use
// the new one.
using HostResolver = int (*)(const char* host, const char* service, const ::addrinfo* hints,
                             ::addrinfo** found);
void SetHostResolverForTesting(HostResolver resolver);

// Host-name lookups and fork(2). A lookup cut off by its deadline goes on, on its helper
// thread, until the resolver answers. A child forked meanwhile gets the resolver's locks
// (glibc's NSS and DNS state) as that thread held them, with no thread left to release them,
// and a lookup of its own could wait on them forever. A process that forks children which go
// on without exec (the collectives benchmark's ranks) holds a HostLookupsPaused across its
// forks: no lookup is in flight when it forks, and none starts until the pause is let go, in
// the parent once it has forked and in each child first thing. A child that execs at once
// (posix_spawn, as the worker starts an external trainer) runs no lookup before exec and
// needs none of this.
class HostLookupsPaused {
 public:
  explicit HostLookupsPaused(std::unique_lock<std::mutex> lock) : lock_(std::move(lock)) {}
  HostLookupsPaused(HostLookupsPaused&&) = default;
  HostLookupsPaused& operator=(HostLookupsPaused&&) = default;
  // Lets lookups start again; in a forked child, before it looks anything up. Once only.
  void Resume() {
    if (lock_.owns_lock()) lock_.unlock();
  }

 private:
  std::unique_lock<std::mutex> lock_;
};
// Waits, no later than `deadline`, until no lookup of this process is in flight, and holds
// new ones back (they wait to start) until the result is resumed or destroyed.
// FAILED_PRECONDITION saying how many lookups are still waiting for the resolver when the
// deadline comes first.
Result<HostLookupsPaused> PauseHostLookups(std::chrono::steady_clock::time_point deadline);

// Splits "host:port"; INVALID_ARGUMENT unless the port is a decimal number in [0, 65535].
Result<std::pair<std::string, int>> ParseHostPort(const std::string& text);

}  // namespace tessera::collectives
