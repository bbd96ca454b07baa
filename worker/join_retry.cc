#include "worker/join_retry.h"

#include <algorithm>
#include <cctype>

namespace tessera::worker {
namespace {

bool Contains(const std::string& text, std::string_view what) {
  return std::search(text.begin(), text.end(), what.begin(), what.end(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
         }) != text.end();
}

}  // namespace

std::string TlsHandshakeHint(const Status& failure) {
  // gRPC's words for a handshake that failed (a certificate from another CA: "Ssl handshake
  // failed: ... certificate verify failed"), and for a certificate that does not name the host
  // dialled ("Peer name HOST is not in peer certificate").
  if (failure.code() != StatusCode::kUnavailable ||
      (!Contains(failure.message(), "handshake failed") && !Contains(failure.message(), "not in peer certificate"))) {
    return "";
  }
  return "the TLS handshake with the coordinator failed, which trying again does not mend: check that --tls-ca (or "
         "ca.crt in --tls-dir) is the CA that issued the coordinator's certificate, and that the certificate names "
         "the host in --coordinator (or --tls-server-name)";
}

std::optional<std::string> JoinRetryLog::Failed(const Status& failure, uint32_t wait_ms, Clock::time_point now) {
  const std::string& message = failure.message();
  // A failure's kind, not its message: gRPC's message names the address it tried last, which
  // alternates for a host of several addresses.
  const std::string hint = TlsHandshakeHint(failure);
  const std::string kind = std::to_string(static_cast<int>(failure.code())) + (hint.empty() ? "" : " handshake");
  const bool same = last_kind_ && *last_kind_ == kind;
  if (same && now - last_said_ < kRepeatEvery) {
    ++unsaid_;
    return std::nullopt;
  }
  std::string line = "could not join the coordinator: " + message;
  if (!hint.empty()) line += " (" + hint + ")";
  line += "; trying again in " + std::to_string(wait_ms) + " ms";
  if (same && unsaid_ > 0) {
    line += " (" + std::to_string(unsaid_) + " more tries failed the same way since this was last said)";
  }
  last_kind_ = kind;
  last_said_ = now;
  unsaid_ = 0;
  return line;
}

void JoinRetryLog::Joined() {
  last_kind_.reset();
  unsaid_ = 0;
}

}  // namespace tessera::worker
