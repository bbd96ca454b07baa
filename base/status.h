// Status and Result<T>: Tessera's one error model across threads, layers and RPCs.
//
// A Status is cheap to copy when OK (no allocation). Errors carry a code and a message that
// says what was expected, what came, and which input (file, field, worker, round) it came
// from. Exceptions are reserved for programming errors; anything a user, a peer or the disk
// can cause is a Status.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tessera {

enum class StatusCode {
  kOk = 0,
  kCancelled,
  kInvalidArgument,     // bad input: a malformed spec, a wrong shape, NaN
  kNotFound,            // a file, job or worker that does not exist
  kAlreadyExists,
  kPermissionDenied,    // a wrong join token
  kUnauthenticated,     // a missing or stale session credential
  kFailedPrecondition,  // right input, wrong state (an update for a past round)
  kOutOfRange,
  kResourceExhausted,   // out of memory, disk full
  kDeadlineExceeded,    // a peer or a round ran past its deadline
  kUnavailable,         // a peer is gone or not reachable
  kDataLoss,            // a truncated or corrupt file or transfer
  kUnimplemented,
  kInternal,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  const std::string& message() const;
  // "INVALID_ARGUMENT: job.toml:12: field 'rounds': expected an integer, got a string".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>", keeping the code.
  Status WithContext(std::string_view context) const;

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const State> state_;
};

Status CancelledError(std::string message);
Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status PermissionDeniedError(std::string message);
Status UnauthenticatedError(std::string message);
Status FailedPreconditionError(std::string message);
Status OutOfRangeError(std::string message);
Status ResourceExhaustedError(std::string message);
Status DeadlineExceededError(std::string message);
Status UnavailableError(std::string message);
Status DataLossError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);

// Result<T> holds a T or an error Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : value_(std::move(status)) {  // NOLINT
    if (std::get<Status>(value_).ok()) {
      value_ = InternalError("Result constructed from an OK status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(value_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(value_);
  }
  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> value_;
};

}  // namespace tessera

#define TESSERA_CONCAT_INNER(a, b) a##b
#define TESSERA_CONCAT(a, b) TESSERA_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` is not OK.
#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::tessera::Status _tessera_status = (expr);    \
    if (!_tessera_status.ok()) return _tessera_status; \
  } while (0)

// ASSIGN_OR_RETURN(auto x, MakeX()); declares x from a Result or returns its error.
#define ASSIGN_OR_RETURN(decl, expr) \
  ASSIGN_OR_RETURN_IMPL(TESSERA_CONCAT(_tessera_result_, __LINE__), decl, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  decl = std::move(tmp).value()
