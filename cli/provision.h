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
//   OUT/ca/crl.pem, OUT/coordinator/crl.pem  the certificate revocation list, once --revoke
//                                          has revoked a certificate
// Keys are written with mode 600, directories 700; every file is written whole and renamed into
// place, an identity's tls.crt last, as it marks the identity as made. Running it again on the
// same OUT reuses the CA and keeps every identity that exists, so adding a worker later is the
// same command; it needs ca.key back beside ca.crt (a CA certificate without its key is
// refused, never replaced; so is a ca.key that is not the certificate's).
// --revoke NAME adds the certificates of the worker or operator NAME to the revocation list,
// signed by the CA, which the coordinator reads with --tls-dir (or --tls-crl) and rereads when
// it changes; to give NAME a new certificate, delete its directory and provision it again.
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

// A certificate revocation list signed by `ca`: the entries of `existing_crl_pem` (when not
// empty; it must be this CA's) and the certificates in `cert_pems`, revoked at `now_unix`; valid
// until the CA expires. A certificate listed already keeps its first revocation date.
Result<std::string> RevokeCertificates(const CertificateAuthority& ca, const std::string& existing_crl_pem,
                                       const std::vector<std::string>& cert_pems, int64_t now_unix);

// Writes `dir`/ca.crt, tls.crt and tls.key (mode 600), creating `dir` (mode 700).
Status WriteIdentity(const std::string& dir, const std::string& ca_pem, const IssuedCertificate& issued);

struct ProvisionOptions {
  std::string out_dir;
  std::vector<std::string> coordinator_hosts;  // at least one
  std::vector<std::string> workers;
  std::vector<std::string> operators;
  std::vector<std::string> revoke;  // workers or operators whose certificates are revoked now
  int64_t days = 365;  // validity of the certificates issued now (1 to 3650)
};

// Checks the options (names: 1 to 64 letters, digits, '-', '_' or '.'; hosts: DNS names or IP
// addresses; --coordinator-host may be left out once the coordinator's certificate exists, and
// names given then must be ones that certificate carries: it is kept, not reissued),
// then creates or reuses the CA, issues what is missing and revokes what --revoke names.
// Returns one entry per identity, saying where it is and whether it was made now, kept or
// revoked.
struct ProvisionedIdentity {
  std::string identity;  // "ca", "coordinator", "worker", "operator", "revoked" or "crl"
  std::string dir;       // where its files are (for "crl", the list's file)
  bool made = false;     // made by this call
  std::string note;      // "made", "kept", "made; keep ca.key offline", "CN x, serial y", ...
};
struct ProvisionReport {
  std::vector<ProvisionedIdentity> identities;
  // One line per identity: "worker        DIR (made)".
  std::string Text() const;
};
Result<ProvisionReport> ProvisionIdentities(const ProvisionOptions& options);
// The checks of the options ProvisionIdentities makes before it reads or writes a file (--out
// given, --coordinator-host given or its certificate there, --days, the hosts' and names' form,
// a name listed twice): each a usage error, InvalidArgument naming its flag.
Status CheckProvisionOptions(const ProvisionOptions& options);
// ProvisionIdentities(options).Text().
Result<std::string> Provision(const ProvisionOptions& options);

// Splits "a,b,c" (empty parts are an error naming `flag`).
Result<std::vector<std::string>> SplitList(const std::string& flag, const std::string& text);

}  // namespace tessera::cli
