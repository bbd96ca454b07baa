// `tessera provision`: the files a deployment gets, their modes, that running it again keeps
// what exists, and that the binaries' TLS flags accept what it wrote.
#include "cli/provision.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "proto/transport_security.h"

namespace tessera::cli {
namespace {

class ProvisionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("tessera-provision-" + std::to_string(::getpid()) + "-" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
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

}  // namespace
}  // namespace tessera::cli
