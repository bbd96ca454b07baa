// How long a cohort member waits for the others (worker/cohort.h): --cohort-timeout-s, never
// past the round's deadline, in the rendezvous and in every gradient allreduce.
#include "worker/cohort.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/fallback.h"
#include "collectives/local/communicator.h"
#include "device/registry.h"

namespace tessera::worker {
namespace {

using std::chrono::milliseconds;

constexpr int64_t kNow = 1'800'000'000'000;  // a wall-clock instant, in Unix milliseconds

TEST(CohortWaitTest, WithoutADeadlineTheFlagsTimeoutHolds) {
  const CohortWait wait = CohortWaitFor(30, 0, kNow);
  EXPECT_EQ(wait.timeout, milliseconds(30000));
  EXPECT_FALSE(wait.until_deadline);
  EXPECT_EQ(wait.round_deadline, std::chrono::steady_clock::time_point::max());
  EXPECT_EQ(wait.Describe(), "up to 30000 ms, --cohort-timeout-s");
}

// A slow member's round may last hours: a long --cohort-timeout-s is not cut by a later deadline.
TEST(CohortWaitTest, ADeadlineFurtherAwayThanTheFlagLeavesTheFlagsTimeout) {
  const int64_t three_hours = 3 * 3600 * 1000;
  const CohortWait wait = CohortWaitFor(7200, kNow + three_hours, kNow);
  EXPECT_EQ(wait.timeout, milliseconds(7200 * 1000));
  EXPECT_FALSE(wait.until_deadline);
  EXPECT_NE(wait.round_deadline, std::chrono::steady_clock::time_point::max());
}

TEST(CohortWaitTest, ANearerDeadlineBoundsTheWait) {
  const CohortWait wait = CohortWaitFor(30, kNow + 1500, kNow);
  EXPECT_EQ(wait.timeout, milliseconds(1500));
  EXPECT_TRUE(wait.until_deadline);
  EXPECT_EQ(wait.Describe(), "up to 1500 ms, the time left to the round's deadline");
}

TEST(CohortWaitTest, APassedDeadlineLeavesAMillisecond) {
  const CohortWait wait = CohortWaitFor(30, kNow - 5000, kNow);
  EXPECT_EQ(wait.timeout, milliseconds(1));
  EXPECT_TRUE(wait.until_deadline);
}

TEST(CohortWaitTest, TheTimeoutStaysWithinAMillisecondAndAWeek) {
  EXPECT_EQ(CohortWaitFor(0, 0, kNow).timeout, milliseconds(1));
  EXPECT_EQ(CohortWaitFor(UINT32_MAX, 0, kNow).timeout, milliseconds(kMaxCohortTimeoutS * 1000));
}

// Rank 0 of two whose peer never calls: its allreduce ends with the rank it waited for named.
Status AllreduceAlone(milliseconds communicator_timeout, std::chrono::steady_clock::time_point round_deadline) {
  auto hub = std::make_shared<collectives::LocalHub>(2);
  collectives::FallbackCommunicator communicator(
      std::make_unique<collectives::LocalCommunicator>(hub, 0, communicator_timeout), collectives::BufferLocation::kHost);
  auto device = CreateDevice("cpu");
  if (!device.ok()) return device.status();
  auto buffer = (*device)->Allocate(16 * sizeof(float));
  if (!buffer.ok()) return buffer.status();
  CohortGradientSync sync(&communicator, /*on_device=*/false, round_deadline);
  return sync.OnGradients(**device, *buffer, 16, 7);
}

// The communicator's timeout is a minute; the round ends in 100 ms, and so does the wait.
TEST(CohortGradientSyncTest, AnAllreduceWaitsNoLongerThanTheRoundsDeadline) {
  const Status s = AllreduceAlone(std::chrono::minutes(1), std::chrono::steady_clock::now() + milliseconds(100));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("cohort gradient allreduce at step 7, waiting up to "), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(" ms, the time left to the round's deadline"), std::string::npos) << s.ToString();
}

TEST(CohortGradientSyncTest, WithoutADeadlineAnAllreduceWaitsTheCommunicatorsTimeout) {
  const Status s = AllreduceAlone(milliseconds(100), std::chrono::steady_clock::time_point::max());
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("at step 7, waiting up to 100 ms, --cohort-timeout-s"), std::string::npos)
      << s.ToString();
}

// --cohort-address is published to the cohort's peers, who dial it on a port each round picks.
TEST(CohortAddressTest, AnAddressThePeersCanDialIsTaken) {
  for (const char* address : {"127.0.0.1", "10.0.0.5", "edge-01.site.example", "::1", "fe80::1"}) {
    EXPECT_TRUE(CheckCohortAddress(address).ok()) << address << ": " << CheckCohortAddress(address).ToString();
  }
}

TEST(CohortAddressTest, APortAWildcardOrAStrayCharacterIsRefusedNamingTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"10.0.0.5:7000", "--cohort-address '10.0.0.5:7000': expected the DNS name or IP address"},
      {"[::1]", "--cohort-address '[::1]': expected the DNS name or IP address (IPv6 without brackets)"},
      {"", "--cohort-address '': expected"},
      {"edge 01", "--cohort-address 'edge 01': expected"},
      {"edge\n[forged]", "--cohort-address 'edge\\n[forged]': expected"},
      {"0.0.0.0", "--cohort-address '0.0.0.0': a wildcard, which the cohort's peers cannot dial"},
      {"::", "--cohort-address '::': a wildcard"},
  };
  for (const auto& [address, says] : cases) {
    const Status s = CheckCohortAddress(address);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << address;
    EXPECT_EQ(s.message().rfind(says, 0), 0u) << s.message();
  }
}

}  // namespace
}  // namespace tessera::worker
