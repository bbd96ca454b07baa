#include "server/rpc/service_doors.h"

#include "base/escape.h"
#include "base/names.h"
#include "server/rpc/stream_limits.h"

namespace tessera::server {

wire::PeerIdentity Peer(const grpc::ServerContextBase* ctx) { return wire::IdentifyPeer(ctx->auth_context().get()); }

std::string CallerOf(const grpc::ServerContextBase* ctx) {
  const wire::PeerIdentity peer = Peer(ctx);
  return CallerKey(peer.has_certificate, EscapeUntrusted(peer.role), EscapeUntrusted(peer.common_name),
                   EscapeUntrusted(ctx->peer()));
}

Status CheckName(const std::string& call, const std::string& field, const std::string& value, bool required) {
  if (value.empty() ? !required : IsName(value)) return Status::Ok();
  return InvalidArgumentError(call + ": field '" + field + "' " + QuoteUntrusted(value) + ": expected " +
                              (required ? "1" : "0") + " to 128 letters, digits, '-', '_' or '.'");
}

Status CheckJobId(const std::string& call, const std::string& job_id) {
  if (IsName(job_id, kMaxJobIdBytes)) return Status::Ok();
  return InvalidArgumentError(call + ": field 'job_id' " + QuoteUntrusted(job_id) +
                              ": expected a job id such as job-1-3fa9c2");
}

}  // namespace tessera::server
