// The worker agent's local training (agent_fixture.h): what it says of the batches training
// skipped, the running variances it keeps from taking the coordinator's model below 0, the
// device a round falls back to, and the deadline its update's upload ends at.
#include "tests/captured_log.h"
#include "tests/declared_layers.h"
#include "tests/worker/agent_fixture.h"
#include "worker/round_deadline.h"

namespace tessera::worker {
namespace {

// A batch norm after a linear layer holds one value per channel in a batch of one sample,
// which training skips (core/train/trainer.h): 512 samples in batches of 511 leave one such
// batch, said in the worker's log with the batch norm's name. The rest of the round trains and
// is uploaded.
TEST_F(AgentTest, ABatchOfOneSampleSkippedForABatchNormIsLogged) {
  ::tessera::testing::CapturedLog log;
  v1::JobSpec spec = TinyJob();
  ::tessera::testing::SetDeclaredLayers(spec.mutable_model(), {{"flatten"},
                                                                {"linear", "fc", 8},
                                                                {"batch_norm", "bn"},
                                                                {"relu"},
                                                                {"linear", "out"}});
  spec.set_batch_size(511);
  shared_->model_job = spec;
  v1::Task task = Train(1, 1);
  *task.mutable_train()->mutable_spec() = spec;
  Start({task});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  EXPECT_EQ(upload.local_steps(), 1u);
  EXPECT_NE(log.text().find("job job-1 round 1: skipped the batches that gave this worker one sample (1 in all): "
                            "batch norm 'bn' would hold one value per channel, with no batch variance"),
            std::string::npos)
      << log.text();
}

// A channel that is 0 for every sample (a linear unit whose weights are 0 and bias -1, before a
// ReLU) has no variance, and a batch norm of momentum 1 takes its running variance from the
// model's 1000.3 to 0: a delta of -1000.3, which float16 reads back as -1000.5. The worker sent
// it so, and the coordinator's model came out at -0.2, which its evaluation refuses. It is
// sent so that the sum stays at 0 or more (and the worker says so); the other channels as
// trained.
TEST_F(AgentTest, ARunningVarianceIsSentSoThatTheCoordinatorsModelStaysAtZeroOrMore) {
  ::tessera::testing::CapturedLog log;
  v1::JobSpec spec = TinyJob();
  ::tessera::testing::SetDeclaredLayers(spec.mutable_model(), {{"flatten"},
                                                                {"linear", "fc", 4},
                                                                {"relu"},
                                                                {"batch_norm", "bn", 0, 1.0},
                                                                {"linear", "out"}});
  spec.mutable_compression()->set_encoding(v1::ENCODING_FLOAT16);
  shared_->model_job = spec;
  shared_->edit_model = [](TensorSet& model) {
    for (NamedTensor& t : model) {
      if (t.name == "fc.weight") std::fill(t.values.begin(), t.values.begin() + t.shape[1], 0.0f);  // unit 0
      if (t.name == "fc.bias") t.values[0] = -1.0f;
      if (t.name == "bn.running_var") t.values[0] = 1000.3f;
    }
  };
  const TensorSet model = ScriptedCoordinator({}, shared_).model();
  v1::Task task = Train(1, 1);
  *task.mutable_train()->mutable_spec() = spec;
  Start({task});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  std::lock_guard<std::mutex> lock(shared_->mu);
  ASSERT_EQ(shared_->uploaded.size(), 1u);
  const TensorSet& delta = shared_->uploaded[0];
  ASSERT_EQ(delta.size(), model.size());
  bool checked = false;
  for (size_t i = 0; i < model.size(); ++i) {
    if (model[i].name != "bn.running_var") continue;
    checked = true;
    for (size_t j = 0; j < model[i].values.size(); ++j) {
      EXPECT_GE(model[i].values[j] + delta[i].values[j], 0.0f) << "element " << j;
      if (j > 0) {
        EXPECT_NE(delta[i].values[j], 0.0f) << "element " << j << ": a channel that trained was not sent";
      }
    }
  }
  EXPECT_TRUE(checked);
  EXPECT_NE(log.text().find("job job-1 round 1: tensor 'bn.running_var': 1 values would have left the coordinator's "
                            "model below 0; sent so that it stays at 0 or more"),
            std::string::npos)
      << log.text();
}

// A device that fails in a round sends it to the job's fallback device, made as this worker's
// own device is made: with --pace-real-time an emulated fallback is paced too. It was made
// unpaced, so the round ran at the host's speed. The log names the fallback and its pacing.
TEST_F(AgentTest, AnEmulatedFallbackDeviceIsPacedAsTheWorkersDevice) {
  ::tessera::testing::CapturedLog log;
  WorkerOptions options;
  options.device = "emu:" + WriteProfile("agent_test_tiny_paced.toml", "tiny-npu", 64 << 10);  // the model does not fit
  options.pace_real_time = true;
  v1::Task task = Train(1, 1);
  task.mutable_train()->mutable_spec()->set_fallback_device("emu:generic");
  Start({task}, {}, options);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  EXPECT_NE(log.text().find("job job-1 round 1: training on the fallback device emu:generic (emulated), paced in real time"),
            std::string::npos)
      << log.text();
}

// The round's deadline bounds its update's upload as it bounds its model's download: the
// coordinator takes no update after it (CoordinatorClient::UploadUpdate ends there).
TEST_F(AgentTest, AnUpdatesUploadEndsAtItsRoundsDeadline) {
  v1::Task task = Train(1, 1);
  const int64_t deadline = NowUnixMs() + 10 * 60 * 1000;
  task.mutable_train()->set_deadline_unix_ms(deadline);
  Start({task});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  std::lock_guard<std::mutex> lock(shared_->mu);
  ASSERT_EQ(shared_->upload_deadlines.size(), 1u);
  EXPECT_EQ(shared_->upload_deadlines[0], deadline);
}

}  // namespace
}  // namespace tessera::worker
