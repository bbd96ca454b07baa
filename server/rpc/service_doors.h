// What both of the coordinator's gRPC services check at their doors (server/rpc/services.cc,
// server/rpc/job_service.cc): who the caller is, names and job ids of a fixed alphabet and
// length, and a log of refusals that a hostile client cannot flood.
//
// The doors: every string a caller sends is checked or escaped before it reaches a log, a
// record, an error message or a lookup. Names and ids have a fixed alphabet and length;
// free text (device names and properties, a worker's state, a failure report) is escaped
// and cut (base/escape.h).
#pragma once

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <string>
#include <utility>

#include "base/rate_limit.h"
#include "base/status.h"
#include "proto/transport_security.h"

namespace tessera::server {

// The caller's certificate identity, if it showed one.
wire::PeerIdentity Peer(const grpc::ServerContextBase* ctx);

// Whom a stream counts against (server/rpc/stream_limits.h): its certificate, or its address.
std::string CallerOf(const grpc::ServerContextBase* ctx);

// A worker's name, a worker id, a cohort: 1 to 128 letters, digits, '-', '_' or '.' (0 to 128
// when not `required`). InvalidArgument naming `call`, the field and the value, escaped.
Status CheckName(const std::string& call, const std::string& field, const std::string& value, bool required = true);
// A job id: 1 to 64 of the same characters.
Status CheckJobId(const std::string& call, const std::string& job_id);

// Refusals that a misconfigured or hostile client can repeat many times a second: a few lines
// per minute each, the rest counted.
struct RefusalLog {
  LogRateLimiter limiter{5, std::chrono::seconds(60)};
  template <typename... Args>
  void Warn(spdlog::format_string_t<Args...> format, Args&&... args) {
    uint64_t suppressed = 0;
    if (!limiter.Allow(&suppressed)) return;
    std::string line = fmt::format(format, std::forward<Args>(args)...);
    if (suppressed > 0) line += " (" + std::to_string(suppressed) + " more like it were not logged)";
    spdlog::warn("{}", line);
  }
};

}  // namespace tessera::server
