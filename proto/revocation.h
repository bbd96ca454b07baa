// Certificate revocation under mutual TLS: a certificate revocation list (RFC 5280 CRL, PEM)
// signed by the client CA names the serial numbers of the certificates the coordinator refuses
// from then on. `tessera provision --revoke NAME` writes it (cli/provision.h); the coordinator
// reads it with --tls-crl (or DIR/crl.pem beside --tls-dir, which may appear later), refuses a
// revoked certificate at every call, on its gRPC port and on its monitoring port, also on
// connections it had admitted before, and rereads the file when it changes.
//
// The file is hostile until checked: at most 4 MiB, PEM that parses, signed by a certificate of
// the client CA, and no older (thisUpdate) than the list in force. A list whose nextUpdate has
// passed stays in force (refusing every caller would be the other choice); it holds until a
// newer file replaces it.
//
// Thread-safe: RevocationFile may be asked from any of gRPC's threads.
#pragma once

#include <openssl/asn1.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

#include "base/status.h"

namespace tessera::wire {

inline constexpr size_t kMaxRevocationListBytes = size_t{4} << 20;

struct RevocationList {
  std::unordered_set<std::string> serials;  // SerialHex of each revoked certificate
  int64_t this_update_unix = 0;
};

// A serial number as upper-case hex in whole bytes ("0A" for 10; a '-' before a negative one),
// as OpenSSL's BN_bn2hex prints it. Certificates and CRL entries go through the same function.
std::string SerialHex(const ASN1_INTEGER* serial);

// An ASN.1 time as seconds since the epoch (0 for none or one that does not convert).
int64_t ToUnix(const ASN1_TIME* time);

// Parses `pem` (a PEM X509 CRL) and checks that a certificate in `ca_pem` issued and signed it.
// InvalidArgument naming `what` otherwise.
Result<RevocationList> ParseRevocationList(const std::string& pem, const std::string& ca_pem, const std::string& what);

// A CRL file the coordinator applies.
class RevocationFile {
 public:
  // Loads `path` now; InvalidArgument naming `flag` and the file when it cannot be read, is too
  // large, does not parse, or is not signed by the client CA (`ca_pem`). With `optional`, a
  // file that does not exist (yet) is an empty list. The file is looked at again at most every
  // `recheck` (0: at every question).
  static Result<std::shared_ptr<RevocationFile>> Open(const std::string& flag, const std::string& path,
                                                      const std::string& ca_pem, std::chrono::milliseconds recheck,
                                                      bool optional = false);

  // Whether the certificate with serial `serial_hex` is revoked. First, when `recheck` has
  // passed and the file's size, modification time or inode changed, one caller rereads it
  // (outside the lock: the others answer from the list in force meanwhile). A file that does not
  // load, or is older than the list in force, leaves that list in force, and `*problem` is set to
  // why (once per change of the file; left alone otherwise).
  bool Revoked(const std::string& serial_hex, std::string* problem);

  const std::string& path() const { return path_; }
  // "it is revoked (serial S, in the certificate revocation list 'PATH')".
  std::string RevokedReason(const std::string& serial_hex) const;

 private:
  RevocationFile(std::string flag, std::string path, std::string ca_pem, std::chrono::milliseconds recheck,
                 bool optional)
      : flag_(std::move(flag)), path_(std::move(path)), ca_pem_(std::move(ca_pem)), recheck_(recheck),
        optional_(optional) {}
  // Reads and parses the file (an empty list for an optional file that is not there).
  Result<RevocationList> Load() const;
  // The file's size, modification time and inode, or "" when there is no file.
  std::string Stamp() const;

  const std::string flag_;
  const std::string path_;
  const std::string ca_pem_;
  const std::chrono::milliseconds recheck_;
  const bool optional_;
  std::mutex mu_;
  std::shared_ptr<const RevocationList> list_;     // guarded by mu_
  std::string stamp_;                              // guarded by mu_: of the last file looked at
  std::chrono::steady_clock::time_point checked_;  // guarded by mu_
  bool loading_ = false;                           // guarded by mu_: a caller is rereading
};

}  // namespace tessera::wire
