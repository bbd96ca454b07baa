// What a seat carries into its next top-k update after each way an upload can end.
#include "worker/error_feedback.h"

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

}  // namespace
}  // namespace tessera::worker
