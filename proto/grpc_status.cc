#include "proto/grpc_status.h"

#include "base/escape.h"

namespace tessera::wire {

grpc::Status ToGrpc(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // Tessera's codes follow gRPC's canonical codes one to one except for the numbering.
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  switch (status.code()) {
    case StatusCode::kOk: code = grpc::StatusCode::OK; break;
    case StatusCode::kCancelled: code = grpc::StatusCode::CANCELLED; break;
    case StatusCode::kInvalidArgument: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case StatusCode::kNotFound: code = grpc::StatusCode::NOT_FOUND; break;
    case StatusCode::kAlreadyExists: code = grpc::StatusCode::ALREADY_EXISTS; break;
    case StatusCode::kPermissionDenied: code = grpc::StatusCode::PERMISSION_DENIED; break;
    case StatusCode::kUnauthenticated: code = grpc::StatusCode::UNAUTHENTICATED; break;
    case StatusCode::kFailedPrecondition: code = grpc::StatusCode::FAILED_PRECONDITION; break;
    case StatusCode::kOutOfRange: code = grpc::StatusCode::OUT_OF_RANGE; break;
    case StatusCode::kResourceExhausted: code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    case StatusCode::kDeadlineExceeded: code = grpc::StatusCode::DEADLINE_EXCEEDED; break;
    case StatusCode::kUnavailable: code = grpc::StatusCode::UNAVAILABLE; break;
    case StatusCode::kDataLoss: code = grpc::StatusCode::DATA_LOSS; break;
    case StatusCode::kUnimplemented: code = grpc::StatusCode::UNIMPLEMENTED; break;
    case StatusCode::kInternal: code = grpc::StatusCode::INTERNAL; break;
  }
  return grpc::Status(code, status.message());
}

Status FromGrpc(const grpc::Status& status, const std::string& context) {
  if (status.ok()) return Status::Ok();
  StatusCode code = StatusCode::kInternal;
  switch (status.error_code()) {
    case grpc::StatusCode::CANCELLED: code = StatusCode::kCancelled; break;
    case grpc::StatusCode::INVALID_ARGUMENT: code = StatusCode::kInvalidArgument; break;
    case grpc::StatusCode::NOT_FOUND: code = StatusCode::kNotFound; break;
    case grpc::StatusCode::ALREADY_EXISTS: code = StatusCode::kAlreadyExists; break;
    case grpc::StatusCode::PERMISSION_DENIED: code = StatusCode::kPermissionDenied; break;
    case grpc::StatusCode::UNAUTHENTICATED: code = StatusCode::kUnauthenticated; break;
    case grpc::StatusCode::FAILED_PRECONDITION: code = StatusCode::kFailedPrecondition; break;
    case grpc::StatusCode::OUT_OF_RANGE: code = StatusCode::kOutOfRange; break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: code = StatusCode::kResourceExhausted; break;
    case grpc::StatusCode::DEADLINE_EXCEEDED: code = StatusCode::kDeadlineExceeded; break;
    case grpc::StatusCode::UNAVAILABLE: code = StatusCode::kUnavailable; break;
    case grpc::StatusCode::DATA_LOSS: code = StatusCode::kDataLoss; break;
    case grpc::StatusCode::UNIMPLEMENTED: code = StatusCode::kUnimplemented; break;
    default: code = StatusCode::kInternal; break;
  }
  const std::string& said = status.error_message();
  std::string message = HasHiddenCharacters(said) || said.size() > kMaxPeerMessageChars
                            ? EscapeUntrusted(said, kMaxPeerMessageChars)
                            : said;
  // A peer that names the call as the caller does ("forget worker 'w1': it is alive") is not
  // named twice.
  if (!context.empty() && message.rfind(context + ": ", 0) != 0) message = context + ": " + message;
  return Status(code, message);
}

}  // namespace tessera::wire
