#include "proto/transport_security.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/client_interceptor.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <ctime>
#include <fstream>
#include <iterator>
#include <mutex>

#include "base/escape.h"
#include "proto/openssl_handles.h"
#include "proto/revocation.h"

namespace tessera::wire {
namespace {

constexpr size_t kMaxPemBytes = 64 * 1024;


X509Ptr ParseCertificate(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return X509Ptr(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
}

KeyPtr ParseKey(const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  return KeyPtr(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr);
}

std::string NameEntry(X509_NAME* name, int nid) {
  const int index = X509_NAME_get_index_by_NID(name, nid, -1);
  if (index < 0) return "";
  ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, index));
  unsigned char* utf8 = nullptr;
  const int length = ASN1_STRING_to_UTF8(&utf8, data);
  if (length < 0) return "";
  std::string value(reinterpret_cast<char*>(utf8), static_cast<size_t>(length));
  OPENSSL_free(utf8);
  return value;
}

// The file a flag names: at most 64 KiB. `flag` is "--tls-cert" and the like.
Result<std::string> ReadPemFile(const std::string& flag, const std::string& path) {
  const std::string named = flag + " " + QuoteUntrusted(path, 256);
  RETURN_IF_ERROR(RefuseDirectory(named, path));
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError(named + ": cannot read it");
  std::string text;
  text.resize(kMaxPemBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxPemBytes) {
    return InvalidArgumentError(named + ": expected a PEM file of at most " + std::to_string(kMaxPemBytes) +
                                " bytes, got more");
  }
  if (text.find("-----BEGIN ") == std::string::npos) return InvalidArgumentError(named + ": expected PEM, found none");
  return text;
}

// A certificate that parses and is valid now.
Result<CertificateInfo> CheckCertificate(const std::string& flag, const std::string& path, const std::string& pem) {
  const std::string named = flag + " " + QuoteUntrusted(path, 256);
  ASSIGN_OR_RETURN(CertificateInfo info, ReadCertificate(pem, named));
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  if (now < info.not_before_unix) {
    return InvalidArgumentError(named + ": the certificate is not valid before " + FormatUnixTime(info.not_before_unix));
  }
  if (now > info.not_after_unix) {
    return InvalidArgumentError(named + ": the certificate expired on " + FormatUnixTime(info.not_after_unix));
  }
  return info;
}

// A key that parses, matches `cert_pem`, and only its owner can read.
Status CheckKey(const std::string& flag, const std::string& path, const std::string& key_pem,
                const std::string& cert_pem) {
  const std::string named = flag + " " + QuoteUntrusted(path, 256);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return InvalidArgumentError(named + ": a private key must not be readable by other users (mode " + mode +
                                "); chmod 600 it");
  }
  KeyPtr key = ParseKey(key_pem);
  if (!key) return InvalidArgumentError(named + ": expected a PEM private key, found none that parses");
  X509Ptr cert = ParseCertificate(cert_pem);
  if (!cert || X509_check_private_key(cert.get(), key.get()) != 1) {
    return InvalidArgumentError(named + ": the key does not belong to the certificate");
  }
  return Status::Ok();
}

// The auth context properties a verified client certificate adds (ClientCertificateCheck).
constexpr char kVerifiedCommonName[] = "tessera.cn";
constexpr char kVerifiedRole[] = "tessera.role";
constexpr char kVerifiedSerial[] = "tessera.serial";

// Mutual TLS, checked by the coordinator itself: the handshake asks for a client certificate
// but leaves the chain to this processor (the client still proves it holds the key), which
// runs before every call and refuses it with a message that says why: no certificate, one
// from another CA, an expired one. A refusal at the handshake would reach the client as a
// bare "Socket closed" (TLS 1.3 checks client certificates after the client's handshake is
// done). A connection's first verified call records the subject in the auth context; later
// calls on it are not verified again, but each is checked against the revocation list, when
// there is one, so that revoking a certificate also ends the connections it opened before.
class ClientCertificateCheck final : public grpc::AuthMetadataProcessor {
 public:
  ClientCertificateCheck(const std::string& ca_pem, std::shared_ptr<RevocationFile> revocation,
                         std::function<void(const std::string&)> on_refusal,
                         std::function<void(const std::string&)> on_problem)
      : store_(X509_STORE_new()),
        revocation_(std::move(revocation)),
        on_refusal_(std::move(on_refusal)),
        on_problem_(std::move(on_problem)) {
    BioPtr bio(BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size())));
    while (X509* ca = bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr) {
      X509_STORE_add_cert(store_, ca);
      X509_free(ca);
    }
  }
  ~ClientCertificateCheck() override { X509_STORE_free(store_); }

  // CPU only, and quick: a changed revocation list is reread by one call at a time, outside
  // the list's lock, while the others answer from the list in force.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata&, grpc::AuthContext* context, OutputMetadata*,
                       OutputMetadata*) override {
    {
      // The connection's auth context is shared by its calls, which gRPC may process at once.
      std::unique_lock<std::mutex> lock(properties_mu_);
      if (!context->FindPropertyValues(kVerifiedRole).empty()) {
        if (!revocation_) return grpc::Status::OK;
        const std::string common_name = First(context, kVerifiedCommonName);
        const std::string role = First(context, kVerifiedRole);
        const std::string serial = First(context, kVerifiedSerial);
        lock.unlock();
        return CheckRevocation(common_name, role, serial);
      }
    }
    const auto pem = context->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
    if (pem.empty()) {
      return Refuse("this coordinator uses mutual TLS and the caller presented no certificate: workers and "
                    "operators need one (`tessera provision`; --tls-dir, or --tls-cert and --tls-key)");
    }
    X509Ptr cert = ParseCertificate(std::string(pem.front().data(), pem.front().size()));
    if (!cert) return Refuse("this coordinator uses mutual TLS and the caller's certificate does not parse");
    Status verified = Verify(cert.get());
    if (!verified.ok()) return Refuse(verified.message());
    X509_NAME* subject = X509_get_subject_name(cert.get());
    const std::string common_name = NameEntry(subject, NID_commonName);
    const std::string role = NameEntry(subject, NID_organizationalUnitName);
    const std::string serial = SerialHex(X509_get0_serialNumber(cert.get()));
    if (revocation_) {
      grpc::Status current = CheckRevocation(common_name, role, serial);
      if (!current.ok()) return current;
    }
    std::lock_guard<std::mutex> lock(properties_mu_);
    if (context->FindPropertyValues(kVerifiedRole).empty()) {  // another call may have been first
      context->AddProperty(kVerifiedCommonName, common_name);
      context->AddProperty(kVerifiedRole, role);
      context->AddProperty(kVerifiedSerial, serial);
    }
    return grpc::Status::OK;
  }

 private:
  static std::string First(grpc::AuthContext* context, const char* property) {
    const auto values = context->FindPropertyValues(property);
    return values.empty() ? std::string() : std::string(values.front().data(), values.front().size());
  }

  static std::string Who(const std::string& common_name, const std::string& role) {
    return "this coordinator uses mutual TLS and refuses the caller's certificate (CN " + QuoteUntrusted(common_name) +
           ", OU " + QuoteUntrusted(role) + "): ";
  }

  grpc::Status CheckRevocation(const std::string& common_name, const std::string& role, const std::string& serial) {
    std::string problem;
    const bool revoked = revocation_->Revoked(serial, &problem);
    if (!problem.empty()) {
      if (on_problem_) {
        on_problem_(problem);
      } else if (on_refusal_) {
        on_refusal_(problem);
      }
    }
    if (!revoked) return grpc::Status::OK;
    return Refuse(Who(common_name, role) + revocation_->RevokedReason(serial));
  }

  grpc::Status Refuse(const std::string& why) {
    if (on_refusal_) on_refusal_(why);
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, why);
  }

  Status Verify(X509* cert) {
    X509_NAME* subject = X509_get_subject_name(cert);
    const std::string who = Who(NameEntry(subject, NID_commonName), NameEntry(subject, NID_organizationalUnitName));
    std::unique_ptr<X509_STORE_CTX, void (*)(X509_STORE_CTX*)> ctx(X509_STORE_CTX_new(), X509_STORE_CTX_free);
    if (!ctx || X509_STORE_CTX_init(ctx.get(), store_, cert, nullptr) != 1) {
      return InternalError(who + "cannot verify it (OpenSSL)");
    }
    X509_STORE_CTX_set_purpose(ctx.get(), X509_PURPOSE_SSL_CLIENT);
    if (X509_verify_cert(ctx.get()) == 1) return Status::Ok();
    const int error = X509_STORE_CTX_get_error(ctx.get());
    switch (error) {
      case X509_V_ERR_CERT_HAS_EXPIRED:
        return PermissionDeniedError(who + "it expired on " + FormatUnixTime(ToUnix(X509_get0_notAfter(cert))));
      case X509_V_ERR_CERT_NOT_YET_VALID:
        return PermissionDeniedError(who + "it is not valid before " +
                                     FormatUnixTime(ToUnix(X509_get0_notBefore(cert))));
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
      case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
      case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
      case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
      case X509_V_ERR_CERT_SIGNATURE_FAILURE:
        return PermissionDeniedError(who + "it is not issued by this coordinator's client CA");
      case X509_V_ERR_INVALID_PURPOSE:
        return PermissionDeniedError(who + "it is not a client certificate (extendedKeyUsage clientAuth)");
      default:
        return PermissionDeniedError(who + X509_verify_cert_error_string(error));
    }
  }

  X509_STORE* store_;
  const std::shared_ptr<RevocationFile> revocation_;  // null: no revocation list
  std::function<void(const std::string&)> on_refusal_;
  std::function<void(const std::string&)> on_problem_;
  std::mutex properties_mu_;
};

// Attaches the admin token to every call.
class AuthorizationInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit AuthorizationInterceptor(const std::string* token) : token_(token) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorizationHeader, "Bearer " + *token_);
    }
    methods->Proceed();
  }

 private:
  const std::string* token_;
};

class AuthorizationInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit AuthorizationInterceptorFactory(std::string token) : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new AuthorizationInterceptor(&token_);
  }

 private:
  std::string token_;  // outlives the channel's calls: the channel owns the factory
};

}  // namespace

std::string FormatUnixTime(int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char buffer[40];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%d %H:%M:%S UTC", &utc);
  return buffer;
}

Result<CertificateInfo> ReadCertificate(const std::string& pem, const std::string& what) {
  X509Ptr cert = ParseCertificate(pem);
  if (!cert) return InvalidArgumentError(what + ": expected a PEM certificate, found none that parses");
  CertificateInfo info;
  X509_NAME* subject = X509_get_subject_name(cert.get());
  info.common_name = NameEntry(subject, NID_commonName);
  info.role = NameEntry(subject, NID_organizationalUnitName);
  info.not_before_unix = ToUnix(X509_get0_notBefore(cert.get()));
  info.not_after_unix = ToUnix(X509_get0_notAfter(cert.get()));
  info.serial = SerialHex(X509_get0_serialNumber(cert.get()));
  return info;
}

Result<std::shared_ptr<RevocationFile>> OpenRevocationList(const ServerTls& tls) {
  if (tls.revocation) return tls.revocation;
  if (tls.crl_path.empty() || tls.insecure) return std::shared_ptr<RevocationFile>();
  if (tls.client_ca_pem.empty()) {
    return InvalidArgumentError("--tls-crl revokes client certificates: it needs mutual TLS (--tls-client-ca, or "
                                "--tls-dir)");
  }
  return RevocationFile::Open("--tls-crl", tls.crl_path, tls.client_ca_pem, tls.crl_recheck, tls.crl_optional);
}

namespace {

// The combinations MakeServerCredentials refuses, before it reads anything.
Status CheckServerTls(const ServerTls& tls, const HostPort& listen) {
  if (tls.insecure) {
    if (!IsLoopbackHost(listen.host) && !tls.insecure_remote) {
      return InvalidArgumentError("--insecure on " + QuoteUntrusted(listen.ToString()) +
                                  " is refused: plaintext is only for a loopback address (127.0.0.1, ::1, "
                                  "localhost), since anyone on the network could read the join token and the "
                                  "models; serve TLS (--tls-cert, --tls-key), or add --insecure-force on a network "
                                  "you trust entirely");
    }
    return Status::Ok();
  }
  if (tls.cert_pem.empty() || tls.key_pem.empty()) {
    return InvalidArgumentError(
        "the coordinator serves TLS: give --tls-cert and --tls-key (or --tls-dir; `tessera provision` makes them), "
        "or --insecure for plaintext on a loopback address");
  }
  return Status::Ok();
}

}  // namespace

Result<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTls& tls, const HostPort& listen, std::function<void(const std::string& why)> on_refusal,
    std::shared_ptr<RevocationFile> revocation, std::function<void(const std::string& problem)> on_problem) {
  RETURN_IF_ERROR(CheckServerTls(tls, listen));
  if (tls.insecure) return grpc::InsecureServerCredentials();
  // Mutual TLS: the client's certificate is asked for at the handshake and verified before
  // every call by ClientCertificateCheck, which says why it refuses one.
  grpc::SslServerCredentialsOptions options(tls.client_ca_pem.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                                      : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_BUT_DONT_VERIFY);
  options.pem_root_certs = tls.client_ca_pem;
  options.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
  if (!revocation) {
    ASSIGN_OR_RETURN(revocation, OpenRevocationList(tls));
  }
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::SslServerCredentials(options);
  if (!tls.client_ca_pem.empty()) {
    credentials->SetAuthMetadataProcessor(
        std::make_shared<ClientCertificateCheck>(tls.client_ca_pem, std::move(revocation), std::move(on_refusal),
                                                 std::move(on_problem)));
  }
  return credentials;
}

Result<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address, const ClientTls& tls,
                                                   grpc::ChannelArguments args) {
  ASSIGN_OR_RETURN(HostPort coordinator, ParseHostPort("--coordinator", address, PortZero::kRefused));
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (tls.insecure) {
    if (!IsLoopbackHost(coordinator.host) && !tls.insecure_remote) {
      return InvalidArgumentError("--insecure to " + QuoteUntrusted(address) +
                                  " is refused: plaintext is only for a coordinator on a loopback address; verify "
                                  "it with --tls-ca, or add --insecure-force on a network you trust entirely");
    }
    credentials = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = tls.ca_pem;
    options.pem_cert_chain = tls.cert_pem;
    options.pem_private_key = tls.key_pem;
    credentials = grpc::SslCredentials(options);
    if (!tls.server_name.empty()) args.SetSslTargetNameOverride(tls.server_name);
  }
  if (tls.admin_token.empty()) return grpc::CreateCustomChannel(address, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<AuthorizationInterceptorFactory>(tls.admin_token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args, std::move(interceptors));
}

void DeclareTlsFlags(FlagSet& flags, TlsFlags* tls, TlsSide side) {
  const bool server = side == TlsSide::kServer;
  flags.String("tls-dir", &tls->dir,
               server ? "directory of ca.crt, tls.crt and tls.key as `tessera provision` writes them: the "
                        "coordinator's certificate and key, ca.crt as the client CA (mutual TLS), and crl.pem, "
                        "once there is one, as the certificate revocation list"
                      : "directory of ca.crt, tls.crt and tls.key as `tessera provision` writes them: the CA "
                        "to verify the coordinator with, and this client's certificate and key");
  if (server) {
    flags.String("tls-cert", &tls->cert, "the coordinator's certificate chain (PEM)");
    flags.String("tls-key", &tls->key, "the coordinator's private key (PEM, mode 600)");
    flags.String("tls-client-ca", &tls->ca,
                 "CA whose certificates clients must present (mutual TLS; roles from the certificates' OU)");
    flags.String("tls-crl", &tls->crl,
                 "certificate revocation list signed by the client CA (PEM; `tessera provision --revoke` writes it): "
                 "revoked certificates are refused at every call, and the file is reread when it changes");
    flags.Bool("insecure", &tls->insecure, "serve plaintext, on a loopback --listen address only");
    flags.Bool("insecure-force", &tls->insecure_force,
               "with --insecure, serve plaintext on any address (a network you trust entirely)");
  } else {
    flags.String("tls-ca", &tls->ca, "the CA that issued the coordinator's certificate (PEM)");
    flags.String("tls-cert", &tls->cert, "this client's certificate (PEM), for a coordinator with mutual TLS");
    flags.String("tls-key", &tls->key, "this client's private key (PEM, mode 600)");
    flags.String("tls-server-name", &tls->server_name,
                 "the name the coordinator's certificate must carry, when not the host in --coordinator");
    flags.Bool("insecure", &tls->insecure, "plaintext, to a coordinator on a loopback address only");
    flags.Bool("insecure-force", &tls->insecure_force, "with --insecure, plaintext to any address");
  }
}

namespace {

// --tls-dir fills what the individual flags left empty; giving both for one file is an error.
Result<TlsFlags> ResolveTlsDir(const TlsFlags& flags, TlsSide side) {
  TlsFlags resolved = flags;
  if (flags.insecure && (!flags.dir.empty() || !flags.cert.empty() || !flags.key.empty() || !flags.ca.empty())) {
    return InvalidArgumentError("--insecure is plaintext: it cannot be given with --tls-dir, --tls-cert, --tls-key or " +
                                std::string(side == TlsSide::kServer ? "--tls-client-ca" : "--tls-ca"));
  }
  // The name the coordinator's certificate must carry: with no certificate, nothing checks it.
  if (flags.insecure && !flags.server_name.empty()) {
    return InvalidArgumentError("--insecure is plaintext: it cannot be given with --tls-server-name, which names the "
                                "coordinator's certificate");
  }
  if (flags.insecure_force && !flags.insecure) {
    return InvalidArgumentError("--insecure-force only widens --insecure; give both, or neither");
  }
  if (flags.dir.empty()) return resolved;
  const std::string ca_flag = side == TlsSide::kServer ? "--tls-client-ca" : "--tls-ca";
  for (const auto& [given, flag] : {std::pair<const std::string*, std::string>{&flags.ca, ca_flag},
                                    {&flags.cert, "--tls-cert"},
                                    {&flags.key, "--tls-key"}}) {
    if (!given->empty()) return InvalidArgumentError("give --tls-dir or " + flag + ", not both");
  }
  resolved.ca = flags.dir + "/ca.crt";
  resolved.cert = flags.dir + "/tls.crt";
  resolved.key = flags.dir + "/tls.key";
  // The coordinator's DIR/crl.pem, which `tessera provision --revoke` writes, may come later.
  struct stat st {};
  if (side == TlsSide::kServer) {
    const std::string in_dir = flags.dir + "/crl.pem";
    if (flags.crl.empty()) {
      resolved.crl = in_dir;
      resolved.crl_optional = true;
    } else if (::lstat(in_dir.c_str(), &st) == 0) {
      return InvalidArgumentError("give --tls-dir (which reads " + QuoteUntrusted(in_dir, 256) + ") or --tls-crl, not both");
    }
  }
  return resolved;
}

}  // namespace

Result<ServerTls> LoadServerTls(const TlsFlags& given, const HostPort& listen) {
  ASSIGN_OR_RETURN(TlsFlags flags, ResolveTlsDir(given, TlsSide::kServer));
  ServerTls tls;
  tls.insecure = flags.insecure;
  tls.insecure_remote = flags.insecure_force;
  if (!tls.insecure) {
    if (flags.cert.empty() != flags.key.empty()) {
      return InvalidArgumentError("--tls-cert and --tls-key go together: give both, or --tls-dir");
    }
    if (!flags.cert.empty()) {
      ASSIGN_OR_RETURN(tls.cert_pem, ReadPemFile("--tls-cert", flags.cert));
      RETURN_IF_ERROR(CheckCertificate("--tls-cert", flags.cert, tls.cert_pem).status());
      ASSIGN_OR_RETURN(tls.key_pem, ReadPemFile("--tls-key", flags.key));
      RETURN_IF_ERROR(CheckKey("--tls-key", flags.key, tls.key_pem, tls.cert_pem));
    }
    if (!flags.ca.empty()) {
      ASSIGN_OR_RETURN(tls.client_ca_pem, ReadPemFile("--tls-client-ca", flags.ca));
      RETURN_IF_ERROR(ReadCertificate(tls.client_ca_pem, "--tls-client-ca " + QuoteUntrusted(flags.ca, 256)).status());
    }
    tls.crl_path = flags.crl;
    tls.crl_optional = flags.crl_optional;
  } else if (!flags.crl.empty()) {
    return InvalidArgumentError("--insecure is plaintext: it cannot be given with --tls-crl");
  }
  RETURN_IF_ERROR(CheckServerTls(tls, listen));
  // Read once, here: the coordinator applies this list (OpenRevocationList returns it).
  ASSIGN_OR_RETURN(tls.revocation, OpenRevocationList(tls));
  return tls;
}

Result<ClientTls> LoadClientTls(const TlsFlags& given, const HostPort& coordinator, const std::string& role) {
  ASSIGN_OR_RETURN(TlsFlags flags, ResolveTlsDir(given, TlsSide::kClient));
  ClientTls tls;
  tls.insecure = flags.insecure;
  tls.insecure_remote = flags.insecure_force;
  tls.server_name = flags.server_name;
  if (tls.insecure) {
    if (!IsLoopbackHost(coordinator.host) && !tls.insecure_remote) {
      return InvalidArgumentError("--insecure to " + QuoteUntrusted(coordinator.ToString()) +
                                  " is refused: plaintext is only for a coordinator on a loopback address; verify "
                                  "it with --tls-ca, or add --insecure-force on a network you trust entirely");
    }
    return tls;
  }
  if (flags.ca.empty()) {
    return InvalidArgumentError(
        "the coordinator is verified with TLS: give --tls-ca (the CA that issued its certificate) or --tls-dir, or "
        "--insecure for a plaintext coordinator on a loopback address");
  }
  ASSIGN_OR_RETURN(tls.ca_pem, ReadPemFile("--tls-ca", flags.ca));
  RETURN_IF_ERROR(ReadCertificate(tls.ca_pem, "--tls-ca " + QuoteUntrusted(flags.ca, 256)).status());
  if (flags.cert.empty() != flags.key.empty()) {
    return InvalidArgumentError("--tls-cert and --tls-key go together: give both, or --tls-dir");
  }
  if (!flags.cert.empty()) {
    ASSIGN_OR_RETURN(tls.cert_pem, ReadPemFile("--tls-cert", flags.cert));
    ASSIGN_OR_RETURN(CertificateInfo info, CheckCertificate("--tls-cert", flags.cert, tls.cert_pem));
    if (info.role != role) {
      return InvalidArgumentError("--tls-cert " + QuoteUntrusted(flags.cert, 256) + ": expected a " + role +
                                  " certificate (OU=" + role + "), got OU=" + QuoteUntrusted(info.role));
    }
    ASSIGN_OR_RETURN(tls.key_pem, ReadPemFile("--tls-key", flags.key));
    RETURN_IF_ERROR(CheckKey("--tls-key", flags.key, tls.key_pem, tls.cert_pem));
  }
  return tls;
}

PeerIdentity IdentifyPeer(const grpc::AuthContext* context) {
  PeerIdentity peer;
  if (context == nullptr) return peer;
  // Present only once ClientCertificateCheck has verified the caller's certificate.
  const auto role = context->FindPropertyValues(kVerifiedRole);
  const auto name = context->FindPropertyValues(kVerifiedCommonName);
  if (role.empty() || name.empty()) return peer;
  peer.has_certificate = true;
  peer.common_name.assign(name.front().data(), name.front().size());
  peer.role.assign(role.front().data(), role.front().size());
  const auto serial = context->FindPropertyValues(kVerifiedSerial);
  if (!serial.empty()) peer.serial.assign(serial.front().data(), serial.front().size());
  return peer;
}

}  // namespace tessera::wire
