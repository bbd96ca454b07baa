// HOST:PORT addresses as flags give them (--listen, --coordinator), checked before anything
// binds or dials: a missing port, a port past 65535 or a stray character is an error that
// names the flag and says what was expected, never a silent default or a wrapped number.
//
// Accepted: "host:port" where host is a DNS name or an IPv4 address, and "[ipv6]:port".
// Thread-safe (pure functions).
#pragma once

#include <string>

#include "base/status.h"

namespace tessera {

struct HostPort {
  std::string host;  // as given, without brackets for IPv6
  int port = 0;
  std::string ToString() const;  // "host:port", "[::1]:port"
};

enum class PortZero {
  kRefused,  // a port to dial: 1 to 65535
  kAllowed,  // a port to listen on: 0 picks a free one (tests)
};

// InvalidArgument naming `flag` ("--listen") and the (escaped) value when `text` is not
// HOST:PORT as above.
Result<HostPort> ParseHostPort(const std::string& flag, const std::string& text, PortZero zero);

// True for a DNS name, an IPv4 address or an IPv6 address (without brackets): a host as a
// flag names one without its port (--coordinator-host, --cohort-address).
bool IsHost(const std::string& host);

// True for "localhost", 127.0.0.0/8 and ::1: addresses no other machine can reach.
bool IsLoopbackHost(const std::string& host);

}  // namespace tessera

namespace tessera {

// Why `address` cannot be listened on, found by binding a TCP socket to it (without
// SO_REUSEPORT) and closing it at once: Unavailable "port N is in use" or "HOST is not an
// address of this machine", or OK when the bind works now. For explaining a failed listen.
Status ProbeListen(const HostPort& address);

}  // namespace tessera
