// The HTTP endpoint's connection limits (base/http_endpoint.h) as a daemon's flags, named after
// the flag that gives the endpoint's address: --metrics-listen's endpoint takes
// --metrics-max-connections (HttpEndpointOptions::max_connections) and
// --metrics-max-connections-per-address (max_connections_per_address). Behind a NAT or a
// reverse proxy every client is one address; on a big node more clients scrape and watch.
//
// Each is read by FlagSet's strict integer reader: a whole number from 1 to 65,536 (a typo, a
// non-number, 0 or more are errors naming the flag and what was expected). The per-address limit
// is at most the total, and either is given only with the endpoint's --PREFIX-listen: otherwise
// nothing is served for it to bound.
#pragma once

#include <cstdint>
#include <string>

#include "base/flags.h"
#include "base/http_endpoint.h"
#include "base/status.h"

namespace tessera {

// The most connections either flag allows: each is a file descriptor, and the endpoint's poll
// looks over every connection waiting in it.
inline constexpr int64_t kMaxHttpConnectionsFlag = 65536;

struct HttpLimitFlags {
  int64_t max_connections = HttpEndpointOptions{}.max_connections;
  int64_t max_connections_per_address = HttpEndpointOptions{}.max_connections_per_address;
};

// Declares --PREFIX-max-connections and --PREFIX-max-connections-per-address on `flags`, their
// defaults the endpoint's, filling `limits` as they are parsed.
void DeclareHttpLimitFlags(FlagSet& flags, const std::string& prefix, HttpLimitFlags* limits);

// After `flags` parsed: InvalidArgument "flag --PREFIX-max-connections-per-address: expected at
// most --PREFIX-max-connections (N), got M" when the per-address limit exceeds the total (or
// "flag --PREFIX-max-connections: expected at least --PREFIX-max-connections-per-address (64, its
// default: lower it too), got N" when only the total was given), and "flag
// --PREFIX-max-connections...: expected only with --PREFIX-listen" when either is given without
// the endpoint's address.
Status CheckHttpLimitFlags(const FlagSet& flags, const std::string& prefix, const HttpLimitFlags& limits);

// The limits into the endpoint's options (CheckHttpLimitFlags first).
void ApplyHttpLimitFlags(const HttpLimitFlags& limits, HttpEndpointOptions* options);

}  // namespace tessera
