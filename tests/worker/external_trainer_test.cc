// The external trainer's side of the worker that needs no process: the round's deadline on
// the worker's clock.
#include "worker/external_trainer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>

namespace tessera::worker {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr int64_t kNowUnixMs = 1'800'000'000'000;

// A deadline past what steady_clock's nanoseconds hold (a coordinator's INT64_MAX, a year
// 2500) is far off: wrapped into the past, it killed the trainer before it could reply.
TEST(TrainerDeadlineTest, AFarDeadlineIsFarOffNeverPast) {
  const auto before = steady_clock::now();
  for (int64_t deadline :
       {std::numeric_limits<int64_t>::max(), int64_t{16'725'225'600'000}, kNowUnixMs + (int64_t{1} << 50)}) {
    EXPECT_GT(TrainerDeadline(deadline, kNowUnixMs), before + hours(24 * 365 * 30)) << deadline;
  }
}

TEST(TrainerDeadlineTest, ANearDeadlineIsKeptAndNoneAllowsADay) {
  const auto before = steady_clock::now();
  const auto in_a_minute = TrainerDeadline(kNowUnixMs + 60'000, kNowUnixMs);
  const auto passed = TrainerDeadline(kNowUnixMs - 5'000, kNowUnixMs);
  const auto none = TrainerDeadline(0, kNowUnixMs);
  const auto after = steady_clock::now();
  EXPECT_GE(in_a_minute, before + milliseconds(60'000));
  EXPECT_LE(in_a_minute, after + milliseconds(60'000));
  EXPECT_GE(passed, before);
  EXPECT_LE(passed, after);
  EXPECT_GE(none, before + hours(24));
  EXPECT_LE(none, after + hours(24));
}

}  // namespace
}  // namespace tessera::worker
