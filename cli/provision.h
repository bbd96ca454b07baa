// `tessera provision`: the certificates of one deployment, made with OpenSSL's libcrypto.
//
// A deployment has one CA; the coordinator's certificate (serverAuth, with the names workers
// and operators dial it by, plus localhost, 127.0.0.1 and ::1) and one client certificate per
// worker and per operator (clientAuth). The role is the certificate's OU (tessera-coordinator,
// tessera-worker, tessera-operator: proto/transport_security.h) and the name is its CN, so a
// worker's certificate is its identity: the coordinator admits it under that name only.
// Keys are ECDSA P-256; certificates are signed with SHA-256.
//
// On disk, every identity is one directory that is copied to the machine that uses it, and
// that a binary takes with --tls-dir:
//   OUT/ca/ca.crt, ca.key                  the CA (keep ca.key offline)
//   OUT/coordinator/ca.crt, tls.crt, tls.key
//   OUT/workers/NAME/ca.crt, tls.crt, tls.key
//   OUT/operators/NAME/ca.crt, tls.crt, tls.key
// Keys are written with mode 600, directories 700. Running it again on the same OUT reuses the
// CA and keeps every identity that exists, so adding a worker later is the same command.
//
// Thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera::cli {

struct CertificateAuthority {
  std::string cert_pem;
  std::string key_pem;
};

struct IssuedCertificate {
  std::string cert_pem;
  std::string key_pem;
};

struct CertificateRequest {
  std::string common_name;
  std::string role;                // the OU
  std::vector<std::string> hosts;  // subjectAltNames: DNS names or IP addresses (server)
  bool server = false;             // serverAuth; otherwise clientAuth
  int64_t not_before_unix = 0;
  int64_t not_after_unix = 0;
};

// A self-signed CA named `name`, valid in [not_before, not_after].
Result<CertificateAuthority> CreateCertificateAuthority(const std::string& name, int64_t not_before_unix,
                                                        int64_t not_after_unix);
// A certificate and a fresh key for `request`, signed by `ca`.
Result<IssuedCertificate> IssueCertificate(const CertificateAuthority& ca, const CertificateRequest& request);

// Writes `dir`/ca.crt, tls.crt and tls.key (mode 600), creating `dir` (mode 700).
Status WriteIdentity(const std::string& dir, const std::string& ca_pem, const IssuedCertificate& issued);

struct ProvisionOptions {
  std::string out_dir;
  std::vector<std::string> coordinator_hosts;  // at least one
  std::vector<std::string> workers;
  std::vector<std::string> operators;
  int64_t days = 365;  // validity of the certificates issued now (1 to 3650)
};

// Checks the options (names: 1 to 64 letters, digits, '-', '_' or '.'; hosts: DNS names or IP
// addresses), then creates or reuses the CA and issues what is missing. Returns one line per
// identity, saying where it is and whether it was made now or kept.
Result<std::string> Provision(const ProvisionOptions& options);

// Splits "a,b,c" (empty parts are an error naming `flag`).
Result<std::vector<std::string>> SplitList(const std::string& flag, const std::string& text);

}  // namespace tessera::cli
