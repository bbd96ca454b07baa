// The nccl backend's own contracts, beyond the generic suite (communicator_test.cc runs nccl
// on device buffers, one GPU per rank). Here without a GPU: the skip logic and that the
// suite's nccl ranks ask for device buffers. With one: a rank that never arrives costs the
// others timeout_ms and DEADLINE_EXCEEDED, never a hang; compute queued on a Device before a
// collective is what the collective reduces, and compute queued after it sees the result; a
// device index outside the visible ones is refused.
#include <gtest/gtest.h>

#include <vector>

#include "device/cuda/factory.h"
#include "device/device.h"
#include "test_backends.h"

namespace tessera::collectives::testing {
namespace {

TEST(NcclSkipTest, RanksBeyondTheVisibleGpusAreSkippedSayingHowManyAreNeeded) {
  NcclHere one_gpu{"", 1, "2.28.9"};
  EXPECT_EQ(NcclSkipReason(one_gpu, 1, RankMode::kThreads, false), "");
  EXPECT_EQ(NcclSkipReason(one_gpu, 1, RankMode::kProcesses, false), "");
  const std::string two = NcclSkipReason(one_gpu, 2, RankMode::kThreads, false);
  EXPECT_NE(two.find("2 NCCL ranks need 2 GPUs"), std::string::npos) << two;
  EXPECT_NE(two.find("1 visible"), std::string::npos) << two;
  NcclHere four_gpus{"", 4, "2.28.9"};
  EXPECT_EQ(NcclSkipReason(four_gpus, 4, RankMode::kProcesses, false), "");
  EXPECT_NE(NcclSkipReason(four_gpus, 5, RankMode::kThreads, false), "");
}

TEST(NcclSkipTest, ForkedRanksAreSkippedOnceCudaIsInitialisedInThisProcess) {
  NcclHere one_gpu{"", 1, "2.28.9"};
  const std::string reason = NcclSkipReason(one_gpu, 1, RankMode::kProcesses, true);
  EXPECT_NE(reason.find("forked ranks cannot use it"), std::string::npos) << reason;
  EXPECT_EQ(NcclSkipReason(one_gpu, 1, RankMode::kThreads, true), "") << "threads share the process's CUDA";
}

TEST(NcclSkipTest, WhyNcclCannotRunComesFirst) {
  NcclHere none{"FAILED_PRECONDITION: no usable CUDA device: no CUDA-capable device is detected", 0, ""};
  EXPECT_EQ(NcclSkipReason(none, 1, RankMode::kThreads, false), none.not_viable);
}

TEST(NcclSkipTest, TheProbeHereEitherFindsAGpuOrSaysWhyNot) {
  const NcclHere& here = ProbeNcclHere();
  if (here.not_viable.empty()) {
    EXPECT_GE(here.devices, 1);
    EXPECT_FALSE(here.version.empty());
  } else {
    EXPECT_EQ(here.devices, 0) << here.not_viable;
    EXPECT_TRUE(here.not_viable.find("CUDA") != std::string::npos ||
                here.not_viable.find("built without NCCL") != std::string::npos)
        << here.not_viable;
  }
}

// The suite's nccl ranks hand the registry device buffers: without a GPU, creation fails for
// want of a device, not because nccl "moves CUDA device buffers only" (what it says to a
// host-buffer request).
TEST(NcclSkipTest, TheSuitesNcclRanksAskForDeviceBuffers) {
  if (!ProbeNcclHere().not_viable.empty() &&
      ProbeNcclHere().not_viable.find("built without NCCL") != std::string::npos) {
    GTEST_SKIP() << "nccl not built: " << ProbeNcclHere().not_viable;
  }
  World world(1, RankMode::kThreads);
  auto created = world.Create("nccl", 0, 1000);
  if (created.ok()) return;  // a GPU here: it ran on device buffers
  EXPECT_EQ(created.status().ToString().find("device buffers only"), std::string::npos)
      << created.status().ToString();
}

class NcclOnCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = SkipReason("nccl", 1, RankMode::kThreads);
    if (!reason.empty()) GTEST_SKIP() << "nccl not viable here: " << reason;
  }
};

TEST_F(NcclOnCudaTest, ARankThatNeverArrivesIsDeadlineExceededWithinTheTimeout) {
  // Rank 0 alone: its NCCL communicator waits for rank 1 to join, until timeout_ms.
  World world(2, RankMode::kThreads);
  auto alone = world.Create("nccl", 0, 3000);
  ASSERT_FALSE(alone.ok()) << "a two-rank NCCL communicator was created without rank 1";
  EXPECT_EQ(alone.status().code(), StatusCode::kDeadlineExceeded) << alone.status().ToString();
  EXPECT_NE(alone.status().message().find("2 ranks to join"), std::string::npos) << alone.status().ToString();
  // Rank 1 alone: rank 0 never publishes the NCCL id.
  World other(2, RankMode::kThreads);
  auto waiting = other.Create("nccl", 1, 1000);
  ASSERT_FALSE(waiting.ok());
  EXPECT_EQ(waiting.status().code(), StatusCode::kDeadlineExceeded) << waiting.status().ToString();
}

TEST_F(NcclOnCudaTest, ADeviceIndexOutsideTheVisibleOnesIsRefusedNamingIt) {
  const int devices = ProbeNcclHere().devices;
  CommunicatorOptions options;
  options.backend = "nccl";
  options.location = BufferLocation::kDevice;
  options.device_index = devices;
  options.timeout_ms = 1000;
  CudaInitialisedHere() = true;
  auto created = CreateCommunicator(options, std::make_shared<HashStore>());
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument) << created.status().ToString();
  EXPECT_NE(created.status().message().find("device_index " + std::to_string(devices)), std::string::npos)
      << created.status().ToString();
}

// What a site cohort does at every step (worker/cohort.cc): compute the gradient on the
// Device's stream, synchronize, allreduce on NCCL's stream, update on the Device's stream.
TEST_F(NcclOnCudaTest, CollectivesSeeComputeQueuedBeforeThemAndComputeAfterSeesTheirResults) {
  auto created_device = CreateCudaDevice();
  ASSERT_TRUE(created_device.ok()) << created_device.status().ToString();
  Device& device = **created_device;
  World world(1, RankMode::kThreads);
  auto created = world.Create("nccl", 0, 30000);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Communicator& c = **created;

  // 256 MiB rewritten nine times: long enough that a collective not waiting for it would
  // read an earlier value.
  const int64_t count = int64_t(1) << 26;
  auto x = device.Allocate(count * sizeof(float)), y = device.Allocate(count * sizeof(float));
  auto sum = device.Allocate(sizeof(float));
  ASSERT_TRUE(x.ok() && y.ok() && sum.ok());
  for (int value = 0; value <= 8; ++value) device.Fill(count, float(value), x->f32());
  ASSERT_TRUE(device.Synchronize().ok());
  ASSERT_TRUE(c.Allreduce(x->data(), y->data(), count, DataType::kFloat32, ReduceOp::kSum).ok());
  device.ReduceSum(count, y->f32(), sum->f32());
  float total = 0;
  ASSERT_TRUE(device.CopyDeviceToHost(*sum, 0, &total, sizeof(total)).ok());
  EXPECT_EQ(total, 8.0f * float(count)) << "2^29 is exact in float";

  // In place, then an SGD step on the averaged gradient.
  const int64_t weights = 44426;  // SimpleCNN's parameter count
  auto gradient = device.Allocate(weights * sizeof(float)), velocity = device.Allocate(weights * sizeof(float)),
       parameters = device.Allocate(weights * sizeof(float));
  ASSERT_TRUE(gradient.ok() && velocity.ok() && parameters.ok());
  device.Fill(weights, 3.0f, gradient->f32());
  device.Fill(weights, 0.0f, velocity->f32());
  device.Fill(weights, 1.0f, parameters->f32());
  ASSERT_TRUE(device.Synchronize().ok());
  ASSERT_TRUE(c.Allreduce(gradient->data(), gradient->data(), weights, DataType::kFloat32, ReduceOp::kAvg).ok());
  device.SgdMomentumUpdate(weights, 0.5f, 0.0f, 0.0f, gradient->f32(), velocity->f32(), parameters->f32());
  std::vector<float> updated(weights);
  ASSERT_TRUE(device.CopyDeviceToHost(*parameters, 0, updated.data(), weights * sizeof(float)).ok());
  for (int64_t i = 0; i < weights; ++i) ASSERT_EQ(updated[i], -0.5f) << "parameter " << i;
}

}  // namespace
}  // namespace tessera::collectives::testing
