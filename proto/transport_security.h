// How the daemons and the command line protect the wire: TLS credentials on both ends, the
// roles certificates carry, and who a caller is as the coordinator sees it.
//
// The coordinator serves TLS; with a client CA it is mutual TLS, and every call must come with
// a certificate issued by that CA (verified before the call reaches a handler; a refusal says
// why: none, another CA, expired) whose organizational unit (OU) says its role:
// "tessera-worker" (CN = the worker's name), "tessera-operator" (CN = the operator) or
// "tessera-coordinator". Plaintext is only with an explicit `insecure`, and only to or on a
// loopback address unless `insecure_remote` is also set. `tessera provision` issues all of it.
//
// Every file is hostile until checked: at most 64 KiB, PEM that parses, a certificate that is
// valid now, a key that matches it and is not readable by other users, a client certificate
// of the role the binary needs. Errors name the flag, the file and what was expected.
//
// Thread-safe (pure functions; gRPC credentials are shareable).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/flags.h"
#include "base/host_port.h"
#include "base/status.h"

namespace tessera::wire {

class RevocationFile;  // proto/revocation.h

inline constexpr char kWorkerRole[] = "tessera-worker";
inline constexpr char kOperatorRole[] = "tessera-operator";
inline constexpr char kCoordinatorRole[] = "tessera-coordinator";
// Operators without a certificate send the admin token as "authorization: Bearer TOKEN".
inline constexpr char kAuthorizationHeader[] = "authorization";

// What a certificate says about its subject.
struct CertificateInfo {
  std::string common_name;  // CN
  std::string role;         // OU: one of the roles above, or whatever an outside CA put there
  int64_t not_before_unix = 0;
  int64_t not_after_unix = 0;
  std::string serial;       // SerialHex (proto/revocation.h), as revocation lists name it
};
// The first certificate in `pem`; InvalidArgument naming `what` when it does not parse.
Result<CertificateInfo> ReadCertificate(const std::string& pem, const std::string& what);
// "2024-05-01 12:00:00 UTC".
std::string FormatUnixTime(int64_t unix_seconds);

// The coordinator's end.
struct ServerTls {
  bool insecure = false;         // plaintext; refused on a non-loopback address unless:
  bool insecure_remote = false;  //   plaintext on any address (trusted networks only)
  std::string cert_pem;          // the coordinator's certificate chain
  std::string key_pem;
  std::string client_ca_pem;     // set: mutual TLS, every client shows a certificate from it
  std::string crl_path;          // set (mutual TLS only): the certificate revocation list
                                 // applied at every call (proto/revocation.h), reread when the
                                 // file changes, looked at no more often than:
  std::chrono::milliseconds crl_recheck{5000};
  bool crl_optional = false;     // from --tls-dir: a crl.pem that is not there (yet) revokes nothing
  std::shared_ptr<RevocationFile> revocation;  // crl_path's list once LoadServerTls has read it
  bool mutual() const { return !insecure && !client_ca_pem.empty(); }
};
// The revocation list `tls` names (null when none): tls.revocation when LoadServerTls has read
// it, loaded now otherwise; InvalidArgument naming the file when it cannot be used, or when
// there is no mutual TLS to apply it to.
Result<std::shared_ptr<RevocationFile>> OpenRevocationList(const ServerTls& tls);
// InvalidArgument when the combination is not allowed (no certificate and not insecure,
// plaintext on a non-loopback address without insecure_remote). Under mutual TLS,
// `on_refusal` (when set) is told why each call with a missing or refused certificate was
// refused; it runs on gRPC's thread and must not block. `revocation`: the list to apply
// (OpenRevocationList; opened here when null and `tls` names one); `on_problem` is told when a
// changed list does not load (once per change).
Result<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTls& tls, const HostPort& listen, std::function<void(const std::string& why)> on_refusal = {},
    std::shared_ptr<RevocationFile> revocation = nullptr,
    std::function<void(const std::string& problem)> on_problem = {});

// A client's end (a worker, the command line).
struct ClientTls {
  bool insecure = false;         // plaintext; refused to a non-loopback coordinator unless:
  bool insecure_remote = false;
  std::string ca_pem;            // the CA that issued the coordinator's certificate
  std::string cert_pem;          // this client's certificate, for mutual TLS
  std::string key_pem;
  std::string server_name;       // the name the coordinator's certificate must carry, when
                                 // not the host dialled
  std::string admin_token;       // set: sent with every call (operators without a certificate)
};
// A channel to `address` (HOST:PORT) with `tls`. InvalidArgument for an address that does not
// parse, or plaintext to a non-loopback host without insecure_remote.
Result<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address, const ClientTls& tls,
                                                   grpc::ChannelArguments args = {});

// The TLS flags, alike on the three binaries. --tls-dir DIR stands for DIR/ca.crt,
// DIR/tls.crt and DIR/tls.key (the layout `tessera provision` writes); on the coordinator
// DIR/ca.crt is also the client CA (mutual TLS), and DIR/crl.pem, when there is one, the
// certificate revocation list (--tls-crl).
struct TlsFlags {
  std::string dir;
  std::string ca;         // clients: --tls-ca; the coordinator: --tls-client-ca
  std::string cert;
  std::string key;
  std::string server_name;  // clients only
  std::string crl;          // the coordinator only: --tls-crl, or DIR/crl.pem from --tls-dir:
  bool crl_optional = false;  //   then set, and the file may appear later
  bool insecure = false;
  bool insecure_force = false;
};
enum class TlsSide { kServer, kClient };
void DeclareTlsFlags(FlagSet& flags, TlsFlags* tls, TlsSide side);
// Reads and checks the files the flags name. The coordinator's certificate and key are
// required unless --insecure; --tls-client-ca turns on mutual TLS.
Result<ServerTls> LoadServerTls(const TlsFlags& flags, const HostPort& listen);
// Reads and checks the files the flags name. --tls-ca is required unless --insecure;
// a certificate, when given, must be of `role`.
Result<ClientTls> LoadClientTls(const TlsFlags& flags, const HostPort& coordinator, const std::string& role);

// Who is calling, as the coordinator sees it: a certificate that mutual TLS verified (against
// the client CA, before the call reached a handler), or none.
struct PeerIdentity {
  bool has_certificate = false;
  std::string common_name;
  std::string role;
  std::string serial;  // the certificate's serial number in hex, as revocation lists name it
};
PeerIdentity IdentifyPeer(const grpc::AuthContext* context);

}  // namespace tessera::wire
