#include "server/rpc/access_policy.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <cctype>
#include <fstream>
#include <optional>
#include <sstream>

#include "base/escape.h"
#include "base/flags.h"
#include "base/names.h"

namespace tessera::server {
namespace {

Status CheckSecret(const std::string& what, const std::string& secret) {
  bool ok = secret.size() >= 8 && secret.size() <= 1024;
  for (char c : secret) ok = ok && !std::isspace(static_cast<unsigned char>(c)) && c != '\0';
  if (!ok) {
    return InvalidArgumentError(what + ": expected 8 to 1024 bytes without whitespace, got " +
                                std::to_string(secret.size()) + " bytes");
  }
  return Status::Ok();
}

// The token of an Authorization value "Bearer TOKEN": the scheme's name in any case, then one
// or more spaces (RFC 9110 section 11.4: 1*SP). "" when the scheme stands alone; nullopt for
// another scheme.
std::optional<std::string_view> BearerToken(std::string_view value) {
  constexpr std::string_view kScheme = "bearer";
  if (value.size() < kScheme.size()) return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(value[i])) != kScheme[i]) return std::nullopt;
  }
  std::string_view rest = value.substr(kScheme.size());
  if (!rest.empty() && rest[0] != ' ') return std::nullopt;  // "Bearerish ..."
  const size_t start = rest.find_first_not_of(' ');
  return start == std::string_view::npos ? std::string_view() : rest.substr(start);
}

}  // namespace

AccessPolicy::AccessPolicy(std::map<std::string, std::string> join_tokens, std::string admin_token, bool mutual_tls)
    : join_tokens_(std::move(join_tokens)), admin_token_(std::move(admin_token)), mutual_tls_(mutual_tls) {
  for (const auto& [label, token] : join_tokens_) join_digests_.emplace_back(label, DigestOf(token));
  admin_digest_ = DigestOf(admin_token_);
}

// Secrets are compared by their SHA-256 digests in constant time: comparing the secrets
// themselves would return early on a length mismatch, and so tell a caller who times its
// attempts how long the token is.
AccessPolicy::Digest AccessPolicy::DigestOf(std::string_view secret) {
  Digest digest{};
  SHA256(reinterpret_cast<const unsigned char*>(secret.data()), secret.size(), digest.data());
  return digest;
}

Status AccessPolicy::Validate() const {
  for (const auto& [label, token] : join_tokens_) {
    if (!IsName(label, 64)) {
      return InvalidArgumentError("join token label " + QuoteUntrusted(label) +
                                  ": expected 1 to 64 letters, digits, '-', '_' or '.'");
    }
    RETURN_IF_ERROR(CheckSecret("join token '" + label + "'", token));
  }
  if (!admin_token_.empty()) RETURN_IF_ERROR(CheckSecret("the admin token", admin_token_));
  if (join_tokens_.empty() && !mutual_tls_) {
    return InvalidArgumentError(
        "workers need a credential to join: a join token (--join-token-file) or mutual TLS with worker "
        "certificates (--tls-client-ca, or --tls-dir)");
  }
  if (admin_token_.empty() && !mutual_tls_) {
    return InvalidArgumentError(
        "operators need a credential for the job service: an admin token (--admin-token-file) or mutual TLS "
        "with operator certificates (--tls-client-ca, or --tls-dir)");
  }
  return Status::Ok();
}

Result<std::string> AccessPolicy::CheckJoin(const wire::PeerIdentity& peer, const std::string& name,
                                            const std::string& token) const {
  const std::string who = "join refused for worker " + QuoteUntrusted(name);
  std::string label;
  if (!join_digests_.empty()) {
    const Digest presented = DigestOf(token);
    for (const auto& [l, digest] : join_digests_) {
      // Every token is compared: no early exit.
      if (CRYPTO_memcmp(presented.data(), digest.data(), digest.size()) == 0) label = l;
    }
    if (label.empty()) return PermissionDeniedError(who + ": the join token does not match the coordinator's");
  }
  if (!mutual_tls_) return "token:" + label;
  if (!peer.has_certificate || peer.role != wire::kWorkerRole) {
    return PermissionDeniedError(who + ": a worker joins with a " + std::string(wire::kWorkerRole) +
                                 " certificate; this caller's is " +
                                 (peer.has_certificate ? "OU=" + QuoteUntrusted(peer.role) : std::string("none")));
  }
  if (peer.common_name != name) {
    return PermissionDeniedError(who + ": its certificate belongs to worker " + QuoteUntrusted(peer.common_name) +
                                 " (CN); a worker joins under the name its certificate carries");
  }
  return std::string();
}

Status AccessPolicy::CheckWorkerCall(const wire::PeerIdentity& peer, const std::string& worker_id) const {
  if (!mutual_tls_) return Status::Ok();
  if (!peer.has_certificate || peer.role != wire::kWorkerRole || peer.common_name != worker_id) {
    return PermissionDeniedError("worker " + QuoteUntrusted(worker_id) +
                                 ": the call must come from that worker's own certificate; this one is " +
                                 (peer.has_certificate ? QuoteUntrusted(peer.common_name) + " (OU=" +
                                                             EscapeUntrusted(peer.role) + ")"
                                                       : std::string("none")));
  }
  return Status::Ok();
}

Status AccessPolicy::CheckOperator(const wire::PeerIdentity& peer, const std::string* authorization,
                                   Door door) const {
  if (peer.has_certificate && peer.role == wire::kOperatorRole) return Status::Ok();
  const bool monitoring = door == Door::kMonitoringPort;
  const std::string where = monitoring ? "the monitoring port" : "the job service";
  const std::string refused = where + (monitoring ? " refused the request: " : " refused the call: ");
  const std::optional<std::string_view> token =
      authorization != nullptr ? BearerToken(*authorization) : std::optional<std::string_view>();
  if (authorization != nullptr && !token.has_value()) {
    return PermissionDeniedError(refused + "expected an Authorization of \"Bearer TOKEN\" with the admin token, "
                                 "got another scheme");
  }
  if (token.has_value() && !token->empty()) {
    if (!admin_token_.empty() &&
        CRYPTO_memcmp(DigestOf(*token).data(), admin_digest_.data(), admin_digest_.size()) == 0) {
      return Status::Ok();
    }
    return PermissionDeniedError(refused + "its admin token does not match the coordinator's");
  }
  if (peer.has_certificate) {
    return PermissionDeniedError(where + " needs an operator: a " + std::string(wire::kOperatorRole) +
                                 " certificate or the admin token; this caller's certificate is " +
                                 QuoteUntrusted(peer.common_name) + " (OU=" + EscapeUntrusted(peer.role) + ")");
  }
  return UnauthenticatedError(where + " needs an operator credential: a " + std::string(wire::kOperatorRole) +
                              " certificate (mutual TLS) or the admin token (" +
                              (monitoring ? "\"Authorization: Bearer TOKEN\"" : "tessera --admin-token-file") + ")");
}

Result<std::map<std::string, std::string>> ReadJoinTokenFile(const std::string& path) {
  constexpr size_t kMaxBytes = 256 * 1024;
  constexpr size_t kMaxTokens = 1000;
  const std::string named = "--join-token-file " + QuoteUntrusted(path, 256);
  RETURN_IF_ERROR(RefuseDirectory(named, path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError(named + ": cannot read it");
  std::string text(kMaxBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxBytes) return InvalidArgumentError(named + ": expected at most 256 KiB, got more");
  std::map<std::string, std::string> tokens;
  std::istringstream lines(text);
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    const std::string where = named + ":" + std::to_string(number);
    std::istringstream fields(line);
    std::string first, second, third;
    fields >> first >> second >> third;
    if (first.empty() || first[0] == '#') continue;
    if (!third.empty()) return InvalidArgumentError(where + ": expected TOKEN or LABEL TOKEN, got more fields");
    // "TOKEN #note" would make the note the token and the token its label.
    if (!second.empty() && second[0] == '#') {
      return InvalidArgumentError(where + ": expected TOKEN or LABEL TOKEN, got a second field starting with '#' "
                                          "(a comment goes on a line of its own)");
    }
    const std::string label = second.empty() ? "default" : first;
    const std::string token = second.empty() ? first : second;
    if (tokens.count(label)) return InvalidArgumentError(where + ": label " + QuoteUntrusted(label) + " is given twice");
    if (tokens.size() == kMaxTokens) return InvalidArgumentError(where + ": expected at most 1000 tokens");
    AccessPolicy single({{label, token}}, "", true);
    if (Status s = single.Validate(); !s.ok()) return InvalidArgumentError(where + ": " + s.message());
    tokens[label] = token;
  }
  if (tokens.empty()) return InvalidArgumentError(named + ": holds no token");
  return tokens;
}

}  // namespace tessera::server
