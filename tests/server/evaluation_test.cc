// The coordinator's own evaluation (server/jobs/evaluation.h) on the device the operator names
// (tessera-coordinator --eval-device): the same model and test split give the same figures on
// another fp32 device, the initial model does not depend on the device, and a device that
// cannot be made is an error naming it.
#include "server/jobs/evaluation.h"

#include <gtest/gtest.h>

#include "core/data/idx.h"

namespace tessera::server {
namespace {

v1::JobSpec SimpleCnnSpec() {
  v1::JobSpec spec;
  spec.mutable_model()->set_name("simplecnn");
  spec.set_seed(3);
  spec.mutable_data()->set_max_test_samples(600);
  return spec;
}

class EvaluationDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto test = LoadFashionMnist("", false); !test.ok()) {
      GTEST_SKIP() << "Fashion-MNIST not available: " << test.status().ToString();
    }
  }
  DatasetDirs dirs_;
};

TEST_F(EvaluationDeviceTest, AnotherFp32DeviceGivesTheCpusFigures) {
  auto cpu = Evaluator::Create(SimpleCnnSpec(), dirs_, "job a", 1, "cpu");
  auto emulated = Evaluator::Create(SimpleCnnSpec(), dirs_, "job a", 1, "emu:generic");
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  ASSERT_TRUE(emulated.ok()) << emulated.status().ToString();
  EXPECT_NE((*emulated)->DeviceName().find("emulated"), std::string::npos) << (*emulated)->DeviceName();
  EXPECT_NE((*cpu)->DeviceName().find("cpu"), std::string::npos) << (*cpu)->DeviceName();
  // The initial model is drawn on the host: the same on both.
  auto initial = (*cpu)->InitialModel();
  auto initial_there = (*emulated)->InitialModel();
  ASSERT_TRUE(initial.ok() && initial_there.ok());
  ASSERT_EQ(initial->size(), initial_there->size());
  for (size_t t = 0; t < initial->size(); ++t) EXPECT_EQ((*initial)[t].values, (*initial_there)[t].values) << t;
  // A model a little away from the start, so that the figures are not a uniform guess.
  TensorSet state = *initial;
  for (auto& tensor : state) {
    for (size_t i = 0; i < tensor.values.size(); ++i) tensor.values[i] *= 1.0f + 0.25f * float(i % 7) / 7.0f;
  }
  auto here = (*cpu)->Evaluate(state);
  auto there = (*emulated)->Evaluate(state);
  ASSERT_TRUE(here.ok()) << here.status().ToString();
  ASSERT_TRUE(there.ok()) << there.status().ToString();
  EXPECT_EQ(here->accuracy, there->accuracy);
  EXPECT_NEAR(here->loss, there->loss, 1e-6 * here->loss);
  EXPECT_GT(here->loss, 0);
}

TEST_F(EvaluationDeviceTest, ADeviceThatCannotBeMadeIsAnErrorNamingTheJobAndTheDevice) {
  auto unknown = Evaluator::Create(SimpleCnnSpec(), dirs_, "job b", 1, "gpu");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument) << unknown.status().ToString();
  EXPECT_NE(unknown.status().message().find("job b: the evaluation device"), std::string::npos)
      << unknown.status().ToString();
  EXPECT_NE(unknown.status().message().find("gpu"), std::string::npos) << unknown.status().ToString();
}

}  // namespace
}  // namespace tessera::server
