// AccessPolicy without a server: which credentials admit which call, and what a refusal says.
#include "server/rpc/access_policy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace tessera::server {
namespace {

wire::PeerIdentity Certificate(const std::string& cn, const std::string& role) { return {true, cn, role, ""}; }

TEST(AccessPolicyTest, SomeCredentialIsNeededForWorkersAndForOperators) {
  EXPECT_EQ(AccessPolicy({}, "admin-token", false).Validate().message(),
            "workers need a credential to join: a join token (--join-token-file) or mutual TLS with worker "
            "certificates (--tls-client-ca, or --tls-dir)");
  EXPECT_EQ(AccessPolicy({{"default", "join-token"}}, "", false).Validate().message(),
            "operators need a credential for the job service: an admin token (--admin-token-file) or mutual TLS "
            "with operator certificates (--tls-client-ca, or --tls-dir)");
  EXPECT_TRUE(AccessPolicy({}, "", true).Validate().ok());
  EXPECT_EQ(AccessPolicy({{"default", "short"}}, "admin-token", false).Validate().message(),
            "join token 'default': expected 8 to 1024 bytes without whitespace, got 5 bytes");
  EXPECT_EQ(AccessPolicy({{"site a", "join-token"}}, "admin-token", false).Validate().message(),
            "join token label 'site a': expected 1 to 64 letters, digits, '-', '_' or '.'");
}

TEST(AccessPolicyTest, AJoinNeedsEveryConfiguredCredential) {
  AccessPolicy policy({{"site-a", "token-of-site-a"}}, "", true);
  EXPECT_EQ(policy.CheckJoin(Certificate("w1", wire::kWorkerRole), "w1", "wrong").status().message(),
            "join refused for worker 'w1': the join token does not match the coordinator's");
  auto admitted = policy.CheckJoin(Certificate("w1", wire::kWorkerRole), "w1", "token-of-site-a");
  ASSERT_TRUE(admitted.ok()) << admitted.status().ToString();
  EXPECT_EQ(*admitted, "") << "the certificate binds the name";
  EXPECT_EQ(policy.CheckJoin({}, "w1", "token-of-site-a").status().message(),
            "join refused for worker 'w1': a worker joins with a tessera-worker certificate; this caller's is none");
  AccessPolicy tokens_only({{"site-a", "token-of-site-a"}}, "admin-token", false);
  EXPECT_EQ(*tokens_only.CheckJoin({}, "w1", "token-of-site-a"), "token:site-a");
}

TEST(AccessPolicyTest, OperatorsShowACertificateOrTheAdminToken) {
  AccessPolicy policy({}, "the-admin-token", true);
  const std::string good = "Bearer the-admin-token";
  const std::string bad = "Bearer nope";
  EXPECT_TRUE(policy.CheckOperator(Certificate("ops", wire::kOperatorRole), nullptr).ok());
  EXPECT_TRUE(policy.CheckOperator(Certificate("w1", wire::kWorkerRole), &good).ok());
  EXPECT_EQ(policy.CheckOperator(Certificate("w1", wire::kWorkerRole), &bad).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(policy.CheckOperator({}, nullptr).code(), StatusCode::kUnauthenticated);
  AccessPolicy no_admin_token({}, "", true);
  EXPECT_EQ(no_admin_token.CheckOperator({}, &good).code(), StatusCode::kPermissionDenied)
      << "no admin token is configured: none matches";
}

TEST(AccessPolicyTest, OnlyTheWholeTokenMatchesNotAPrefixOrAnExtensionOfIt) {
  AccessPolicy policy({{"site-a", "token-of-site-a"}}, "the-admin-token", false);
  for (const std::string token : {"token-of-site-", "token-of-site-a2", "token-of-site-b", "", "TOKEN-OF-SITE-A"}) {
    EXPECT_EQ(policy.CheckJoin({}, "w1", token).status().code(), StatusCode::kPermissionDenied) << token;
  }
  for (const std::string header : {"Bearer the-admin-toke", "Bearer the-admin-tokens", "the-admin-token"}) {
    EXPECT_EQ(policy.CheckOperator({}, &header).code(), StatusCode::kPermissionDenied) << header;
  }
  const std::string good = "Bearer the-admin-token";
  EXPECT_TRUE(policy.CheckOperator({}, &good).ok());
}

// The scheme's name is case-insensitive and one or more spaces follow it (RFC 9110 section 11);
// anything else is refused.
TEST(AccessPolicyTest, TheBearerSchemeIsMatchedInAnyCaseWithOneOrMoreSpaces) {
  AccessPolicy policy({}, "the-admin-token", true);
  for (const std::string header : {"Bearer the-admin-token", "bearer the-admin-token", "BEARER the-admin-token",
                                   "bEaReR   the-admin-token"}) {
    EXPECT_TRUE(policy.CheckOperator({}, &header).ok()) << header;
  }
  for (const std::string header : {"Bearerthe-admin-token", "Bearer\tthe-admin-token", "Basic the-admin-token",
                                   "Bearer the-admin-token ", " Bearer the-admin-token", "Bear the-admin-token"}) {
    EXPECT_EQ(policy.CheckOperator({}, &header).code(), StatusCode::kPermissionDenied) << header;
  }
  const std::string basic = "Basic dXNlcjpwYXNz";
  EXPECT_EQ(policy.CheckOperator({}, &basic).message(),
            "the job service refused the call: expected an Authorization of \"Bearer TOKEN\" with the admin token, "
            "got another scheme");
}

// No token at all is a missing credential (401 on the monitoring port), not a wrong one; the
// refusals name the door the call came in by.
TEST(AccessPolicyTest, ABearerWithoutATokenIsAMissingCredential) {
  AccessPolicy policy({}, "the-admin-token", true);
  using Door = AccessPolicy::Door;
  for (const std::string header : {"Bearer", "Bearer ", "bearer   "}) {
    EXPECT_EQ(policy.CheckOperator({}, &header).code(), StatusCode::kUnauthenticated) << header;
  }
  EXPECT_EQ(policy.CheckOperator({}, nullptr, Door::kMonitoringPort).message(),
            "the monitoring port needs an operator credential: a tessera-operator certificate (mutual TLS) or the "
            "admin token (\"Authorization: Bearer TOKEN\")");
  EXPECT_EQ(policy.CheckOperator({}, nullptr).message(),
            "the job service needs an operator credential: a tessera-operator certificate (mutual TLS) or the admin "
            "token (tessera --admin-token-file)");
  const std::string wrong = "Bearer nope";
  EXPECT_EQ(policy.CheckOperator({}, &wrong, Door::kMonitoringPort).message(),
            "the monitoring port refused the request: its admin token does not match the coordinator's");
  EXPECT_EQ(policy.CheckOperator(Certificate("w1", wire::kWorkerRole), nullptr, Door::kMonitoringPort).message(),
            "the monitoring port needs an operator: a tessera-operator certificate or the admin token; this caller's "
            "certificate is 'w1' (OU=tessera-worker)");
}

TEST(AccessPolicyTest, AJoinTokenFileHoldsOneTokenPerSite) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera-tokens-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "tokens").string();
  std::ofstream(path) << "# one per site\nsite-a token-of-site-a\n\nsite-b   token-of-site-b  \n";
  auto tokens = ReadJoinTokenFile(path);
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  EXPECT_EQ(*tokens, (std::map<std::string, std::string>{{"site-a", "token-of-site-a"}, {"site-b", "token-of-site-b"}}));
  std::ofstream(path) << "a-single-token\n";
  EXPECT_EQ(*ReadJoinTokenFile(path), (std::map<std::string, std::string>{{"default", "a-single-token"}}));
  std::ofstream(path) << "site-a token-of-site-a\nsite-a another-token\n";
  EXPECT_EQ(ReadJoinTokenFile(path).status().message(), "--join-token-file '" + path + "':2: label 'site-a' is given twice");
  std::ofstream(path) << "site-a token-of-site-a extra\n";
  EXPECT_EQ(ReadJoinTokenFile(path).status().message(),
            "--join-token-file '" + path + "':1: expected TOKEN or LABEL TOKEN, got more fields");
  // A comment after a token would be taken as the token, the token as its label.
  std::ofstream(path) << "3f9c0a6e2b7d41c8 #site-a's\n";
  EXPECT_EQ(ReadJoinTokenFile(path).status().message(),
            "--join-token-file '" + path + "':1: expected TOKEN or LABEL TOKEN, got a second field starting with '#' "
            "(a comment goes on a line of its own)");
  std::ofstream(path) << "site-a short\n";
  EXPECT_EQ(ReadJoinTokenFile(path).status().message(),
            "--join-token-file '" + path + "':1: join token 'site-a': expected 8 to 1024 bytes without whitespace, got "
            "5 bytes");
  std::ofstream(path) << "# nothing\n";
  EXPECT_EQ(ReadJoinTokenFile(path).status().message(), "--join-token-file '" + path + "': holds no token");
  EXPECT_EQ(ReadJoinTokenFile(dir.string()).status().message(),
            "--join-token-file '" + dir.string() + "': expected a file, got a directory");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::server
