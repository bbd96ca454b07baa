#include "base/status.h"

namespace tessera {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) {
    state_ = std::make_shared<const State>(State{code, std::move(message)});
  }
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(state_->code)) + ": " + state_->message;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(state_->code, std::string(context) + ": " + state_->message);
}

#define TESSERA_DEFINE_ERROR(Name, Code) \
  Status Name(std::string message) { return Status(StatusCode::Code, std::move(message)); }
TESSERA_DEFINE_ERROR(CancelledError, kCancelled)
TESSERA_DEFINE_ERROR(InvalidArgumentError, kInvalidArgument)
TESSERA_DEFINE_ERROR(NotFoundError, kNotFound)
TESSERA_DEFINE_ERROR(AlreadyExistsError, kAlreadyExists)
TESSERA_DEFINE_ERROR(PermissionDeniedError, kPermissionDenied)
TESSERA_DEFINE_ERROR(UnauthenticatedError, kUnauthenticated)
TESSERA_DEFINE_ERROR(FailedPreconditionError, kFailedPrecondition)
TESSERA_DEFINE_ERROR(OutOfRangeError, kOutOfRange)
TESSERA_DEFINE_ERROR(ResourceExhaustedError, kResourceExhausted)
TESSERA_DEFINE_ERROR(DeadlineExceededError, kDeadlineExceeded)
TESSERA_DEFINE_ERROR(UnavailableError, kUnavailable)
TESSERA_DEFINE_ERROR(DataLossError, kDataLoss)
TESSERA_DEFINE_ERROR(UnimplementedError, kUnimplemented)
TESSERA_DEFINE_ERROR(InternalError, kInternal)
#undef TESSERA_DEFINE_ERROR

}  // namespace tessera
