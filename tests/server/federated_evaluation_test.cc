// Federated evaluation in the round record: the workers' reports on their local test splits,
// weighted by their samples; a report that cannot be an evaluation is refused.
#include <gtest/gtest.h>

#include "job_runner_fixture.h"

namespace tessera::server {
namespace {

class FederatedEvaluationTest : public JobRunnerFixture {};

FakeAction Evaluated(uint64_t samples, double accuracy, double loss) {
  return FakeAction::Upload().WithTamper([=](v1::UpdateHeader* h, TensorSet*) {
    h->set_eval_samples(samples);
    h->set_eval_accuracy(accuracy);
    h->set_eval_loss(loss);
  });
}

TEST_F(FederatedEvaluationTest, TheRoundHoldsTheSampleWeightedMeans) {
  AddWorker("w1", Always(Evaluated(100, 0.8, 0.5)));
  AddWorker("w2", Always(Evaluated(300, 0.4, 1.5)));
  AddWorker("w3", Always(FakeAction::Upload()));  // evaluates nothing: not in the means
  Submit(SmallSpec(3, 3));
  v1::Job job = AwaitEnd();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_DOUBLE_EQ(rounds[0].federated_accuracy(), (100 * 0.8 + 300 * 0.4) / 400);
  EXPECT_DOUBLE_EQ(rounds[0].federated_loss(), (100 * 0.5 + 300 * 1.5) / 400);
  for (const auto& w : rounds[0].workers()) {
    if (w.worker_id() == "w2") {
      EXPECT_EQ(w.local_test_samples(), 300u);
      EXPECT_DOUBLE_EQ(w.local_test_accuracy(), 0.4);
    }
    if (w.worker_id() == "w3") {
      EXPECT_EQ(w.local_test_samples(), 0u);
    }
  }
}

TEST_F(FederatedEvaluationTest, AnAccuracyOutsideZeroToOneIsRefused) {
  AddWorker("w1", Always(Evaluated(100, 0.8, 0.5)));
  FakeWorker& liar = AddWorker("w2", Always(Evaluated(100, 1.5, 0.5)));
  Submit(SmallSpec(2, 1));
  v1::Job job = AwaitEnd();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].clients_reported(), 1u);
  EXPECT_DOUBLE_EQ(rounds[0].federated_accuracy(), 0.8) << "the refused report is not in the mean";
  for (const auto& w : rounds[0].workers()) {
    if (w.worker_id() != "w2") continue;
    EXPECT_NE(w.outcome(), "accepted");
    EXPECT_EQ(w.local_test_samples(), 0u) << w.outcome();
  }
  (void)liar;
}

}  // namespace
}  // namespace tessera::server
