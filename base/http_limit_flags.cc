#include "base/http_limit_flags.h"

namespace tessera {

void DeclareHttpLimitFlags(FlagSet& flags, const std::string& prefix, HttpLimitFlags* limits) {
  flags.Int(prefix + "-max-connections", &limits->max_connections,
            "connections the --" + prefix + "-listen port holds at once, from every client (waiting for a request, "
            "being answered); past it the oldest waiting for a request is closed to make room. Each "
            "takes a file descriptor",
            IntRange{1, kMaxHttpConnectionsFlag});
  flags.Int(prefix + "-max-connections-per-address", &limits->max_connections_per_address,
            "connections one client address holds at once on the --" + prefix + "-listen port, at most --" +
                prefix + "-max-connections; more from it are closed as they arrive. Behind a NAT or a reverse "
                "proxy every client is one address: raise it there",
            IntRange{1, kMaxHttpConnectionsFlag});
}

Status CheckHttpLimitFlags(const FlagSet& flags, const std::string& prefix, const HttpLimitFlags& limits) {
  const std::string total = prefix + "-max-connections";
  const std::string per_address = prefix + "-max-connections-per-address";
  for (const std::string& name : {total, per_address}) {
    if (flags.WasGiven(name) && !flags.WasGiven(prefix + "-listen")) {
      return InvalidArgumentError("flag --" + name + ": expected only with --" + prefix +
                                  "-listen, which serves the port it bounds");
    }
  }
  if (limits.max_connections_per_address > limits.max_connections) {
    // The flag given is the one named; a default the other holds is said to be one.
    if (flags.WasGiven(total) && !flags.WasGiven(per_address)) {
      return InvalidArgumentError("flag --" + total + ": expected at least --" + per_address + " (" +
                                  std::to_string(limits.max_connections_per_address) +
                                  ", its default: lower it too), got " + std::to_string(limits.max_connections));
    }
    return InvalidArgumentError("flag --" + per_address + ": expected at most --" + total + " (" +
                                std::to_string(limits.max_connections) +
                                (flags.WasGiven(total) ? "" : ", its default: raise it too") + "), got " +
                                std::to_string(limits.max_connections_per_address));
  }
  return Status::Ok();
}

void ApplyHttpLimitFlags(const HttpLimitFlags& limits, HttpEndpointOptions* options) {
  options->max_connections = static_cast<int>(limits.max_connections);
  options->max_connections_per_address = static_cast<int>(limits.max_connections_per_address);
}

}  // namespace tessera
