// What a cancel from the coordinator covers (worker/cancelled_task.h).
#include "worker/cancelled_task.h"

#include <gtest/gtest.h>

namespace tessera::worker {
namespace {

TEST(CancelledTaskTest, ACancelCoversItsAttemptOrWithoutOneEveryAttemptOfItsRound) {
  const CancelledTask attempt{"job-1", 3, 2};
  EXPECT_TRUE(attempt.Covers("job-1", 3, 2));
  EXPECT_FALSE(attempt.Covers("job-1", 3, 1));
  EXPECT_FALSE(attempt.Covers("job-1", 4, 2));
  EXPECT_FALSE(attempt.Covers("job-2", 3, 2));
  const CancelledTask round{"job-1", 3, 0};
  EXPECT_TRUE(round.Covers("job-1", 3, 1));
  EXPECT_TRUE(round.Covers("job-1", 3, 7));
  EXPECT_FALSE(round.Covers("job-1", 2, 1));
}

// Round 0 is the job's end, which the worker acts on whatever the attempt (it lets go of the
// job's data): every task of the job is covered, even by an end that gives an attempt (a
// coordinator of another version), so none trains on after the job's data is released.
TEST(CancelledTaskTest, TheEndOfAJobCoversEveryTaskOfItWhateverItsAttempt) {
  for (uint32_t attempt : {0u, 1u, 5u}) {
    const CancelledTask end{"job-1", 0, attempt};
    EXPECT_TRUE(end.Covers("job-1", 1, 1)) << attempt;
    EXPECT_TRUE(end.Covers("job-1", 9, 3)) << attempt;
    EXPECT_FALSE(end.Covers("job-2", 1, 1)) << attempt;
  }
}

}  // namespace
}  // namespace tessera::worker
