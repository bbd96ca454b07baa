// What a seat carries into its next top-k update after each way an upload can end.
#include "worker/error_feedback.h"
#include "worker/seat_memory.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace tessera::worker {
namespace {

TensorSet Unsent(float a, float b) { return {{"w", {2}, {a, b}}}; }

TEST(ErrorFeedbackTest, ATakenUpdateLeavesWhatDidNotTravel) {
  auto kept = ResidualAfterUpload(UploadOutcome::kTaken, Unsent(0.25f, -0.5f));
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ((*kept)[0].values, (std::vector<float>{0.25f, -0.5f}));
}

// The coordinator may have folded an update whose verdict was lost: sending its values again
// would count them twice, so only what did not travel is kept, as if it was taken.
TEST(ErrorFeedbackTest, AnUpdateWithoutAVerdictKeepsOnlyWhatDidNotTravel) {
  auto kept = ResidualAfterUpload(UploadOutcome::kUnknown, Unsent(1.0f, 2.0f));
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ((*kept)[0].values, (std::vector<float>{1.0f, 2.0f}));
}

// A refused update is often refused for its values; carried forward they would be refused
// again every round, so the seat starts afresh.
TEST(ErrorFeedbackTest, ARefusedUpdateLeavesNothing) {
  EXPECT_FALSE(ResidualAfterUpload(UploadOutcome::kRefused, Unsent(1.0f, 2.0f)).has_value());
}

TEST(ErrorFeedbackTest, AResidualThatIsNotFiniteIsNeverKept) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(ResidualAfterUpload(UploadOutcome::kTaken, Unsent(nan, 1.0f)).has_value());
  EXPECT_FALSE(ResidualAfterUpload(UploadOutcome::kUnknown, Unsent(1.0f, -inf)).has_value());
}

// Past its limit a worker's seat memory dropped the first seat in key order: a running job's
// seat ("a#0", used every round) went when a new job came, while the seats of jobs that had
// ended stayed. The seat used longest ago goes now.
TEST(SeatMemoryTest, TheSeatUsedLongestAgoGoesNotTheFirstByName) {
  SeatMemory<int> kept(3);
  kept.Keep("a#0", 1);
  kept.Keep("b#0", 2);  // jobs that end after this round
  kept.Keep("c#0", 3);
  ASSERT_NE(kept.Find("a#0"), nullptr);  // the running job's next round
  kept.Keep("a#0", 4);
  kept.Keep("d#0", 5);  // a new job
  EXPECT_TRUE(kept.Holds("a#0"));
  EXPECT_FALSE(kept.Holds("b#0"));
  EXPECT_TRUE(kept.Holds("c#0"));
  EXPECT_TRUE(kept.Holds("d#0"));
  ASSERT_NE(kept.Find("a#0"), nullptr);
  EXPECT_EQ(*kept.Find("a#0"), 4);
  kept.Keep("e#0", 6);
  EXPECT_FALSE(kept.Holds("c#0"));
  EXPECT_EQ(kept.size(), 3u);
}

}  // namespace
}  // namespace tessera::worker
