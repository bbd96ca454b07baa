// The coordinator's revocation list file (proto/revocation.h) over lists `tessera provision`
// signs: what it revokes, a replacement that does not load or is older (the list before stays
// in force, and the problem is told once), a valid replacement, a list that appears after the
// start, and how often the file is looked at.
#include "proto/revocation.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cli/provision.h"
#include "proto/transport_security.h"

namespace tessera::wire {
namespace {

using namespace std::chrono_literals;

class RevocationFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() / ("tessera-crl-" + std::to_string(::getpid()) + "-" +
                                                       ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    auto ca = cli::CreateCertificateAuthority("Test CA", 0, 4102444800);
    ASSERT_TRUE(ca.ok());
    ca_ = *ca;
    for (const char* name : {"x", "y"}) {
      auto issued = cli::IssueCertificate(ca_, {name, kWorkerRole, {}, false, 0, 4102444800});
      ASSERT_TRUE(issued.ok());
      certs_.push_back(issued->cert_pem);
      serials_.push_back(ReadCertificate(issued->cert_pem, name)->serial);
    }
  }
  void TearDown() override { std::filesystem::remove(path_); }

  void WriteList(const std::vector<std::string>& revoked) {
    auto crl = cli::RevokeCertificates(ca_, "", revoked, 1700000000);
    ASSERT_TRUE(crl.ok()) << crl.status().ToString();
    Write(*crl);
  }
  void Write(const std::string& text) {
    // A new file each time, so that its stamp changes even within the clock's resolution.
    std::filesystem::remove(path_);
    std::ofstream(path_) << text;
  }

  std::string path_;
  cli::CertificateAuthority ca_;
  std::vector<std::string> certs_;
  std::vector<std::string> serials_;
};

TEST_F(RevocationFileTest, ABrokenReplacementLeavesTheListInForceAndAValidOneReplacesIt) {
  WriteList({certs_[0]});
  auto file = RevocationFile::Open("--tls-crl", path_, ca_.cert_pem, 0ms);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::string problem;
  EXPECT_TRUE((*file)->Revoked(serials_[0], &problem));
  EXPECT_FALSE((*file)->Revoked(serials_[1], &problem));
  EXPECT_EQ(problem, "");

  Write("-----BEGIN X509 CRL-----\nnot base64\n-----END X509 CRL-----\n");
  EXPECT_TRUE((*file)->Revoked(serials_[0], &problem));
  EXPECT_EQ(problem, "--tls-crl '" + path_ +
                         "': expected a PEM certificate revocation list (BEGIN X509 CRL), found none that parses; the "
                         "list read before stays in force");
  problem.clear();
  EXPECT_TRUE((*file)->Revoked(serials_[0], &problem));
  EXPECT_EQ(problem, "") << "told once per change of the file";

  WriteList({certs_[1]});
  EXPECT_FALSE((*file)->Revoked(serials_[0], &problem));
  EXPECT_TRUE((*file)->Revoked(serials_[1], &problem));
  EXPECT_EQ(problem, "");
}

TEST_F(RevocationFileTest, AnOlderListDoesNotReplaceANewerOne) {
  auto newer = cli::RevokeCertificates(ca_, "", {certs_[0]}, 1700000100);
  ASSERT_TRUE(newer.ok());
  Write(*newer);
  auto file = RevocationFile::Open("--tls-crl", path_, ca_.cert_pem, 0ms);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  WriteList({});  // thisUpdate 1700000000, a hundred seconds earlier
  std::string problem;
  EXPECT_TRUE((*file)->Revoked(serials_[0], &problem));
  EXPECT_EQ(problem, "--tls-crl '" + path_ +
                         "': the new certificate revocation list is older (thisUpdate 2023-11-14 22:13:20 UTC) than the "
                         "one in force (2023-11-14 22:15:00 UTC); the list read before stays in force");
}

TEST_F(RevocationFileTest, AnOptionalFileRevokesNothingUntilItAppears) {
  auto file = RevocationFile::Open("--tls-crl", path_, ca_.cert_pem, 0ms, /*optional=*/true);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::string problem;
  EXPECT_FALSE((*file)->Revoked(serials_[0], &problem));
  WriteList({certs_[0]});
  EXPECT_TRUE((*file)->Revoked(serials_[0], &problem));
  EXPECT_EQ(problem, "");
}

TEST_F(RevocationFileTest, TheFileIsLookedAtNoMoreOftenThanAsked) {
  WriteList({});
  auto file = RevocationFile::Open("--tls-crl", path_, ca_.cert_pem, 1h);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  WriteList({certs_[0]});
  EXPECT_FALSE((*file)->Revoked(serials_[0], nullptr)) << "reread before its hour";
}

TEST_F(RevocationFileTest, AListThatCannotBeUsedIsRefusedAtOpen) {
  EXPECT_EQ(RevocationFile::Open("--tls-crl", path_, ca_.cert_pem, 0ms).status().message(),
            "--tls-crl '" + path_ + "': cannot read it (No such file or directory)");
  std::filesystem::create_directory(path_);
  EXPECT_EQ(RevocationFile::Open("--tls-crl", path_, ca_.cert_pem, 0ms).status().message(),
            "--tls-crl '" + path_ + "': expected a file, got a directory");
  std::filesystem::remove(path_);
  auto other = cli::CreateCertificateAuthority("Another CA", 0, 4102444800);
  ASSERT_TRUE(other.ok());
  auto foreign = cli::RevokeCertificates(*other, "", {certs_[0]}, 1700000000);
  ASSERT_TRUE(foreign.ok());
  Write(*foreign);
  EXPECT_EQ(RevocationFile::Open("--tls-crl", path_, ca_.cert_pem, 0ms).status().message(),
            "--tls-crl '" + path_ + "': the certificate revocation list is not signed by this coordinator's client CA");
  Write(std::string(kMaxRevocationListBytes + 1, 'x'));
  EXPECT_EQ(RevocationFile::Open("--tls-crl", path_, ca_.cert_pem, 0ms).status().message(),
            "--tls-crl '" + path_ + "': expected a certificate revocation list of at most 4194304 bytes, got 4194305");

  // Revoking needs the CA's own list to build on.
  auto built_on_foreign = cli::RevokeCertificates(ca_, *foreign, {certs_[1]}, 1700000000);
  EXPECT_EQ(built_on_foreign.status().message(),
            "the existing revocation list: the certificate revocation list is not signed by this coordinator's client "
            "CA");
}

}  // namespace
}  // namespace tessera::wire
