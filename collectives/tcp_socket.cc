#include "collectives/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "base/escape.h"

namespace tessera::collectives {
namespace {

int MillisLeft(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now())
                        .count();
  // poll() takes an int: a longer wait is taken in pieces (a cast would wrap, possibly to a
  // negative value, which poll() reads as forever).
  return left > 0 ? static_cast<int>(std::min<int64_t>(left, std::numeric_limits<int>::max())) : 0;
}

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Waits for `events` on fd; OK when ready, DEADLINE_EXCEEDED at the deadline.
Status PollOne(int fd, short events, std::chrono::steady_clock::time_point deadline,
               const std::string& who, const char* waiting_for) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int left = MillisLeft(deadline);
    const int rc = ::poll(&p, 1, left);
    if (rc > 0) return Status::Ok();
    if (rc == 0) {
      if (MillisLeft(deadline) > 0) continue;  // a piece of a longer wait
      return DeadlineExceededError("timed out " + std::string(waiting_for) + " " + who);
    }
    if (errno != EINTR) return UnavailableError(Errno("poll") + " (" + who + ")");
  }
}

// connect(2) on a nonblocking socket, waiting for the handshake no later than the deadline: a
// blocking connect waits as long as the kernel retries SYNs (minutes) when the peer drops them
// or its accept queue is full. OK once connected; DEADLINE_EXCEEDED at the deadline; otherwise
// UNAVAILABLE with connect's error (refused, unreachable), which the caller may retry.
Status ConnectBefore(TcpSocket& socket, const sockaddr* address, socklen_t length,
                     std::chrono::steady_clock::time_point deadline, const std::string& who) {
  if (::connect(socket.fd(), address, length) == 0) return Status::Ok();
  // EINTR: the handshake goes on regardless, as after EINPROGRESS.
  if (errno != EINPROGRESS && errno != EINTR) return UnavailableError(Errno("connect"));
  RETURN_IF_ERROR(PollOne(socket.fd(), POLLOUT, deadline, who, "connecting to"));
  int error = 0;
  socklen_t error_length = sizeof(error);
  if (::getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &error, &error_length) != 0) {
    return UnavailableError(Errno("getsockopt(SO_ERROR)"));
  }
  if (error != 0) return UnavailableError(std::string("connect: ") + std::strerror(error));
  return Status::Ok();
}

std::atomic<HostResolver> host_resolver{nullptr};

// The lookups whose helper thread has not finished, including those their caller gave up on.
// Never destroyed: a helper thread may outlive static destruction.
struct LookupsInFlight {
  std::mutex mutex;
  std::condition_variable finished;
  int count = 0;  // guarded by mutex
};

LookupsInFlight& InFlight() {
  static LookupsInFlight* const in_flight = new LookupsInFlight;
  return *in_flight;
}

// A lookup's helper thread has ended (or never started).
void LookupEnded(LookupsInFlight& in_flight) {
  std::lock_guard<std::mutex> lock(in_flight.mutex);
  --in_flight.count;
  in_flight.finished.notify_all();
}

using AddressList = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

// One name lookup, shared by the caller and the helper thread that runs it. Whoever comes
// last frees the answer: the caller once it has taken it, or the thread when the caller has
// given up waiting.
struct Lookup {
  std::mutex mutex;
  std::condition_variable finished;
  bool done = false;       // guarded by mutex
  bool abandoned = false;  // guarded by mutex
  int rc = 0;              // guarded by mutex
  addrinfo* found = nullptr;  // guarded by mutex
};

// host:service's addresses, looked up no later than the deadline. A numeric host needs no
// lookup; a name is looked up on a detached helper thread, waited for until the deadline.
// DEADLINE_EXCEEDED when the lookup has not finished by then, UNAVAILABLE with the
// resolver's reason when it fails.
Result<AddressList> Resolve(const std::string& host, const std::string& service,
                            std::chrono::steady_clock::time_point deadline,
                            const std::string& shown) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &found) == 0) {
    return AddressList(found, &::freeaddrinfo);
  }
  hints.ai_flags = AI_NUMERICSERV;
  HostResolver resolver = host_resolver.load();
  if (resolver == nullptr) resolver = &::getaddrinfo;
  auto lookup = std::make_shared<Lookup>();
  LookupsInFlight& in_flight = InFlight();
  {
    // Counted before the thread starts, so that PauseHostLookups never misses it; waits here
    // while a pause is held.
    std::lock_guard<std::mutex> lock(in_flight.mutex);
    ++in_flight.count;
  }
  try {
    std::thread([lookup, resolver, host, service, hints, &in_flight] {
      addrinfo* answer = nullptr;
      const int rc = resolver(host.c_str(), service.c_str(), &hints, &answer);
      {
        std::lock_guard<std::mutex> lock(lookup->mutex);
        if (lookup->abandoned) {
          if (rc == 0 && answer != nullptr) ::freeaddrinfo(answer);
        } else {
          lookup->rc = rc;
          lookup->found = rc == 0 ? answer : nullptr;
          lookup->done = true;
          lookup->finished.notify_all();
        }
      }
      LookupEnded(in_flight);
    }).detach();
  } catch (const std::system_error& error) {
    LookupEnded(in_flight);
    return UnavailableError("cannot resolve '" + shown + "': no thread for the lookup: " +
                            error.what());
  }
  std::unique_lock<std::mutex> lock(lookup->mutex);
  if (!lookup->finished.wait_until(lock, deadline, [&] { return lookup->done; })) {
    lookup->abandoned = true;
    return DeadlineExceededError("resolving '" + shown +
                                 "' did not finish before the deadline (the name resolver did "
                                 "not answer; give a numeric address to skip the lookup)");
  }
  if (lookup->rc != 0) {
    return UnavailableError("cannot resolve '" + shown + "': " + ::gai_strerror(lookup->rc));
  }
  return AddressList(std::exchange(lookup->found, nullptr), &::freeaddrinfo);
}

}  // namespace

void SetHostResolverForTesting(HostResolver resolver) { host_resolver.store(resolver); }

Result<HostLookupsPaused> PauseHostLookups(std::chrono::steady_clock::time_point deadline) {
  LookupsInFlight& in_flight = InFlight();
  std::unique_lock<std::mutex> lock(in_flight.mutex);
  if (!in_flight.finished.wait_until(lock, deadline, [&] { return in_flight.count == 0; })) {
    const int count = in_flight.count;
    return FailedPreconditionError(
        std::to_string(count) + " host-name lookup" + (count == 1 ? " is" : "s are") +
        " still waiting for the name resolver (cut off by a deadline, left running on a helper "
        "thread): a process forked now could inherit the resolver's locks held and hang on its "
        "own lookups");
  }
  return HostLookupsPaused(std::move(lock));
}

void TcpSocket::Close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void TcpSocket::Shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Status TcpSocket::SetNonBlocking(bool on) {
  int flags = ::fcntl(fd_, F_GETFL, 0);
  if (flags < 0) return InternalError(Errno("fcntl(F_GETFL)"));
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd_, F_SETFL, flags) < 0) return InternalError(Errno("fcntl(F_SETFL)"));
  return Status::Ok();
}

Status TcpSocket::Tune(int buffer_bytes) {
  int one = 1;
  if (::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return InternalError(Errno("setsockopt(TCP_NODELAY)"));
  }
  if (buffer_bytes > 0) {
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
  return Status::Ok();
}

Status TcpSocket::SendAll(const void* data, size_t bytes,
                          std::chrono::steady_clock::time_point deadline, const std::string& who) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd_, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      RETURN_IF_ERROR(PollOne(fd_, POLLOUT, deadline, who, "sending to"));
      continue;
    }
    return UnavailableError(Errno("send") + " (connection to " + who + ")");
  }
  return Status::Ok();
}

Status TcpSocket::RecvAll(void* data, size_t bytes,
                          std::chrono::steady_clock::time_point deadline, const std::string& who) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd_, p, bytes, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return UnavailableError(who + " closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      RETURN_IF_ERROR(PollOne(fd_, POLLIN, deadline, who, "receiving from"));
      continue;
    }
    return UnavailableError(Errno("recv") + " (connection to " + who + ")");
  }
  return Status::Ok();
}

namespace {

// The addresses to listen on at address:service. A numeric host (or none: every address of
// this machine) is used as it is, with no lookup. A name is looked up before `deadline` when
// the caller has one (Resolve); without one, getaddrinfo is called as it is and takes as long
// as the system's resolver does: that is a server started at start-up, with no deadline to
// honour and nothing else to do until it listens.
Result<AddressList> ListenAddresses(const std::string& address, const std::string& service,
                                    std::optional<std::chrono::steady_clock::time_point> deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  const char* host = address.empty() ? nullptr : address.c_str();
  addrinfo* found = nullptr;
  if (::getaddrinfo(host, service.c_str(), &hints, &found) == 0) return AddressList(found, &::freeaddrinfo);
  const std::string shown = EscapeUntrusted(address, 256);
  if (deadline) {
    auto resolved = Resolve(address, service, *deadline, shown);
    if (!resolved.ok()) return resolved.status().WithContext("bind address '" + shown + "'");
    return resolved;
  }
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if (const int rc = ::getaddrinfo(host, service.c_str(), &hints, &found); rc != 0) {
    return InvalidArgumentError("cannot resolve bind address '" + shown + "': " + ::gai_strerror(rc));
  }
  return AddressList(found, &::freeaddrinfo);
}

}  // namespace

Result<std::pair<TcpSocket, int>> ListenTcp(const std::string& address, int port, int backlog) {
  return ListenTcp(address, port, backlog, std::nullopt);
}

Result<std::pair<TcpSocket, int>> ListenTcp(const std::string& address, int port, int backlog,
                                            std::optional<std::chrono::steady_clock::time_point> deadline) {
  const std::string service = std::to_string(port);
  ASSIGN_OR_RETURN(AddressList addresses, ListenAddresses(address, service, deadline));
  addrinfo* found = addresses.release();
  std::string last_error = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    TcpSocket socket(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!socket.valid()) {
      last_error = Errno("socket");
      continue;
    }
    int one = 1;
    ::setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(socket.fd(), ai->ai_addr, ai->ai_addrlen) != 0 ||
        ::listen(socket.fd(), backlog) != 0) {
      last_error = Errno("bind/listen");
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    ::getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&bound), &length);
    const int bound_port =
        bound.ss_family == AF_INET6
            ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
            : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    ::freeaddrinfo(found);
    return std::make_pair(std::move(socket), bound_port);
  }
  ::freeaddrinfo(found);
  return UnavailableError("cannot listen on " + address + ":" + service + ": " + last_error);
}

Result<TcpSocket> AcceptTcp(TcpSocket& listener, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    RETURN_IF_ERROR(PollOne(listener.fd(), POLLIN, deadline, "incoming peers",
                            "waiting for connections from"));
    const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return TcpSocket(fd);
    if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
    return UnavailableError(Errno("accept"));
  }
}

Result<TcpSocket> ConnectTcp(const std::string& host, int port,
                             std::chrono::steady_clock::time_point deadline,
                             const std::string& who) {
  const std::string service = std::to_string(port);
  // The host may be what a peer published (a p2p rank's address in the store): shown escaped
  // and bounded.
  const std::string shown = EscapeUntrusted(host, 256);
  std::string last_error;
  auto backoff = std::chrono::milliseconds(1);
  for (;;) {
    auto found = Resolve(host, service, deadline, shown);
    if (!found.ok() && found.status().code() == StatusCode::kDeadlineExceeded) {
      // A retried lookup cut off by the deadline says less than the earlier attempt's failure
      // (the resolver's reason, or a refused connection): that one is shown when there was one.
      return DeadlineExceededError("could not connect to " + who + " at " + shown + ":" +
                                   service + " before the deadline (" +
                                   (last_error.empty() ? found.status().message() : last_error) + ")");
    }
    if (!found.ok()) {
      last_error = found.status().message();
    } else {
      for (addrinfo* ai = found->get(); ai != nullptr; ai = ai->ai_next) {
        TcpSocket socket(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                                  ai->ai_protocol));
        if (!socket.valid()) {
          last_error = Errno("socket");
          continue;
        }
        Status connected = ConnectBefore(socket, ai->ai_addr, ai->ai_addrlen, deadline, who);
        if (connected.ok()) connected = socket.SetNonBlocking(false);
        if (connected.ok()) return socket;
        if (connected.code() == StatusCode::kDeadlineExceeded) {
          return DeadlineExceededError("could not connect to " + who + " at " + shown + ":" + service +
                                       " before the deadline (" + connected.message() + ")");
        }
        last_error = connected.message();
      }
    }
    if (std::chrono::steady_clock::now() + backoff >= deadline) {
      return DeadlineExceededError("could not connect to " + who + " at " + shown + ":" +
                                   service + " before the deadline (" + last_error + ")");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
}

Result<std::pair<std::string, int>> ParseHostPort(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size()) {
    return InvalidArgumentError("expected host:port, got " + QuoteUntrusted(text, 256));
  }
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  const char* first = text.data() + colon + 1;
  const char* last = text.data() + text.size();
  const auto [end, error] = std::from_chars(first, last, port);
  if (error != std::errc() || end != last || port < 0 || port > 65535) {
    return InvalidArgumentError("expected a port number in [0, 65535] in " + QuoteUntrusted(text, 256));
  }
  return std::make_pair(host, port);
}

}  // namespace tessera::collectives
