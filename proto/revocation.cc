#include "proto/revocation.h"

#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <ctime>
#include <fstream>

#include "base/escape.h"
#include "proto/openssl_handles.h"

namespace tessera::wire {
namespace {

struct CrlFree {
  void operator()(X509_CRL* c) const { X509_CRL_free(c); }
};
using CrlPtr = std::unique_ptr<X509_CRL, CrlFree>;

int64_t ToUnixTime(const ASN1_TIME* time) {
  std::tm tm{};
  if (time == nullptr || ASN1_TIME_to_tm(time, &tm) != 1) return 0;
  return static_cast<int64_t>(timegm(&tm));
}

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
  if (!crl) {
    return InvalidArgumentError(what + ": expected a PEM certificate revocation list (BEGIN X509 CRL), found none "
                                       "that parses");
  }
  if (!SignedByCa(crl.get(), ca_pem)) {
    return InvalidArgumentError(what + ": the certificate revocation list is not signed by this coordinator's client CA");
  }
  RevocationList list;
  list.this_update_unix = ToUnixTime(X509_CRL_get0_lastUpdate(crl.get()));
  STACK_OF(X509_REVOKED)* revoked = X509_CRL_get_REVOKED(crl.get());
  const int count = revoked != nullptr ? sk_X509_REVOKED_num(revoked) : 0;
  for (int i = 0; i < count; ++i) {
    list.serials.insert(SerialHex(X509_REVOKED_get0_serialNumber(sk_X509_REVOKED_value(revoked, i))));
  }
  return list;
}

Result<std::shared_ptr<RevocationFile>> RevocationFile::Open(const std::string& flag, const std::string& path,
                                                             const std::string& ca_pem,
                                                             std::chrono::milliseconds recheck) {
  std::shared_ptr<RevocationFile> file(new RevocationFile(flag, path, ca_pem, recheck));
  std::lock_guard<std::mutex> lock(file->mu_);
  RETURN_IF_ERROR(file->Load());
  return file;
}

std::string RevocationFile::Stamp() const {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) return "";
  return std::to_string(st.st_size) + "/" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec) + "/" + std::to_string(st.st_ino);
}

Status RevocationFile::Load() {
  checked_ = std::chrono::steady_clock::now();
  stamp_ = Stamp();
  const std::string named = flag_ + " " + QuoteUntrusted(path_, 256);
  std::ifstream in(path_, std::ios::binary);
  if (!in) return InvalidArgumentError(named + ": cannot read it");
  std::string text(kMaxRevocationListBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  ASSIGN_OR_RETURN(RevocationList list, ParseRevocationList(text, ca_pem_, named));
  list_ = std::make_shared<const RevocationList>(std::move(list));
  return Status::Ok();
}

bool RevocationFile::Revoked(const std::string& serial_hex, std::string* problem) {
  std::shared_ptr<const RevocationList> list;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (now - checked_ >= recheck_) {
      checked_ = now;
      const std::string stamp = Stamp();
      if (stamp != stamp_) {
        Status loaded = Load();
        if (!loaded.ok() && problem != nullptr) {
          *problem = loaded.message() + "; the list read before stays in force";
        }
      }
    }
    list = list_;
  }
  return list != nullptr && list->serials.count(serial_hex) > 0;
}

}  // namespace tessera::wire
