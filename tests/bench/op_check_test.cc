// The op checks (bench/op_check.h): their guards catch an op that writes or reads past a
// buffer; bench_gpu's cases stay inside their buffers; and the odd-shape sweep, run on the
// CPU against itself (everything but the cases marked large, which take seconds there) and
// on CUDA against the CPU where a GPU is present (every case).
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bench/op_check.h"
#include "device/cuda/factory.h"
#include "device/registry.h"

namespace tessera::op_check {
namespace {

std::unique_ptr<Device> Cpu() {
  auto created = CreateDevice("cpu");
  EXPECT_TRUE(created.ok()) << created.status().ToString();
  return created.ok() ? std::move(created).value() : nullptr;
}

TEST(OpCheckTest, AWriteBeyondAnOutputIsCaughtByItsGuard) {
  auto cpu = Cpu();
  ASSERT_NE(cpu, nullptr);
  // bench_gpu's old bias case, cut to what the guard can hold: 4 x 8 x 65 = 2,080 floats of a
  // 2,048-float activation, 128 bytes into the 256-byte guard that follows it. (The old case
  // wrote 2 KiB past the end: past the guard, into whatever the pool's size class left, or
  // past the block itself.)
  OpCheck overrun{"bias_add over the end", Op::kBiasAdd, false, 1e-6, [](OpRun& r) {
                    float* x = r.Out(Pattern(4 * 8 * 64, 1));
                    r.device().BiasAdd(4, 8, 65, r.In(Pattern(8, 2)), x);
                  }};
  const OpComparison result = Compare(overrun, *cpu, *cpu);
  ASSERT_FALSE(result.passed());
  EXPECT_NE(result.failure.find("wrote past the end of its output #1"), std::string::npos) << result.failure;
}

TEST(OpCheckTest, AReadBeyondAnInputShowsAsANonFiniteOutput) {
  auto cpu = Cpu();
  ASSERT_NE(cpu, nullptr);
  OpCheck overread{"bias_grad over the end", Op::kBiasGrad, false, 1e-6, [](OpRun& r) {
                     float* dbias = r.Out(8);
                     r.device().BiasGrad(4, 8, 65, r.In(Pattern(4 * 8 * 64, 3)), dbias);  // 32 floats too many
                   }};
  const OpComparison result = Compare(overread, *cpu, *cpu);
  ASSERT_FALSE(result.passed());
  EXPECT_NE(result.failure.find("not finite"), std::string::npos) << result.failure;
}

TEST(OpCheckTest, ADifferenceBeyondTheToleranceNamesTheOutput) {
  auto cpu = Cpu();
  ASSERT_NE(cpu, nullptr);
  int calls = 0;
  OpCheck drifting{"fill that differs", Op::kFill, false, 0, [&calls](OpRun& r) {
                     r.device().Fill(10, calls++ == 0 ? 1.0f : 1.0000001f, r.Out(10));
                   }};
  const OpComparison result = Compare(drifting, *cpu, *cpu);
  ASSERT_FALSE(result.passed());
  EXPECT_NE(result.failure.find("output 0"), std::string::npos) << result.failure;
  EXPECT_NE(result.failure.find("the same bits"), std::string::npos) << result.failure;
}

TEST(OpCheckTest, BenchGpusCasesStayInsideTheirBuffersAndCoverEveryOp) {
  auto cpu = Cpu();
  ASSERT_NE(cpu, nullptr);
  std::set<Op> covered;
  for (const OpCheck& check : BenchChecks()) {
    covered.insert(check.op);
    const OpComparison result = Compare(check, *cpu, *cpu);
    EXPECT_TRUE(result.passed()) << check.name << ": " << result.failure;
    EXPECT_GT(result.outputs, 0u) << check.name;
  }
  covered.insert(Op::kMaxPoolBackward);  // with max_pool, through the device's own argmax
  EXPECT_EQ(covered, AllOps());
}

// The sweep, one test per device: on the CPU against itself it proves the cases' own
// buffers and the guards; on CUDA it is the GPU's odd-shape check against the CPU.
class OddShapeSweepTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OddShapeSweepTest, EveryOpMatchesTheCpuAtOddShapes) {
  const std::string name = GetParam();
  std::unique_ptr<Device> device;
  if (name == "cuda") {
    const Viability viability = CudaViability();
    if (!viability.viable) GTEST_SKIP() << "cuda is not viable here: " << viability.reason;
    auto created = CreateCudaDevice();
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    device = std::move(created).value();
  } else {
    device = Cpu();
    ASSERT_NE(device, nullptr);
  }
  auto reference = Cpu();
  ASSERT_NE(reference, nullptr);
  std::set<Op> covered;
  int ran = 0, left_out = 0;
  for (const OpCheck& check : OddShapeChecks()) {
    if (check.large && name == "cpu") {
      ++left_out;
      continue;
    }
    covered.insert(check.op);
    const OpComparison result = Compare(check, *device, *reference);
    ++ran;
    EXPECT_TRUE(result.passed()) << check.name << " on " << device->capabilities().name << ": " << result.failure;
  }
  EXPECT_EQ(covered, AllOps());
  std::cout << ran << " odd-shape checks ran on " << device->capabilities().name;
  if (left_out > 0) std::cout << "; " << left_out << " large ones are left to a GPU run";
  std::cout << "\n";
}

INSTANTIATE_TEST_SUITE_P(Devices, OddShapeSweepTest, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace tessera::op_check
