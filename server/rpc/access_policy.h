// Who may call what at the coordinator (docs/SECURITY.md has the whole threat model).
//
//  - Join: the join token, when any is configured (several may be, one per site, each with a
//    label); under mutual TLS also a tessera-worker certificate whose CN is the name joined
//    under. A name joined with a token alone is bound, at its first join, to that token's
//    label: a holder of another site's token cannot take it (the caller persists the binding,
//    StateStore::BindWorkerName). Under mutual TLS the CA binds names: CN = name.
//  - Calls after Join (heartbeat, task channel, model download, update upload, rendezvous):
//    the session Join returned; under mutual TLS also the worker's own certificate.
//  - The job service (submit, list, watch, cancel, workers): an operator: a tessera-operator
//    certificate (mutual TLS) or the admin token ("authorization: Bearer TOKEN").
//
// Secrets are compared in constant time. Refusals name the caller's claim (escaped) and what
// was expected, never a secret. Thread-safe (immutable after construction).
#pragma once

#include <array>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "proto/transport_security.h"

namespace tessera::server {

class AccessPolicy {
 public:
  // `join_tokens`: label -> token. `mutual_tls`: the server verifies client certificates.
  AccessPolicy(std::map<std::string, std::string> join_tokens, std::string admin_token, bool mutual_tls);

  // The join tokens and the admin token: labels are names (1 to 64 letters, digits, '-', '_'
  // or '.'), tokens 8 to 1024 bytes without whitespace; workers and operators each have
  // some credential. InvalidArgument saying which flag to give otherwise.
  Status Validate() const;

  // Admits `name` joining with `token` from `peer`. Returns the credential to bind the name to
  // ("token:LABEL"), or "" when mutual TLS already binds it (CN = name). PermissionDenied
  // naming the worker and the reason otherwise.
  Result<std::string> CheckJoin(const wire::PeerIdentity& peer, const std::string& name,
                                const std::string& token) const;
  // Under mutual TLS: the caller is the worker `worker_id` itself. OK otherwise.
  Status CheckWorkerCall(const wire::PeerIdentity& peer, const std::string& worker_id) const;
  // Where an operator's call arrives: the refusals name it and say how to give the token.
  enum class Door { kJobService, kMonitoringPort };
  // An operator: a tessera-operator certificate, or `authorization` ("Bearer TOKEN", null
  // when the call has none) holding the admin token. The scheme's name is matched in any
  // case and followed by one or more spaces (RFC 9110 section 11). Unauthenticated when the
  // call carries no operator credential (no header, or "Bearer" with no token after it),
  // PermissionDenied when it carries a wrong one (another token, another scheme, a
  // certificate of another role).
  Status CheckOperator(const wire::PeerIdentity& peer, const std::string* authorization,
                       Door door = Door::kJobService) const;

  bool mutual_tls() const { return mutual_tls_; }

 private:
  using Digest = std::array<unsigned char, 32>;  // SHA-256
  static Digest DigestOf(std::string_view secret);

  std::map<std::string, std::string> join_tokens_;
  std::string admin_token_;
  bool mutual_tls_;
  // The configured tokens' digests, made once: a call hashes only the secret it presents.
  std::vector<std::pair<std::string, Digest>> join_digests_;  // label, digest
  Digest admin_digest_{};
};

// The coordinator's --join-token-file: one token per line, "LABEL TOKEN" (one label per site),
// or a lone "TOKEN" (labelled "default"); blank lines and lines starting with '#' are skipped,
// and a token may not start with '#' (a comment after a token is refused, not taken as one).
// At most 256 KiB and 1000 tokens. InvalidArgument naming the file and line otherwise; a
// token is never echoed.
Result<std::map<std::string, std::string>> ReadJoinTokenFile(const std::string& path);

}  // namespace tessera::server
