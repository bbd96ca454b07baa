#include "cli/provision.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>

#include "base/escape.h"
#include "base/host_port.h"
#include "base/whole_file.h"
#include "proto/openssl_handles.h"
#include "proto/revocation.h"
#include "proto/transport_security.h"

namespace tessera::cli {
namespace {

struct ExtensionFree {
  void operator()(X509_EXTENSION* e) const { X509_EXTENSION_free(e); }
};
using wire::BioPtr;
using wire::KeyPtr;
using wire::X509Ptr;

Status OpenSslError(const std::string& what) {
  return InternalError(what + " failed (OpenSSL)");
}

KeyPtr NewKey() { return KeyPtr(EVP_EC_gen("P-256")); }

std::string KeyToPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) return "";
  char* data = nullptr;
  const long length = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(length));
}

std::string CertToPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) return "";
  char* data = nullptr;
  const long length = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(length));
}

X509Ptr PemToCert(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return X509Ptr(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
}

KeyPtr PemToKey(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return KeyPtr(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr);
}

bool IsIpAddress(const std::string& host) {
  unsigned char buffer[16];
  return inet_pton(AF_INET, host.c_str(), buffer) == 1 || inet_pton(AF_INET6, host.c_str(), buffer) == 1;
}

// A certificate with serial, validity, subject and public key set; extensions and signature
// are the caller's.
Result<X509Ptr> NewCertificate(const std::string& common_name, const std::string& role, int64_t not_before,
                               int64_t not_after, EVP_PKEY* key) {
  X509Ptr cert(X509_new());
  if (!cert || X509_set_version(cert.get(), 2) != 1) return OpenSslError("X509_new");
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return OpenSslError("RAND_bytes");
  serial[0] &= 0x7F;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  const bool serial_set = bn && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get())) != nullptr;
  BN_free(bn);
  if (!serial_set) return OpenSslError("serial number");
  if (!ASN1_TIME_set(X509_getm_notBefore(cert.get()), static_cast<time_t>(not_before)) ||
      !ASN1_TIME_set(X509_getm_notAfter(cert.get()), static_cast<time_t>(not_after))) {
    return OpenSslError("validity");
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  auto add = [&](const char* field, const std::string& value) {
    return X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8,
                                      reinterpret_cast<const unsigned char*>(value.c_str()), -1, -1, 0) == 1;
  };
  if (!add("O", "Tessera") || !add("OU", role) || !add("CN", common_name)) return OpenSslError("subject");
  if (X509_set_pubkey(cert.get(), key) != 1) return OpenSslError("public key");
  return cert;
}

Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  std::unique_ptr<X509_EXTENSION, ExtensionFree> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (!ext || X509_add_ext(cert, ext.get(), -1) != 1) return OpenSslError("extension " + value);
  return Status::Ok();
}

Status CheckName(const std::string& what, const std::string& name) {
  bool ok = !name.empty() && name.size() <= 64 && name != "." && name != "..";
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.');
  if (!ok) {
    return InvalidArgumentError(what + " " + QuoteUntrusted(name) +
                                ": expected 1 to 64 letters, digits, '-', '_' or '.'");
  }
  return Status::Ok();
}

Status CheckHost(const std::string& host) {
  if (!IsHost(host)) {
    return InvalidArgumentError("--coordinator-host " + QuoteUntrusted(host) +
                                ": expected a DNS name or an IP address");
  }
  return Status::Ok();
}

// Writes `path` whole (base/whole_file.h): into PATH.new, made new, its mode set before a
// byte is written whatever the umask, synced, then renamed over `path`, and the directory
// synced. A run that fails or dies half-way leaves `path` as it was or absent, never cut short.
Status WriteFile(const std::string& path, const std::string& content, mode_t mode) {
  return WriteFileWhole(path, content, WholeFileOptions{.mode = mode, .sync = true, .suffix = ".new"});
}

Result<std::string> ReadSmallFile(const std::string& path, size_t max_bytes = 64 * 1024) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return FailedPreconditionError("cannot read " + QuoteUntrusted(path, 256));
  std::string text(max_bytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > max_bytes) {
    return FailedPreconditionError(QuoteUntrusted(path, 256) + " is larger than " + std::to_string(max_bytes >> 10) +
                                   " KiB");
  }
  return text;
}

struct CrlFree {
  void operator()(X509_CRL* c) const { X509_CRL_free(c); }
};
using CrlPtr = std::unique_ptr<X509_CRL, CrlFree>;
struct TimeFree {
  void operator()(ASN1_TIME* t) const { ASN1_TIME_free(t); }
};

Status MakePrivateDirectory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return FailedPreconditionError("cannot create " + QuoteUntrusted(dir, 256) + ": " + ec.message());
  if (::chmod(dir.c_str(), 0700) != 0) {
    return FailedPreconditionError("cannot make " + QuoteUntrusted(dir, 256) + " private (mode 0700): " +
                                   std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

Result<CertificateAuthority> CreateCertificateAuthority(const std::string& name, int64_t not_before_unix,
                                                        int64_t not_after_unix) {
  KeyPtr key = NewKey();
  if (!key) return OpenSslError("EC key generation");
  ASSIGN_OR_RETURN(X509Ptr cert, NewCertificate(name, "tessera-ca", not_before_unix, not_after_unix, key.get()));
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get())) != 1) return OpenSslError("issuer");
  RETURN_IF_ERROR(AddExtension(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE,pathlen:0"));
  RETURN_IF_ERROR(AddExtension(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign"));
  RETURN_IF_ERROR(AddExtension(cert.get(), cert.get(), NID_subject_key_identifier, "hash"));
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) return OpenSslError("signing the CA");
  CertificateAuthority made{CertToPem(cert.get()), KeyToPem(key.get())};
  if (made.cert_pem.empty() || made.key_pem.empty()) return OpenSslError("writing the CA as PEM");
  return made;
}

Result<IssuedCertificate> IssueCertificate(const CertificateAuthority& ca, const CertificateRequest& request) {
  X509Ptr ca_cert = PemToCert(ca.cert_pem);
  KeyPtr ca_key = PemToKey(ca.key_pem);
  if (!ca_cert || !ca_key) return InvalidArgumentError("the CA's certificate or key does not parse");
  KeyPtr key = NewKey();
  if (!key) return OpenSslError("EC key generation");
  ASSIGN_OR_RETURN(X509Ptr cert, NewCertificate(request.common_name, request.role, request.not_before_unix,
                                                request.not_after_unix, key.get()));
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert.get())) != 1) return OpenSslError("issuer");
  RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert.get(), NID_basic_constraints, "critical,CA:FALSE"));
  RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert.get(), NID_key_usage, "critical,digitalSignature"));
  RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert.get(), NID_ext_key_usage, request.server ? "serverAuth" : "clientAuth"));
  RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert.get(), NID_subject_key_identifier, "hash"));
  RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert.get(), NID_authority_key_identifier, "keyid:always"));
  if (!request.hosts.empty()) {
    std::string names;
    for (const auto& host : request.hosts) {
      names += (names.empty() ? "" : ",") + std::string(IsIpAddress(host) ? "IP:" : "DNS:") + host;
    }
    RETURN_IF_ERROR(AddExtension(cert.get(), ca_cert.get(), NID_subject_alt_name, names));
  }
  if (X509_sign(cert.get(), ca_key.get(), EVP_sha256()) == 0) return OpenSslError("signing");
  IssuedCertificate issued{CertToPem(cert.get()), KeyToPem(key.get())};
  if (issued.cert_pem.empty() || issued.key_pem.empty()) return OpenSslError("writing the certificate as PEM");
  return issued;
}

Result<std::string> RevokeCertificates(const CertificateAuthority& ca, const std::string& existing_crl_pem,
                                       const std::vector<std::string>& cert_pems, int64_t now_unix) {
  X509Ptr ca_cert = PemToCert(ca.cert_pem);
  KeyPtr ca_key = PemToKey(ca.key_pem);
  if (!ca_cert || !ca_key) return InvalidArgumentError("the CA's certificate or key does not parse");
  CrlPtr crl(X509_CRL_new());
  if (!crl || X509_CRL_set_version(crl.get(), 1) != 1 ||
      X509_CRL_set_issuer_name(crl.get(), X509_get_subject_name(ca_cert.get())) != 1) {
    return OpenSslError("X509_CRL_new");
  }
  std::unique_ptr<ASN1_TIME, TimeFree> now(ASN1_TIME_set(nullptr, static_cast<time_t>(now_unix)));
  if (!now || X509_CRL_set1_lastUpdate(crl.get(), now.get()) != 1 ||
      X509_CRL_set1_nextUpdate(crl.get(), X509_get0_notAfter(ca_cert.get())) != 1) {
    return OpenSslError("the revocation list's dates");
  }
  std::set<std::string> listed;
  if (!existing_crl_pem.empty()) {
    RETURN_IF_ERROR(wire::ParseRevocationList(existing_crl_pem, ca.cert_pem, "the existing revocation list").status());
    BioPtr bio(BIO_new_mem_buf(existing_crl_pem.data(), static_cast<int>(existing_crl_pem.size())));
    CrlPtr old(bio ? PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr) : nullptr);
    if (!old) return OpenSslError("reading the existing revocation list");
    STACK_OF(X509_REVOKED)* entries = X509_CRL_get_REVOKED(old.get());
    for (int i = 0; entries != nullptr && i < sk_X509_REVOKED_num(entries); ++i) {
      X509_REVOKED* entry = sk_X509_REVOKED_value(entries, i);
      if (!listed.insert(wire::SerialHex(X509_REVOKED_get0_serialNumber(entry))).second) continue;
      X509_REVOKED* copy = X509_REVOKED_dup(entry);
      if (copy == nullptr || X509_CRL_add0_revoked(crl.get(), copy) != 1) {
        X509_REVOKED_free(copy);  // add0 takes it only when it succeeds
        return OpenSslError("copying an entry");
      }
    }
  }
  for (const auto& pem : cert_pems) {
    X509Ptr cert = PemToCert(pem);
    if (!cert) return InvalidArgumentError("a certificate to revoke does not parse");
    ASN1_INTEGER* serial = X509_get_serialNumber(cert.get());
    if (!listed.insert(wire::SerialHex(serial)).second) continue;
    X509_REVOKED* entry = X509_REVOKED_new();
    if (entry == nullptr || X509_REVOKED_set_serialNumber(entry, serial) != 1 ||
        X509_REVOKED_set_revocationDate(entry, now.get()) != 1 || X509_CRL_add0_revoked(crl.get(), entry) != 1) {
      X509_REVOKED_free(entry);
      return OpenSslError("adding an entry");
    }
  }
  if (X509_CRL_sort(crl.get()) != 1 || X509_CRL_sign(crl.get(), ca_key.get(), EVP_sha256()) <= 0) {
    return OpenSslError("signing the revocation list");
  }
  BioPtr out(BIO_new(BIO_s_mem()));
  if (!out || PEM_write_bio_X509_CRL(out.get(), crl.get()) != 1) return OpenSslError("writing the revocation list");
  char* data = nullptr;
  const long length = BIO_get_mem_data(out.get(), &data);
  return std::string(data, static_cast<size_t>(length));
}

Status WriteIdentity(const std::string& dir, const std::string& ca_pem, const IssuedCertificate& issued) {
  RETURN_IF_ERROR(MakePrivateDirectory(dir));
  // tls.crt last: it is what marks the identity as made (Provision keeps a directory that has
  // one), so a run stopped before it leaves the identity to be made again, not kept half-written.
  RETURN_IF_ERROR(WriteFile(dir + "/tls.key", issued.key_pem, 0600));
  RETURN_IF_ERROR(WriteFile(dir + "/ca.crt", ca_pem, 0644));
  return WriteFile(dir + "/tls.crt", issued.cert_pem, 0644);
}

Result<std::vector<std::string>> SplitList(const std::string& flag, const std::string& text) {
  std::vector<std::string> parts;
  if (text.empty()) return parts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (part.empty()) return InvalidArgumentError(flag + " " + QuoteUntrusted(text) + ": an empty name in the list");
    parts.push_back(std::move(part));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return parts;
}

std::string ProvisionReport::Text() const {
  std::string text;
  for (const ProvisionedIdentity& entry : identities) {
    text += entry.identity + std::string(entry.identity.size() < 14 ? 14 - entry.identity.size() : 1, ' ') + entry.dir +
            " (" + entry.note + ")\n";
  }
  return text;
}

Result<std::string> Provision(const ProvisionOptions& options) {
  ASSIGN_OR_RETURN(ProvisionReport report, ProvisionIdentities(options));
  return report.Text();
}

Status CheckProvisionOptions(const ProvisionOptions& options) {
  if (options.out_dir.empty()) return InvalidArgumentError("--out is required: the directory to write into");
  if (options.coordinator_hosts.empty() && !std::filesystem::exists(options.out_dir + "/coordinator/tls.crt")) {
    return InvalidArgumentError("--coordinator-host is required: the name (or names) workers dial the coordinator by");
  }
  if (options.days < 1 || options.days > 3650) {
    return InvalidArgumentError("--days: expected 1 to 3650, got " + std::to_string(options.days));
  }
  for (const auto& host : options.coordinator_hosts) RETURN_IF_ERROR(CheckHost(host));
  std::vector<std::string> seen;
  for (const auto& [list, what] : {std::pair{&options.workers, std::string("--workers")},
                                   std::pair{&options.operators, std::string("--operators")},
                                   std::pair{&options.revoke, std::string("--revoke")}}) {
    for (const auto& name : *list) {
      RETURN_IF_ERROR(CheckName(what + ": name", name));
      for (const auto& other : seen) {
        if (other == what + "/" + name) return InvalidArgumentError(what + ": " + QuoteUntrusted(name) + " is listed twice");
      }
      seen.push_back(what + "/" + name);
    }
  }
  return Status::Ok();
}

Result<ProvisionReport> ProvisionIdentities(const ProvisionOptions& options) {
  RETURN_IF_ERROR(CheckProvisionOptions(options));
  const std::string& out = options.out_dir;
  // A coordinator certificate that exists is kept: one that lacks a name asked for now would
  // leave whoever dials that name failing verification, far from here. Checked before anything
  // is written.
  if (const std::string kept = out + "/coordinator/tls.crt";
      !options.coordinator_hosts.empty() && std::filesystem::exists(kept)) {
    ASSIGN_OR_RETURN(const std::string pem, ReadSmallFile(kept));
    X509Ptr cert = PemToCert(pem);
    if (!cert) return FailedPreconditionError(QuoteUntrusted(kept, 256) + " does not parse");
    for (const auto& host : options.coordinator_hosts) {
      const bool carried = IsIpAddress(host) ? X509_check_ip_asc(cert.get(), host.c_str(), 0) == 1
                                             : X509_check_host(cert.get(), host.data(), host.size(), 0, nullptr) == 1;
      if (!carried) {
        return FailedPreconditionError("--coordinator-host " + QuoteUntrusted(host) + ": the coordinator's certificate " +
                                       QuoteUntrusted(kept, 256) +
                                       ", which is kept, does not carry it; delete that directory to issue one "
                                       "that does (and give the coordinator the new one), or leave the name out");
      }
    }
  }
  ProvisionReport report;
  auto add = [&report](std::string identity, std::string dir, bool made, std::string note) {
    report.identities.push_back({std::move(identity), std::move(dir), made, std::move(note)});
  };
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  const int64_t not_before = now - 300;  // a little slack for clocks that are slightly behind
  const int64_t not_after = now + options.days * 86400;

  CertificateAuthority ca;
  Status outlives_ca;  // set when a certificate issued now would outlive the kept CA
  const std::string ca_dir = out + "/ca";
  if (!std::filesystem::exists(ca_dir + "/ca.key") && std::filesystem::exists(ca_dir + "/ca.crt")) {
    // The CA's key was taken offline, as it should be. A new CA here would replace ca.crt, and
    // what it issued would not be trusted by the coordinator and identities issued before.
    return FailedPreconditionError(QuoteUntrusted(ca_dir + "/ca.crt", 256) +
                                   " has no ca.key beside it: put the CA's key back to issue or revoke "
                                   "certificates (a new CA would not be trusted by what the old one issued)");
  }
  if (std::filesystem::exists(ca_dir + "/ca.key")) {
    ASSIGN_OR_RETURN(ca.cert_pem, ReadSmallFile(ca_dir + "/ca.crt"));
    ASSIGN_OR_RETURN(ca.key_pem, ReadSmallFile(ca_dir + "/ca.key"));
    X509Ptr ca_cert = PemToCert(ca.cert_pem);
    KeyPtr ca_key = PemToKey(ca.key_pem);
    if (!ca_cert || !ca_key) {
      return FailedPreconditionError("the CA in " + QuoteUntrusted(ca_dir, 256) + " does not parse");
    }
    // Another CA's key would sign certificates that name this CA as issuer and verify nowhere.
    if (X509_check_private_key(ca_cert.get(), ca_key.get()) != 1) {
      ERR_clear_error();
      return FailedPreconditionError("the CA in " + QuoteUntrusted(ca_dir, 256) + ": ca.key is not the key of ca.crt");
    }
    // A certificate the kept CA issues is verified only as long as the CA itself is valid:
    // one meant to outlive it would stop working, unannounced, when the CA expires.
    std::unique_ptr<ASN1_TIME, TimeFree> until(ASN1_TIME_set(nullptr, static_cast<time_t>(not_after)));
    int days = 0, seconds = 0;
    if (!until || ASN1_TIME_diff(&days, &seconds, until.get(), X509_get0_notAfter(ca_cert.get())) != 1) {
      return FailedPreconditionError("the CA in " + QuoteUntrusted(ca_dir, 256) + " has no readable expiry");
    }
    if (days < 0 || seconds < 0) {
      outlives_ca = InvalidArgumentError("--days " + std::to_string(options.days) + ": certificates would outlive the CA in " +
                                  QuoteUntrusted(ca_dir, 256) + ", which expires " + std::to_string(-days) +
                                  " days before them; expected at most " +
                                  std::to_string(std::max<int64_t>(0, options.days + days - (seconds < 0 ? 1 : 0))) + " days");
    }
    add("ca", ca_dir, false, "kept");
  } else {
    ASSIGN_OR_RETURN(ca, CreateCertificateAuthority("Tessera CA", not_before, now + std::max<int64_t>(options.days, 3650) * 86400));
    RETURN_IF_ERROR(MakePrivateDirectory(ca_dir));
    RETURN_IF_ERROR(WriteFile(ca_dir + "/ca.key", ca.key_pem, 0600));
    RETURN_IF_ERROR(WriteFile(ca_dir + "/ca.crt", ca.cert_pem, 0644));
    add("ca", ca_dir, true, "made; keep ca.key offline");
  }

  auto issue = [&](const std::string& label, const std::string& dir, CertificateRequest request) -> Status {
    if (std::filesystem::exists(dir + "/tls.crt")) {
      add(label, dir, false, "kept");
      return Status::Ok();
    }
    RETURN_IF_ERROR(outlives_ca);
    request.not_before_unix = not_before;
    request.not_after_unix = not_after;
    ASSIGN_OR_RETURN(IssuedCertificate issued, IssueCertificate(ca, request));
    RETURN_IF_ERROR(WriteIdentity(dir, ca.cert_pem, issued));
    add(label, dir, true, "made");
    return Status::Ok();
  };
  CertificateRequest coordinator;
  if (!options.coordinator_hosts.empty()) coordinator.common_name = options.coordinator_hosts.front();
  coordinator.role = wire::kCoordinatorRole;
  coordinator.server = true;
  coordinator.hosts = options.coordinator_hosts;
  for (const char* local : {"localhost", "127.0.0.1", "::1"}) {
    bool have = false;
    for (const auto& h : coordinator.hosts) have = have || h == local;
    if (!have) coordinator.hosts.push_back(local);
  }
  if (options.coordinator_hosts.empty()) {
    add("coordinator", out + "/coordinator", false, "kept");
  } else {
    RETURN_IF_ERROR(issue("coordinator", out + "/coordinator", coordinator));
  }
  for (const auto& name : options.workers) {
    RETURN_IF_ERROR(issue("worker", out + "/workers/" + name, {name, wire::kWorkerRole, {}, false, 0, 0}));
  }
  for (const auto& name : options.operators) {
    RETURN_IF_ERROR(issue("operator", out + "/operators/" + name, {name, wire::kOperatorRole, {}, false, 0, 0}));
  }
  if (options.revoke.empty()) return report;
  std::vector<std::string> revoked;
  for (const auto& name : options.revoke) {
    bool found = false;
    for (const std::string& dir : {out + "/workers/" + name, out + "/operators/" + name}) {
      if (!std::filesystem::exists(dir + "/tls.crt")) continue;
      found = true;
      ASSIGN_OR_RETURN(std::string pem, ReadSmallFile(dir + "/tls.crt"));
      ASSIGN_OR_RETURN(wire::CertificateInfo info, wire::ReadCertificate(pem, QuoteUntrusted(dir + "/tls.crt", 256)));
      add("revoked", dir, false, "CN " + EscapeUntrusted(info.common_name) + ", serial " + info.serial);
      revoked.push_back(std::move(pem));
    }
    if (!found) {
      return InvalidArgumentError("--revoke: there is no worker or operator " + QuoteUntrusted(name) + " in " +
                                  QuoteUntrusted(out, 256) + " (expected workers/NAME/tls.crt or operators/NAME/tls.crt)");
    }
  }
  std::string existing;
  if (std::filesystem::exists(ca_dir + "/crl.pem")) {
    ASSIGN_OR_RETURN(existing, ReadSmallFile(ca_dir + "/crl.pem", wire::kMaxRevocationListBytes));
  }
  ASSIGN_OR_RETURN(std::string crl, RevokeCertificates(ca, existing, revoked, now));
  // Whole files replace the old ones (a coordinator may be reading out/coordinator/crl.pem).
  for (const std::string& path : {ca_dir + "/crl.pem", out + "/coordinator/crl.pem"}) {
    RETURN_IF_ERROR(WriteFile(path, crl, 0644));
  }
  add("crl", out + "/coordinator/crl.pem", true, "the coordinator rereads it; copy it there");
  return report;
}

}  // namespace tessera::cli
