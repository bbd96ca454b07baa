// A batch norm's running variance at the coordinator: an update that would take it below 0 is
// refused with its worker, round, tensor and element named, and the round goes on without it
// (once it was folded, and the round's evaluation of the model failed the job); the checks
// take the delta as folded, clipped or sent as the trained model; a compressed download sends
// running variances in float32, so that workers add to the coordinator's own values.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "async_driver_fixture.h"
#include "job_runner_fixture.h"
#include "server/jobs/model_version.h"
#include "server/jobs/update_checks.h"
#include "tests/declared_layers.h"

namespace tessera::server {
namespace {

class RunningVarianceTest : public JobRunnerFixture {};

// A declared model with a batch norm ("bn": bn.weight, bn.bias, bn.running_mean, bn.running_var).
v1::JobSpec BatchNormSpec(uint32_t clients, uint32_t min_clients) {
  v1::JobSpec spec = JobRunnerFixture::SmallSpec(clients, min_clients);
  ::tessera::testing::SetDeclaredLayers(spec.mutable_model(), {{"flatten"},
                                                                {"linear", "fc", 8},
                                                                {"batch_norm", "bn"},
                                                                {"relu"},
                                                                {"linear", "out"}});
  return spec;
}

// A delta of `global`'s layout: `fill` everywhere, and bn.running_var's element 3 moved to
// `variance` (the model's value plus the delta's).
FakeAction UploadVariance(float fill, float variance) {
  FakeAction action;
  action.delta = [fill, variance](const TensorSet& global) {
    TensorSet delta = global;
    for (NamedTensor& t : delta) {
      for (size_t j = 0; j < t.values.size(); ++j) {
        t.values[j] = t.name == "bn.running_var" && j == 3 ? variance - t.values[j] : fill;
      }
    }
    return delta;
  };
  return action;
}

TEST_F(RunningVarianceTest, AnUpdateTakingARunningVarianceBelowZeroIsRefusedAndTheRoundGoesOn) {
  AddWorker("w1", Always(UploadVariance(0.001f, 0.5f)));
  // Alone in the mean with w1 it would leave bn.running_var[3] at (0.5 - 9.5) / 2 = -4.5: the
  // round's evaluation refused the model and the job failed.
  AddWorker("w2", Always(UploadVariance(0.001f, -9.5f)));
  v1::Job job = Run(BatchNormSpec(2, 1));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(ReportOf(rounds[0], "w1").outcome(), "accepted");
  const std::string outcome = ReportOf(rounds[0], "w2").outcome();
  EXPECT_NE(outcome.find("rejected: update from worker 'w2' for job " + std::string(kJobId) +
                         " round 1: tensor 'bn.running_var' element 3: the model's 1 plus the update's -10.5 is "
                         "below 0"),
            std::string::npos)
      << outcome;
  auto model = store_.LoadCheckpoint(kJobId, 1);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  for (const NamedTensor& t : *model) {
    if (t.name == "bn.running_var") {
      EXPECT_FLOAT_EQ(t.values[3], 0.5f);  // w1's alone
    }
  }
}

// The same for an asynchronous job's update: refused as its fault, its client trains again and
// makes the step (folded, it made the step's model fail its evaluation and the job with it).
TEST_F(AsyncDriverTest, AnAsynchronousUpdateTakingARunningVarianceBelowZeroIsRefused) {
  auto first = std::make_shared<std::atomic<bool>>(true);
  FakeWorker& a = AddWorker("a", [first](const v1::TrainTask&) {
    return first->exchange(false) ? UploadVariance(0.001f, -9.5f) : UploadVariance(0.001f, 0.5f);
  });
  v1::JobSpec spec = AsyncSpec(1, 1, /*buffer=*/1, /*max_staleness=*/1);
  *spec.mutable_model() = BatchNormSpec(1, 1).model();
  Submit(spec);
  ExpectRefusedAndTrainedAgain(a, "update from worker 'a' for job " + std::string(kJobId) +
                                      " task 1: tensor 'bn.running_var' element 3: the model's 1 plus the update's "
                                      "-10.5 is below 0");
}

// The checks themselves: a delta that keeps the sum at 0 (exactly) passes; one a float below
// it is refused; the verdict is on the delta as folded (a clipped delta scaled towards 0 keeps
// a sum it kept) and on a trained model made its delta. Tensors not marked are not looked at.
TEST(RunningVarianceCheckTest, TheSumOfTheModelAndTheDeltaAsFoldedMustStayAtZeroOrMore) {
  const TensorSet global = {{"w", {2}, {0.5f, 0.5f}}, {"v", {2}, {0.3f, 2.0f}}};
  const std::vector<bool> marked = {false, true};
  const TensorSet exact = {{"w", {2}, {-7.0f, 0.0f}}, {"v", {2}, {-0.3f, -2.0f}}};
  CheckedDelta checked = CheckDelta(global, exact, nullptr, {}, 1000, false, "update from worker 'w1'", {}, &marked);
  EXPECT_TRUE(checked.verdict.ok()) << checked.verdict.ToString();
  const TensorSet below = {{"w", {2}, {0.0f, 0.0f}}, {"v", {2}, {-0.3f, std::nextafter(-2.0f, -3.0f)}}};
  checked = CheckDelta(global, below, nullptr, {}, 1000, false, "update from worker 'w1'", {}, &marked);
  EXPECT_EQ(checked.verdict.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(checked.verdict.message().find("update from worker 'w1': tensor 'v' element 1: the model's 2 plus the "
                                           "update's -2.0000002 is below 0"),
            std::string::npos)
      << checked.verdict.message();
  EXPECT_TRUE(CheckDelta(global, below, nullptr, {}, 1000, false, "w1").verdict.ok());  // nothing marked
  // Clipped to a norm of 1: the delta as folded is `exact`'s over its norm (7.29), above -v.
  checked = CheckDelta(global, exact, nullptr, {}, 1, true, "w1", {}, &marked);
  EXPECT_TRUE(checked.verdict.ok()) << checked.verdict.ToString();
  ASSERT_TRUE(checked.clipped.has_value());
  // A trained model: its value is the sum.
  TensorSet trained = {{"w", {2}, {0.5f, 0.5f}}, {"v", {2}, {0.0f, -0.5f}}};
  checked = CheckTrainedDelta(global, trained, nullptr, {}, 1000, false, "w1", &marked);
  EXPECT_EQ(checked.verdict.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(checked.verdict.message().find("tensor 'v' element 1"), std::string::npos) << checked.verdict.message();
}

// A float16 download sends every tensor it holds in float16, but for those marked exact.
TEST(RunningVarianceDownloadTest, ACompressedDownloadSendsRunningVariancesInFloat32) {
  auto tensors = std::make_shared<const TensorSet>(
      TensorSet{{"w", {4}, {0.1f, 0.2f, 0.3f, 0.4f}}, {"bn.running_var", {4}, {1000.3f, 1.0f, 0.5f, 2.0f}}});
  auto version = ModelVersion::Encode(tensors, 1, 1 << 20, UpdateEncoding::kFloat16, {false, true});
  EXPECT_EQ(version->encoded_tensors(), 1u);
  EXPECT_EQ(version->total_bytes(), 4u * 2 + 4u * 4);
  auto all = ModelVersion::Encode(tensors, 1, 1 << 20, UpdateEncoding::kFloat16);
  EXPECT_EQ(all->encoded_tensors(), 2u);
}

}  // namespace
}  // namespace tessera::server
