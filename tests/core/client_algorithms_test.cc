// The client side of FedProx, FedNova and SCAFFOLD against hand-computed numbers: the
// proximal term and the control variate correction inside the training loop (on the CPU and
// on emulated devices, where the term is a native op or a host fallback), FedNova's
// normaliser, and SCAFFOLD's control variate step.
#include "core/train/client_algorithms.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "core/train/trainer.h"
#include "device/placement.h"
#include "device/registry.h"

namespace tessera {
namespace {

// A two-sample dataset of 4x4 images; what they hold does not matter to these tests, whose
// hook replaces every gradient.
Dataset TwoSamples() {
  Dataset data;
  data.source = "two-samples";
  data.count = 2;
  data.rows = data.cols = 4;
  data.num_classes = 2;
  data.images.assign(2 * 16, 0.5f);
  data.labels = {0, 1};
  return data;
}

std::unique_ptr<Model> TinyMlp(Device* device) {
  ModelConfig config;
  config.name = "mlp";
  config.hidden = {3};
  config.rows = config.cols = 4;
  config.classes = 2;
  config.seed = 9;
  auto model = CreateModel(config, device);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return std::move(model).value();
}

// Replaces each step's gradient by `value` everywhere, so the step's arithmetic is known.
class ConstantGradient final : public GradientHook {
 public:
  explicit ConstantGradient(float value) : value_(value) {}
  Status OnGradients(Device& device, DeviceBuffer& flat_gradients, int64_t count, int64_t) override {
    device.Fill(count, value_, flat_gradients.f32());
    return Status::Ok();
  }

 private:
  float value_;
};

// Two steps of plain SGD (one sample a batch, momentum and weight decay 0) with the hook's
// gradient G = 1 and lr = 0.5; returns the parameters before and after.
struct TwoStepRun {
  std::vector<float> before, after;
  uint64_t steps = 0;
};
TwoStepRun TwoSteps(Device* device, TrainOptions options, float momentum = 0.0f) {
  auto model = TinyMlp(device);
  ConstantGradient gradient(1.0f);
  options.batch_size = 1;
  options.learning_rate = 0.5f;
  options.momentum = momentum;
  options.weight_decay = 0.0f;
  options.gradient_hook = &gradient;
  TwoStepRun run;
  run.before = FlattenTensors(model->GetState().value());
  auto report = TrainLocal(*model, TwoSamples(), {0, 1}, options);
  EXPECT_TRUE(report.ok()) << report.status().ToString();
  if (report.ok()) run.steps = report->steps;
  run.after = FlattenTensors(model->GetState().value());
  return run;
}

class ClientTermsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto device = CreateDevice(GetParam());
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_ = std::move(device).value();
  }
  std::unique_ptr<Device> device_;
};

TEST_P(ClientTermsTest, TheProximalTermPullsTowardsTheRoundsStartingPoint) {
  // Step 1: g = G + mu (w0 - w0) = 1, so w1 = w0 - 0.5.
  // Step 2: g = G + mu (w1 - w0) = 1 + 0.2 (-0.5) = 0.9, so w2 = w1 - 0.45 = w0 - 0.95.
  TrainOptions options;
  options.proximal_mu = 0.2f;
  const TwoStepRun run = TwoSteps(device_.get(), options);
  ASSERT_EQ(run.steps, 2u);
  ASSERT_FALSE(run.before.empty());
  for (size_t i = 0; i < run.before.size(); ++i) {
    ASSERT_NEAR(run.after[i], run.before[i] - 0.95f, 1e-6) << "parameter " << i;
  }
  // Without the term: w0 - 1.
  const TwoStepRun plain = TwoSteps(device_.get(), TrainOptions());
  for (size_t i = 0; i < plain.before.size(); ++i) ASSERT_NEAR(plain.after[i], plain.before[i] - 1.0f, 1e-6);
  // The term ran on the device, natively or as an accounted host fallback.
  if (OpPlacement* placement = device_->placement()) {
    const OpAccount native = placement->Native(Op::kAddScaledDifference);
    const OpAccount fallback = placement->Fallback(Op::kAddScaledDifference);
    EXPECT_EQ(native.calls + fallback.calls, 2u) << "one call a step with the term, none without";
  }
}

TEST_P(ClientTermsTest, TheControlVariatesCorrectEveryStep) {
  // g = G + (c - c_i) with c = 0.25 and c_i = 1 everywhere but the first parameter, whose
  // c_i is -0.75: per step w -= 0.5 (1 - 0.75) = 0.125, or 0.5 (1 + 1) = 1 for the first.
  auto model = TinyMlp(device_.get());
  const size_t n = static_cast<size_t>(model->NumParameters());
  std::vector<float> server(n, 0.25f), client(n, 1.0f);
  client[0] = -0.75f;
  TrainOptions options;
  options.server_control = &server;
  options.client_control = &client;
  const TwoStepRun run = TwoSteps(device_.get(), options);
  ASSERT_EQ(run.before.size(), n);
  EXPECT_NEAR(run.after[0], run.before[0] - 2.0f, 1e-6);
  for (size_t i = 1; i < n; ++i) ASSERT_NEAR(run.after[i], run.before[i] - 0.25f, 1e-6) << "parameter " << i;

  // Under momentum the gradient's steps grow (v = 1, then 1.9) but the correction does not:
  // w -= 0.5 (1 + 1.9) G + 2 x 0.5 (c - c_i), 2.45 for the first parameter (c - c_i = 1), 0.7
  // for the others (c - c_i = -0.75).
  const TwoStepRun momentum = TwoSteps(device_.get(), options, 0.9f);
  EXPECT_NEAR(momentum.after[0], momentum.before[0] - 2.45f, 1e-5);
  for (size_t i = 1; i < n; ++i) ASSERT_NEAR(momentum.after[i], momentum.before[i] - 0.7f, 1e-5) << "parameter " << i;

  // A variate of the wrong length, or one without the other, is refused before training.
  std::vector<float> short_control(n - 1, 0.0f);
  options.client_control = &short_control;
  auto refused = TrainLocal(*model, TwoSamples(), {0, 1}, options);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("client control variate has " + std::to_string(n - 1)),
            std::string::npos) << refused.status().message();
  options.client_control = nullptr;
  EXPECT_EQ(TrainLocal(*model, TwoSamples(), {0, 1}, options).status().code(), StatusCode::kInvalidArgument);
}

// The CPU, an emulated chip that runs the term natively (fp16) and one that sends it to the
// host (the edge NPU).
INSTANTIATE_TEST_SUITE_P(Devices, ClientTermsTest, ::testing::Values("cpu", "emu:a100", "emu:edge-npu"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

TEST(ClientTermsTest, ANegativeProximalMuIsRefused) {
  auto device = CreateDevice("cpu");
  ASSERT_TRUE(device.ok());
  auto model = TinyMlp(device->get());
  TrainOptions options;
  options.proximal_mu = -0.1f;
  auto refused = TrainLocal(*model, TwoSamples(), {0, 1}, options);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("proximal_mu"), std::string::npos) << refused.status().message();
}

TEST(FedNovaNormalizerTest, MatchesHandComputedValues) {
  // Plain SGD: a_i = tau.
  EXPECT_DOUBLE_EQ(*FedNovaNormalizer(7, 0.0), 7.0);
  EXPECT_DOUBLE_EQ(*FedNovaNormalizer(0, 0.9), 0.0);
  EXPECT_DOUBLE_EQ(*FedNovaNormalizer(0, 1e-20), 0.0);  // 1 - rho rounds to 1: ln rho is -infinity
  EXPECT_DOUBLE_EQ(*FedNovaNormalizer(3, 1e-20), 3.0);
  // Momentum 0.9: the coefficients of the steps are 1, 1.9, 2.71, ... (1 - 0.9^k) / 0.1.
  EXPECT_NEAR(*FedNovaNormalizer(1, 0.9), 1.0, 1e-12);
  EXPECT_NEAR(*FedNovaNormalizer(2, 0.9), 2.9, 1e-12);
  EXPECT_NEAR(*FedNovaNormalizer(3, 0.9), 5.61, 1e-12);
  // Momentum 0.5, two steps: 1 + 1.5.
  EXPECT_NEAR(*FedNovaNormalizer(2, 0.5), 2.5, 1e-12);
}

TEST(FedNovaNormalizerTest, IsHowFarMomentumSgdMovesUnderAConstantGradient) {
  // tau steps of w -= lr v, v = rho v + g from v = 0 move w by lr g a_i: the quantity FedNova
  // divides out. Checked on the device's own optimiser step.
  auto device = CreateDevice("cpu");
  ASSERT_TRUE(device.ok());
  auto buffers = [&](float value) {
    auto buffer = (*device)->Allocate(sizeof(float));
    EXPECT_TRUE(buffer.ok());
    (*device)->Fill(1, value, buffer->f32());
    return std::move(buffer).value();
  };
  for (const uint64_t tau : {1u, 4u, 25u}) {
    DeviceBuffer w = buffers(0.0f), v = buffers(0.0f), g = buffers(1.0f);
    for (uint64_t step = 0; step < tau; ++step) (*device)->SgdMomentumUpdate(1, 0.01f, 0.9f, 0.0f, g.f32(), v.f32(), w.f32());
    float moved = 0;
    ASSERT_TRUE((*device)->CopyDeviceToHost(w, 0, &moved, sizeof(float)).ok());
    EXPECT_NEAR(-moved / 0.01, *FedNovaNormalizer(tau, 0.9), 1e-3 * *FedNovaNormalizer(tau, 0.9)) << tau << " steps";
  }
}

// Near rho = 1 the closed form subtracts nearly equal numbers and divides the difference by
// 1 - rho: a_i must still be the sum of its steps' coefficients, sum over k of
// (1 - rho^k) / (1 - rho) = 1 + rho + ... + rho^(k-1) (for two steps, 1 + (1 + rho)).
TEST(FedNovaNormalizerTest, IsTheSumOfTheStepsCoefficientsForAMomentumNearOne) {
  for (const double rho : {0.99999, 0.9999999, 0.99999994}) {
    for (const uint64_t tau : {1u, 2u, 3u, 10u, 1000u}) {
      double sum = 0, coefficient = 0, power = 1;
      for (uint64_t k = 1; k <= tau; ++k) {
        coefficient += power;  // 1 + rho + ... + rho^(k-1)
        power *= rho;
        sum += coefficient;
      }
      Result<double> a = FedNovaNormalizer(tau, rho);
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      EXPECT_NEAR(*a, sum, 1e-8 * sum) << "momentum " << rho << ", " << tau << " steps";
    }
  }
}

// A momentum of 1 (a double just below it rounds to 1 as the trainer's float) makes the
// formula 0 / 0: refused, as is anything outside [0, 1), instead of reporting NaN.
TEST(FedNovaNormalizerTest, AMomentumOutsideZeroToOneIsRefusedNotNaN) {
  for (double rho : {1.0, static_cast<double>(static_cast<float>(0.99999998)), 1.5, -0.1,
                     std::numeric_limits<double>::quiet_NaN()}) {
    SCOPED_TRACE(rho);
    Result<double> a = FedNovaNormalizer(10, rho);
    ASSERT_FALSE(a.ok()) << *a;
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find("momentum must be in [0, 1)"), std::string::npos) << a.status().message();
  }
  Result<double> near_one = FedNovaNormalizer(10, 0.99999998);
  ASSERT_TRUE(near_one.ok()) << near_one.status().ToString();
  EXPECT_TRUE(std::isfinite(*near_one));
}

TEST(ScaffoldClientTest, ControlVariateStepByHand) {
  // x = (1, 2), y = (0.5, 2.5), c = (0.1, -0.2), c_i = (0.3, 0), K = 5, lr = 0.1:
  // (x - y) / (K lr) = (1, -1); c_i+ = c_i - c + (1, -1) = (1.2, -0.8); delta = (0.9, -0.8).
  const TensorSet x = {{"w", {2}, {1.0f, 2.0f}}};
  const TensorSet y = {{"w", {2}, {0.5f, 2.5f}}};
  const TensorSet c = {{"w", {2}, {0.1f, -0.2f}}};
  const TensorSet ci = {{"w", {2}, {0.3f, 0.0f}}};
  auto step = ScaffoldClientVariates(x, y, c, ci, 5, 0.1);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_NEAR(step->next_control[0].values[0], 1.2f, 1e-6);
  EXPECT_NEAR(step->next_control[0].values[1], -0.8f, 1e-6);
  EXPECT_NEAR(step->control_delta[0].values[0], 0.9f, 1e-6);
  EXPECT_NEAR(step->control_delta[0].values[1], -0.8f, 1e-6);
  EXPECT_EQ(step->control_delta[0].name, "w");

  EXPECT_EQ(ScaffoldClientVariates(x, y, c, ci, 0, 0.1).status().code(), StatusCode::kInvalidArgument);
  const TensorSet other = {{"v", {2}, {0.0f, 0.0f}}};
  auto mismatched = ScaffoldClientVariates(x, y, other, ci, 5, 0.1);
  EXPECT_EQ(mismatched.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mismatched.status().message().find("server's control variate"), std::string::npos)
      << mismatched.status().message();
}

}  // namespace
}  // namespace tessera
