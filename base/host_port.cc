#include "base/host_port.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "base/escape.h"

namespace tessera {
namespace {

constexpr size_t kMaxHostBytes = 253;  // the longest DNS name

bool IsDnsNameOrIpv4(const std::string& host) {
  if (host.empty() || host.size() > kMaxHostBytes || host.front() == '-' || host.front() == '.') return false;
  for (char c : host) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.')) return false;
  }
  return true;
}

bool IsIpv6(const std::string& host) {
  in6_addr address{};
  return host.size() <= 45 && ::inet_pton(AF_INET6, host.c_str(), &address) == 1;
}

}  // namespace

bool IsHost(const std::string& host) { return IsDnsNameOrIpv4(host) || IsIpv6(host); }

std::string HostPort::ToString() const {
  const std::string shown = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return shown + ":" + std::to_string(port);
}

Result<HostPort> ParseHostPort(const std::string& flag, const std::string& text, PortZero zero) {
  const std::string example = flag == "--listen" ? "127.0.0.1:7070 or 0.0.0.0:7070" : "coordinator.example.org:7070";
  const std::string expected = "expected HOST:PORT (e.g. " + example + "; an IPv6 address in brackets, [::1]:7070)";
  const std::string quoted = QuoteUntrusted(text);
  const std::string ranges = zero == PortZero::kAllowed ? "1 to 65535, or 0 to pick a free port" : "1 to 65535";
  HostPort parsed;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos) return InvalidArgumentError(flag + " " + quoted + ": no ']' closes the IPv6 address; " + expected);
    parsed.host = text.substr(1, close - 1);
    if (!IsIpv6(parsed.host)) return InvalidArgumentError(flag + " " + quoted + ": not an IPv6 address in brackets; " + expected);
    if (close + 1 >= text.size() || text[close + 1] != ':') {
      return InvalidArgumentError(flag + " " + quoted + ": the port is missing; " + expected);
    }
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      return InvalidArgumentError(flag + " " + quoted + ": the port is missing; " + expected);
    }
    if (text.find(':') != colon) {
      return InvalidArgumentError(flag + " " + quoted + ": an IPv6 address must be in brackets; " + expected);
    }
    parsed.host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (parsed.host.empty()) return InvalidArgumentError(flag + " " + quoted + ": the host is missing; " + expected);
    if (!IsDnsNameOrIpv4(parsed.host)) {
      return InvalidArgumentError(flag + " " + quoted + ": the host is not a DNS name or an IPv4 address; " + expected);
    }
  }
  if (port.empty()) return InvalidArgumentError(flag + " " + quoted + ": the port is missing; " + expected);
  bool digits = true;
  for (char c : port) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  if (!digits) {
    return InvalidArgumentError(flag + " " + quoted + ": the port " + QuoteUntrusted(port) + " is not a number from " +
                                ranges);
  }
  parsed.port = port.size() > 5 ? 65536 : std::stoi(port);
  if (parsed.port > 65535 || (parsed.port == 0 && zero == PortZero::kRefused)) {
    return InvalidArgumentError(flag + " " + quoted + ": port " + EscapeUntrusted(port, 16) + " is out of range (expected " + ranges + ")");
  }
  return parsed;
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr address{};
  if (::inet_pton(AF_INET, host.c_str(), &address) == 1) return (ntohl(address.s_addr) >> 24) == 127;
  return false;
}

}  // namespace tessera

namespace tessera {

Status ProbeListen(const HostPort& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  // A numeric host is used as it is. A name is looked up with no deadline: this runs once, at
  // the coordinator's start, which has nothing to do until it listens, and waits for the
  // system's resolver as the listening server itself would.
  if (::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found) != 0) {
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    if (int error = ::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found); error != 0) {
      return UnavailableError("cannot resolve " + QuoteUntrusted(address.host) + ": " + ::gai_strerror(error));
    }
  }
  Status result;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as gRPC does
    const int bound = ::bind(fd, a->ai_addr, a->ai_addrlen);
    const int error = errno;
    ::close(fd);
    if (bound == 0) continue;
    if (error == EADDRINUSE) {
      result = UnavailableError("port " + port + " is in use on " + QuoteUntrusted(address.host) +
                                " (by another coordinator?)");
    } else if (error == EADDRNOTAVAIL) {
      result = UnavailableError(QuoteUntrusted(address.host) + " is not an address of this machine");
    } else {
      result = UnavailableError("cannot bind " + address.ToString() + ": " + std::strerror(error));
    }
    break;
  }
  ::freeaddrinfo(found);
  return result;
}

}  // namespace tessera
