#include "proto/revocation.h"

#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>

#include "base/escape.h"
#include "proto/openssl_handles.h"
#include "proto/transport_security.h"

namespace tessera::wire {
namespace {

struct CrlFree {
  void operator()(X509_CRL* c) const { X509_CRL_free(c); }
};
using CrlPtr = std::unique_ptr<X509_CRL, CrlFree>;

// Whether a certificate in `ca_pem` has the CRL's issuer as its subject and signed it.
bool SignedByCa(X509_CRL* crl, const std::string& ca_pem) {
  BioPtr bio(BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size())));
  while (X509* raw = bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr) {
    X509Ptr ca(raw);
    if (X509_NAME_cmp(X509_CRL_get_issuer(crl), X509_get_subject_name(ca.get())) != 0) continue;
    EVP_PKEY* key = X509_get0_pubkey(ca.get());
    if (key != nullptr && X509_CRL_verify(crl, key) == 1) return true;
  }
  return false;
}

}  // namespace

int64_t ToUnix(const ASN1_TIME* time) {
  std::tm tm{};
  if (time == nullptr || ASN1_TIME_to_tm(time, &tm) != 1) return 0;
  return static_cast<int64_t>(timegm(&tm));
}

std::string SerialHex(const ASN1_INTEGER* serial) {
  if (serial == nullptr) return "";
  BIGNUM* bn = ASN1_INTEGER_to_BN(serial, nullptr);
  if (bn == nullptr) return "";
  char* hex = BN_bn2hex(bn);
  std::string text = hex != nullptr ? hex : "";
  OPENSSL_free(hex);
  BN_free(bn);
  return text;
}

Result<RevocationList> ParseRevocationList(const std::string& pem, const std::string& ca_pem, const std::string& what) {
  if (pem.size() > kMaxRevocationListBytes) {
    return InvalidArgumentError(what + ": expected a certificate revocation list of at most " +
                                std::to_string(kMaxRevocationListBytes) + " bytes, got " + std::to_string(pem.size()));
  }
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  CrlPtr crl(bio ? PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  // This runs on gRPC's threads too: leave no error behind for a TLS connection's next call.
  ERR_clear_error();
  if (!crl) {
    return InvalidArgumentError(what + ": expected a PEM certificate revocation list (BEGIN X509 CRL), found none "
                                       "that parses");
  }
  const bool signed_by_ca = SignedByCa(crl.get(), ca_pem);
  ERR_clear_error();
  if (!signed_by_ca) {
    return InvalidArgumentError(what + ": the certificate revocation list is not signed by this coordinator's client CA");
  }
  RevocationList list;
  list.this_update_unix = ToUnix(X509_CRL_get0_lastUpdate(crl.get()));
  STACK_OF(X509_REVOKED)* revoked = X509_CRL_get_REVOKED(crl.get());
  const int count = revoked != nullptr ? sk_X509_REVOKED_num(revoked) : 0;
  for (int i = 0; i < count; ++i) {
    list.serials.insert(SerialHex(X509_REVOKED_get0_serialNumber(sk_X509_REVOKED_value(revoked, i))));
  }
  return list;
}

Result<std::shared_ptr<RevocationFile>> RevocationFile::Open(const std::string& flag, const std::string& path,
                                                             const std::string& ca_pem,
                                                             std::chrono::milliseconds recheck, bool optional) {
  std::shared_ptr<RevocationFile> file(new RevocationFile(flag, path, ca_pem, recheck, optional));
  const std::string stamp = file->Stamp();
  ASSIGN_OR_RETURN(RevocationList list, file->Load());
  std::lock_guard<std::mutex> lock(file->mu_);
  file->stamp_ = stamp;
  file->checked_ = std::chrono::steady_clock::now();
  file->list_ = std::make_shared<const RevocationList>(std::move(list));
  return file;
}

std::string RevocationFile::Stamp() const {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return "";
  return std::to_string(st.st_size) + "/" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec) + "/" + std::to_string(st.st_ino);
}

Result<RevocationList> RevocationFile::Load() const {
  const std::string named = flag_ + " " + QuoteUntrusted(path_, 256);
  struct stat st {};
  if (optional_ && ::lstat(path_.c_str(), &st) != 0 && errno == ENOENT) return RevocationList{};
  RETURN_IF_ERROR(RefuseDirectory(named, path_));
  std::ifstream in(path_, std::ios::binary);
  if (!in) return InvalidArgumentError(named + ": cannot read it (" + std::strerror(errno) + ")");
  std::string text(kMaxRevocationListBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return ParseRevocationList(text, ca_pem_, named);
}

std::string RevocationFile::RevokedReason(const std::string& serial_hex) const {
  return "it is revoked (serial " + serial_hex.substr(0, 80) + ", in the certificate revocation list " +
         QuoteUntrusted(path_, 256) + ")";
}

bool RevocationFile::Revoked(const std::string& serial_hex, std::string* problem) {
  std::shared_ptr<const RevocationList> list;
  bool look = false;
  std::string previous;  // the stamp of the file looked at last
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (!loading_ && now - checked_ >= recheck_) {
      checked_ = now;
      loading_ = look = true;
      previous = stamp_;
    }
    list = list_;
  }
  if (look) {
    // One caller at a time gets here; the file is read without the lock.
    const std::string stamp = Stamp();
    std::shared_ptr<const RevocationList> fresh;
    std::string why;
    if (stamp != previous) {
      Result<RevocationList> loaded = Load();
      if (!loaded.ok()) {
        why = loaded.status().message();
      } else if (list != nullptr && loaded->this_update_unix < list->this_update_unix) {
        why = flag_ + " " + QuoteUntrusted(path_, 256) + ": the new certificate revocation list is older (thisUpdate " +
              FormatUnixTime(loaded->this_update_unix) + ") than the one in force (" +
              FormatUnixTime(list->this_update_unix) + ")";
      } else {
        fresh = std::make_shared<const RevocationList>(std::move(loaded).value());
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    stamp_ = stamp;
    if (fresh) list_ = fresh;
    list = list_;
    loading_ = false;
    if (!why.empty() && problem != nullptr) *problem = why + "; the list read before stays in force";
  }
  return list != nullptr && list->serials.count(serial_hex) > 0;
}

}  // namespace tessera::wire
