// `tessera provision`: the files a deployment gets, their modes, that running it again keeps
// what exists, that the binaries' TLS flags accept what it wrote, and revocation lists.
#include "cli/provision.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unordered_set>

#include "proto/revocation.h"
#include "proto/transport_security.h"
#include "tests/fresh_directory.h"

namespace tessera::cli {
namespace {

class ProvisionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::tessera::testing::FreshTestDirectory("tessera-provision");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Read(const std::string& path) {
    std::ifstream in(dir_ / path);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }
  unsigned Mode(const std::string& path) {
    struct stat st {};
    ::stat((dir_ / path).c_str(), &st);
    return st.st_mode & 0777;
  }
  ProvisionOptions Options() {
    ProvisionOptions options;
    options.out_dir = dir_.string();
    options.coordinator_hosts = {"coordinator.example.org", "10.0.0.5"};
    options.workers = {"site-a-01", "site-b-01"};
    options.operators = {"ops"};
    return options;
  }
  std::filesystem::path dir_;
};

TEST_F(ProvisionTest, EveryIdentityGetsADirectoryForTlsDir) {
  auto report = Provision(Options());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(*report, "ca            " + dir_.string() + "/ca (made; keep ca.key offline)\n"
                     "coordinator   " + dir_.string() + "/coordinator (made)\n"
                     "worker        " + dir_.string() + "/workers/site-a-01 (made)\n"
                     "worker        " + dir_.string() + "/workers/site-b-01 (made)\n"
                     "operator      " + dir_.string() + "/operators/ops (made)\n");
  EXPECT_EQ(Mode("ca/ca.key"), 0600u);
  EXPECT_EQ(Mode("ca"), 0700u);
  for (const std::string identity : {"coordinator", "workers/site-a-01", "workers/site-b-01", "operators/ops"}) {
    EXPECT_EQ(Mode(identity + "/tls.key"), 0600u) << identity;
    EXPECT_EQ(Read(identity + "/ca.crt"), Read("ca/ca.crt")) << identity;
  }
  auto worker = wire::ReadCertificate(Read("workers/site-a-01/tls.crt"), "worker");
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(worker->common_name, "site-a-01");
  EXPECT_EQ(worker->role, wire::kWorkerRole);
  auto coordinator = wire::ReadCertificate(Read("coordinator/tls.crt"), "coordinator");
  EXPECT_EQ(coordinator->common_name, "coordinator.example.org");
  EXPECT_EQ(coordinator->role, wire::kCoordinatorRole);
  EXPECT_EQ(wire::ReadCertificate(Read("operators/ops/tls.crt"), "operator")->role, wire::kOperatorRole);

  // What the binaries' flags read.
  wire::TlsFlags server;
  server.dir = (dir_ / "coordinator").string();
  auto server_tls = wire::LoadServerTls(server, {"0.0.0.0", 7070});
  ASSERT_TRUE(server_tls.ok()) << server_tls.status().ToString();
  EXPECT_TRUE(server_tls->mutual());
  wire::TlsFlags client;
  client.dir = (dir_ / "workers/site-a-01").string();
  EXPECT_TRUE(wire::LoadClientTls(client, {"coordinator.example.org", 7070}, wire::kWorkerRole).ok());
  EXPECT_EQ(wire::LoadClientTls(client, {"coordinator.example.org", 7070}, wire::kOperatorRole).status().message(),
            "--tls-cert '" + client.dir + "/tls.crt': expected a tessera-operator certificate (OU=tessera-operator), "
            "got OU='tessera-worker'");
}

TEST_F(ProvisionTest, RunningItAgainKeepsTheCaAndEveryIdentityAndAddsTheNewOnes) {
  ASSERT_TRUE(Provision(Options()).ok());
  const std::string ca = Read("ca/ca.crt");
  const std::string worker = Read("workers/site-a-01/tls.crt");
  ProvisionOptions more = Options();
  more.workers.push_back("site-c-01");
  auto report = Provision(more);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_NE(report->find("ca            " + dir_.string() + "/ca (kept)"), std::string::npos) << *report;
  EXPECT_NE(report->find("workers/site-c-01 (made)"), std::string::npos) << *report;
  EXPECT_EQ(Read("ca/ca.crt"), ca);
  EXPECT_EQ(Read("workers/site-a-01/tls.crt"), worker);
  EXPECT_EQ(Read("workers/site-c-01/ca.crt"), ca);
}

// ca.key kept offline, as the report advises: a later run must not make a new CA over ca.crt,
// which would sign identities the coordinator and the existing ones do not trust.
TEST_F(ProvisionTest, ACaWhoseKeyIsOfflineIsNeitherReplacedNorUsed) {
  ASSERT_TRUE(Provision(Options()).ok());
  const std::string ca = Read("ca/ca.crt");
  std::filesystem::rename(dir_ / "ca/ca.key", dir_ / "offline.key");
  ProvisionOptions more = Options();
  more.workers.push_back("site-c-01");
  EXPECT_EQ(Provision(more).status().message(),
            "'" + dir_.string() + "/ca/ca.crt' has no ca.key beside it: put the CA's key back to issue or revoke "
            "certificates (a new CA would not be trusted by what the old one issued)");
  EXPECT_EQ(Read("ca/ca.crt"), ca);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "ca/ca.key"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "workers/site-c-01"));

  // With the key back, the new worker is issued by the same CA.
  std::filesystem::rename(dir_ / "offline.key", dir_ / "ca/ca.key");
  auto report = Provision(more);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(Read("ca/ca.crt"), ca);
  EXPECT_EQ(Read("workers/site-c-01/ca.crt"), ca);
}

// A ca.key that is not ca.crt's (another CA's, put back in the wrong directory) would sign
// certificates that name this CA as issuer and fail verification everywhere: it is refused
// before anything is issued.
TEST_F(ProvisionTest, ACaKeyThatIsNotTheCertificatesIsRefused) {
  ASSERT_TRUE(Provision(Options()).ok());
  auto other = CreateCertificateAuthority("Another CA", 0, 4102444800);
  ASSERT_TRUE(other.ok());
  std::ofstream(dir_ / "ca/ca.key", std::ios::trunc) << other->key_pem;
  ProvisionOptions more = Options();
  more.workers.push_back("site-c-01");
  EXPECT_EQ(Provision(more).status().message(),
            "the CA in '" + dir_.string() + "/ca': ca.key is not the key of ca.crt");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "workers/site-c-01"));
}

// An identity whose files could not all be written is made again by the next run, not kept
// without its ca.crt: tls.crt, which marks it as made, is written last.
TEST_F(ProvisionTest, AnIdentityLeftHalfWrittenIsMadeAgain) {
  std::filesystem::create_directories(dir_ / "workers/site-a-01/ca.crt");  // writing ca.crt fails
  EXPECT_FALSE(Provision(Options()).ok());
  EXPECT_FALSE(std::filesystem::exists(dir_ / "workers/site-a-01/tls.crt"));
  std::filesystem::remove(dir_ / "workers/site-a-01/ca.crt");
  auto report = Provision(Options());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_NE(report->find("workers/site-a-01 (made)"), std::string::npos) << *report;
  EXPECT_EQ(Read("workers/site-a-01/ca.crt"), Read("ca/ca.crt"));
  EXPECT_EQ(Mode("workers/site-a-01/tls.key"), 0600u);
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir_)) {
    EXPECT_NE(entry.path().extension(), ".new") << entry.path();
  }
}

// The coordinator's certificate is kept once made: a name given now that it does not carry is
// refused rather than ignored, before anything is written.
TEST_F(ProvisionTest, ACoordinatorNameTheKeptCertificateLacksIsRefused) {
  ASSERT_TRUE(Provision(Options()).ok());
  const std::string certificate = Read("coordinator/tls.crt");
  ProvisionOptions again = Options();
  again.coordinator_hosts = {"10.0.0.5", "coordinator.example.org"};  // the same names, in any order
  again.workers.push_back("site-c-01");
  ASSERT_TRUE(Provision(again).ok());
  again.coordinator_hosts = {"coordinator.example.org", "other.example.org"};
  again.workers.push_back("site-d-01");
  EXPECT_EQ(Provision(again).status().message(),
            "--coordinator-host 'other.example.org': the coordinator's certificate '" + dir_.string() +
                "/coordinator/tls.crt', which is kept, does not carry it; delete that directory to issue one that "
                "does (and give the coordinator the new one), or leave the name out");
  again.coordinator_hosts = {"10.0.0.6"};
  EXPECT_EQ(Provision(again).status().message().rfind("--coordinator-host '10.0.0.6': ", 0), 0u);
  EXPECT_EQ(Read("coordinator/tls.crt"), certificate);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "workers/site-d-01"));
}

std::string SerialOf(const std::string& pem) { return wire::ReadCertificate(pem, "certificate")->serial; }

TEST_F(ProvisionTest, RevokingAWorkerWritesARevocationListTheCoordinatorReads) {
  ASSERT_TRUE(Provision(Options()).ok());
  ProvisionOptions revoke;
  revoke.out_dir = dir_.string();  // no --coordinator-host: its certificate exists
  revoke.revoke = {"site-b-01"};
  auto report = Provision(revoke);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const std::string b = SerialOf(Read("workers/site-b-01/tls.crt"));
  EXPECT_NE(report->find("revoked       " + dir_.string() + "/workers/site-b-01 (CN site-b-01, serial " + b + ")"),
            std::string::npos)
      << *report;
  EXPECT_NE(report->find("coordinator   " + dir_.string() + "/coordinator (kept)"), std::string::npos) << *report;
  EXPECT_EQ(Read("ca/crl.pem"), Read("coordinator/crl.pem"));
  auto list = wire::ParseRevocationList(Read("coordinator/crl.pem"), Read("ca/ca.crt"), "crl");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(list->serials, (std::unordered_set<std::string>{b}));

  // Revoking another keeps the first; revoking one again lists it once.
  revoke.revoke = {"ops", "site-b-01"};
  ASSERT_TRUE(Provision(revoke).ok());
  list = wire::ParseRevocationList(Read("coordinator/crl.pem"), Read("ca/ca.crt"), "crl");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->serials, (std::unordered_set<std::string>{b, SerialOf(Read("operators/ops/tls.crt"))}));

  // The coordinator's --tls-dir picks the list up; --tls-crl beside it is ambiguous.
  wire::TlsFlags server;
  server.dir = (dir_ / "coordinator").string();
  auto server_tls = wire::LoadServerTls(server, {"0.0.0.0", 7070});
  ASSERT_TRUE(server_tls.ok()) << server_tls.status().ToString();
  EXPECT_EQ(server_tls->crl_path, server.dir + "/crl.pem");
  server.crl = server.dir + "/crl.pem";
  EXPECT_EQ(wire::LoadServerTls(server, {"0.0.0.0", 7070}).status().message(),
            "give --tls-dir (which reads '" + server.dir + "/crl.pem') or --tls-crl, not both");

  // A name that is not there, and a list another CA signed.
  revoke.revoke = {"site-z-09"};
  EXPECT_EQ(Provision(revoke).status().message(),
            "--revoke: there is no worker or operator 'site-z-09' in '" + dir_.string() +
                "' (expected workers/NAME/tls.crt or operators/NAME/tls.crt)");
  auto other = CreateCertificateAuthority("Another CA", 0, 4102444800);
  ASSERT_TRUE(other.ok());
  auto foreign = RevokeCertificates(*other, "", {}, 1700000000);
  ASSERT_TRUE(foreign.ok()) << foreign.status().ToString();
  EXPECT_EQ(wire::ParseRevocationList(*foreign, Read("ca/ca.crt"), "--tls-crl 'x'").status().message(),
            "--tls-crl 'x': the certificate revocation list is not signed by this coordinator's client CA");
  EXPECT_EQ(wire::ParseRevocationList("not a list", Read("ca/ca.crt"), "--tls-crl 'x'").status().message(),
            "--tls-crl 'x': expected a PEM certificate revocation list (BEGIN X509 CRL), found none that parses");
  std::ofstream(dir_ / "coordinator/crl.pem") << *foreign;
  server.crl.clear();
  EXPECT_EQ(wire::LoadServerTls(server, {"0.0.0.0", 7070}).status().message(),
            "--tls-crl '" + server.dir + "/crl.pem': the certificate revocation list is not signed by this "
            "coordinator's client CA");
}

// The report shows a revoked certificate's CN, which is the file's to say: escaped, so that a
// certificate put in an identity's directory cannot write to the terminal.
TEST_F(ProvisionTest, ARevokedCertificatesNameIsShownEscaped) {
  ASSERT_TRUE(Provision(Options()).ok());
  CertificateAuthority ca{Read("ca/ca.crt"), Read("ca/ca.key")};
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  auto issued = IssueCertificate(ca, {"evil\x1b]0;owned\x07\nrevoked       x", wire::kWorkerRole, {}, false, now - 60,
                                      now + 3600});
  ASSERT_TRUE(issued.ok()) << issued.status().ToString();
  ASSERT_TRUE(WriteIdentity((dir_ / "workers/evil").string(), ca.cert_pem, *issued).ok());
  ProvisionOptions revoke;
  revoke.out_dir = dir_.string();
  revoke.revoke = {"evil"};
  auto report = Provision(revoke);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->find('\x1b'), std::string::npos) << *report;
  EXPECT_NE(report->find("(CN evil\\x1b]0;owned\\x07\\nrevoked       x, serial "), std::string::npos) << *report;
}

TEST_F(ProvisionTest, BadNamesAndHostsAreRefused) {
  ProvisionOptions options = Options();
  options.workers = {"../etc"};
  EXPECT_EQ(Provision(options).status().message(),
            "--workers: name '../etc': expected 1 to 64 letters, digits, '-', '_' or '.'");
  options = Options();
  options.coordinator_hosts = {"bad host"};
  EXPECT_EQ(Provision(options).status().message(),
            "--coordinator-host 'bad host': expected a DNS name or an IP address");
  options = Options();
  options.operators = {"ops", "ops"};
  EXPECT_EQ(Provision(options).status().message(), "--operators: 'ops' is listed twice");
  options = Options();
  options.coordinator_hosts.clear();
  EXPECT_EQ(Provision(options).status().message(),
            "--coordinator-host is required: the name (or names) workers dial the coordinator by");
  EXPECT_EQ(SplitList("--workers", "a,,b").status().message(), "--workers 'a,,b': an empty name in the list");
  EXPECT_FALSE(std::filesystem::exists(dir_)) << "nothing is written for refused options";
}

TEST_F(ProvisionTest, AKeyReadableByOthersIsRefused) {
  ASSERT_TRUE(Provision(Options()).ok());
  const std::string key = (dir_ / "workers/site-a-01/tls.key").string();
  ::chmod(key.c_str(), 0644);
  wire::TlsFlags client;
  client.dir = (dir_ / "workers/site-a-01").string();
  EXPECT_EQ(wire::LoadClientTls(client, {"coordinator.example.org", 7070}, wire::kWorkerRole).status().message(),
            "--tls-key '" + key + "': a private key must not be readable by other users (mode 0644); chmod 600 it");
}

// Certificates from a kept CA that expires before them would stop verifying, unannounced, on
// the CA's last day: such a --days is refused, naming the most it can be.
TEST_F(ProvisionTest, CertificatesThatWouldOutliveAKeptCaAreRefused) {
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  auto ca = CreateCertificateAuthority("Short CA", now - 60, now + 30 * 86400);
  ASSERT_TRUE(ca.ok()) << ca.status().ToString();
  std::filesystem::create_directories(dir_ / "ca");
  std::ofstream(dir_ / "ca/ca.crt") << ca->cert_pem;
  std::ofstream(dir_ / "ca/ca.key") << ca->key_pem;
  ProvisionOptions options = Options();
  options.days = 365;
  auto refused = Provision(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--days 365: certificates would outlive the CA"), std::string::npos)
      << refused.status().message();
  // 30 days when both ran in the same second, else 29.
  const std::string& message = refused.status().message();
  EXPECT_TRUE(message.find("expected at most 30 days") != std::string::npos ||
              message.find("expected at most 29 days") != std::string::npos)
      << message;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "coordinator/tls.crt"));
  options.days = 29;
  auto issued = Provision(options);
  ASSERT_TRUE(issued.ok()) << issued.status().ToString();
  EXPECT_TRUE(std::filesystem::exists(dir_ / "workers/site-a-01/tls.crt"));
}

// Plaintext checks no certificate: a flag that names what the certificate must carry is
// refused beside --insecure, not ignored.
TEST(TlsFlagsTest, PlaintextRefusesTheNameACertificateMustCarry) {
  wire::TlsFlags client;
  client.insecure = true;
  client.server_name = "coordinator.example.org";
  EXPECT_EQ(wire::LoadClientTls(client, {"127.0.0.1", 7070}, wire::kWorkerRole).status().message(),
            "--insecure is plaintext: it cannot be given with --tls-server-name, which names the coordinator's "
            "certificate");
  client.server_name.clear();
  EXPECT_TRUE(wire::LoadClientTls(client, {"127.0.0.1", 7070}, wire::kWorkerRole).ok());
}

// A directory where a PEM file goes is named as one, not as a file without PEM in it.
TEST_F(ProvisionTest, ADirectoryWhereACertificateGoesIsNamedAsOne) {
  ASSERT_TRUE(Provision(Options()).ok());
  wire::TlsFlags client;
  client.ca = (dir_ / "ca").string();
  EXPECT_EQ(wire::LoadClientTls(client, {"coordinator.example.org", 7070}, wire::kWorkerRole).status().message(),
            "--tls-ca '" + client.ca + "': expected a file, got a directory");
  wire::TlsFlags server;
  server.cert = (dir_ / "coordinator").string();
  server.key = (dir_ / "coordinator/tls.key").string();
  EXPECT_EQ(wire::LoadServerTls(server, {"0.0.0.0", 7070}).status().message(),
            "--tls-cert '" + server.cert + "': expected a file, got a directory");
}

}  // namespace
}  // namespace tessera::cli
