// How often the worker beats for what its coordinator's JoinResponse says (worker/heartbeat.h).
#include "worker/heartbeat.h"

#include <gtest/gtest.h>

namespace tessera::worker {
namespace {

TEST(HeartbeatIntervalTest, TheCoordinatorsIntervalIsKeptWithinItsOwnFlagsRange) {
  EXPECT_EQ(HeartbeatIntervalMs(200, 600000), 200u);
  EXPECT_EQ(HeartbeatIntervalMs(60000, 120000), 60000u);
  // The least --heartbeat-interval-ms a coordinator takes, with the least timeout above it: a
  // worker beating any slower is dropped from every round.
  EXPECT_EQ(HeartbeatIntervalMs(50, 51), 50u);
}

TEST(HeartbeatIntervalTest, AnIntervalPastTheTimeoutBeatsTwicePerTimeout) {
  // A coordinator (of another version, or misconfigured) whose interval would have it drop the
  // worker between two beats.
  EXPECT_EQ(HeartbeatIntervalMs(60000, 30000), 15000u);
  EXPECT_EQ(HeartbeatIntervalMs(5000, 5000), 2500u);
  EXPECT_EQ(HeartbeatIntervalMs(0xffffffffu, 10000), 5000u);
  // Never faster than the coordinator's least interval, whatever its timeout.
  EXPECT_EQ(HeartbeatIntervalMs(1000, 1), 50u);
}

TEST(HeartbeatIntervalTest, AnIntervalNotGivenIsASecondAndAHugeOneAMinute) {
  EXPECT_EQ(HeartbeatIntervalMs(0, 0), 1000u);
  EXPECT_EQ(HeartbeatIntervalMs(0, 600), 300u);
  EXPECT_EQ(HeartbeatIntervalMs(0xffffffffu, 0), 60000u);
}

}  // namespace
}  // namespace tessera::worker
