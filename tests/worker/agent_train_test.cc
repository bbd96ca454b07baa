// The worker agent's local training (agent_fixture.h): what it says of the batches training
// skipped, and the device a round falls back to.
#include "tests/captured_log.h"
#include "tests/worker/agent_fixture.h"

namespace tessera::worker {
namespace {

// A batch norm after a linear layer holds one value per channel in a batch of one sample,
// which training skips (core/train/trainer.h): 512 samples in batches of 511 leave one such
// batch, said in the worker's log with the batch norm's name. The rest of the round trains and
// is uploaded.
TEST_F(AgentTest, ABatchOfOneSampleSkippedForABatchNormIsLogged) {
  ::tessera::testing::CapturedLog log;
  v1::JobSpec spec = TinyJob();
  spec.mutable_model()->set_name("declared");
  spec.mutable_model()->clear_hidden();
  for (const auto& [type, name, out] : {std::tuple<const char*, const char*, uint32_t>{"flatten", "", 0},
                                        {"linear", "fc", 8},
                                        {"batch_norm", "bn", 0},
                                        {"relu", "", 0},
                                        {"linear", "out", 0}}) {
    v1::LayerSpec* layer = spec.mutable_model()->add_layers();
    layer->set_type(type);
    layer->set_name(name);
    layer->set_out(out);
  }
  spec.set_batch_size(511);
  shared_->model_job = spec;
  v1::Task task = Train(1, 1);
  *task.mutable_train()->mutable_spec() = spec;
  Start({task});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  EXPECT_EQ(upload.local_steps(), 1u);
  EXPECT_NE(log.text().find("job job-1 round 1: skipped the batches of one sample (1 in all): batch norm 'bn' would "
                            "hold one value per channel, with no batch variance"),
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

}  // namespace
}  // namespace tessera::worker
