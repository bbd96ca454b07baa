#include "core/model/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "device/cpu/factory.h"
#include "device/emulated/factory.h"
#include "device/emulated/profile.h"

namespace tessera {
namespace {

class ModelTest : public ::testing::Test {
 protected:
  std::unique_ptr<Model> Make(const std::string& name, uint64_t seed = 1) {
    ModelConfig config;
    config.name = name;
    config.seed = seed;
    auto model = CreateModel(config, device_.get());
    EXPECT_TRUE(model.ok()) << model.status().ToString();
    return std::move(model).value();
  }
  std::unique_ptr<Device> device_ = CreateCpuDevice();
};

TEST_F(ModelTest, SimpleCnnHasNiidBenchLayoutAnd44426Parameters) {
  auto model = Make("simplecnn");
  EXPECT_EQ(model->NumParameters(), 44426);
  TensorSet state = model->GetState().value();
  std::vector<std::string> names;
  for (const auto& tensor : state) names.push_back(tensor.name);
  EXPECT_EQ(names, (std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight",
                                             "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"}));
  EXPECT_EQ(state[0].shape, (std::vector<int64_t>{6, 1, 5, 5}));
  EXPECT_EQ(state[2].shape, (std::vector<int64_t>{16, 6, 5, 5}));
  EXPECT_EQ(state[4].shape, (std::vector<int64_t>{120, 256}));
  EXPECT_EQ(state[8].shape, (std::vector<int64_t>{10, 84}));
  EXPECT_EQ(TotalElements(state), 44426);
}

TEST_F(ModelTest, MlpDefaultsToTwoHiddenLayersOf200) {
  auto model = Make("mlp");
  EXPECT_EQ(model->NumParameters(), 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10);
  EXPECT_EQ(model->GetState().value().back().name, "fc3.bias");
}

TEST_F(ModelTest, ParametersAreCountedWithoutBuildingTheModel) {
  for (const char* name : {"simplecnn", "mlp"}) {
    ModelConfig config;
    config.name = name;
    auto counted = CountParameters(config);
    ASSERT_TRUE(counted.ok()) << counted.status().ToString();
    EXPECT_EQ(*counted, Make(name)->NumParameters()) << name;
  }
  // A width whose model would need gigabytes is counted, not allocated.
  ModelConfig wide;
  wide.name = "mlp";
  wide.hidden = {600000};
  auto counted = CountParameters(wide);
  ASSERT_TRUE(counted.ok()) << counted.status().ToString();
  EXPECT_EQ(*counted, int64_t{784} * 600000 + 600000 + 600000 * 10 + 10);
  wide.hidden = {0};
  EXPECT_EQ(CountParameters(wide).status().code(), StatusCode::kInvalidArgument);
  wide.name = "resnet";
  EXPECT_NE(CountParameters(wide).status().message().find("known models"), std::string::npos);
}

TEST_F(ModelTest, InitialisationIsPyTorchDefaultAndDeterministic) {
  auto a = Make("simplecnn", 5), b = Make("simplecnn", 5), c = Make("simplecnn", 6);
  TensorSet state = a->GetState().value();
  EXPECT_EQ(TensorSetSha256(state), TensorSetSha256(b->GetState().value()));
  EXPECT_NE(TensorSetSha256(state), TensorSetSha256(c->GetState().value()));
  // conv1 fan_in 25: bound 0.2; fc1 fan_in 256: bound 0.0625.
  for (float v : state[0].values) EXPECT_LE(std::fabs(v), 0.2f);
  for (float v : state[5].values) EXPECT_LE(std::fabs(v), 0.0625f);
  float largest = 0;
  for (float v : state[4].values) largest = std::max(largest, std::fabs(v));
  EXPECT_GT(largest, 0.06f);
}

TEST_F(ModelTest, UnknownModelNameListsTheKnownOnes) {
  ModelConfig config;
  config.name = "resnet50";
  auto model = CreateModel(config, device_.get());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("resnet50"), std::string::npos);
  EXPECT_NE(model.status().message().find("simplecnn"), std::string::npos);
  EXPECT_NE(model.status().message().find("mlp"), std::string::npos);
}

TEST_F(ModelTest, SetStateRoundTripsAndRefusesOtherLayouts) {
  auto a = Make("simplecnn", 1), b = Make("simplecnn", 2);
  ASSERT_TRUE(b->SetState(a->GetState().value()).ok());
  EXPECT_EQ(TensorSetSha256(a->GetState().value()), TensorSetSha256(b->GetState().value()));

  TensorSet renamed = a->GetState().value();
  renamed[3].name = "conv2.offset";
  Status status = b->SetState(renamed);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("conv2.bias"), std::string::npos) << status.ToString();

  TensorSet reshaped = a->GetState().value();
  reshaped[4].shape = {256, 120};
  EXPECT_EQ(b->SetState(reshaped).code(), StatusCode::kInvalidArgument);

  TensorSet short_values = a->GetState().value();
  short_values[9].values.pop_back();
  EXPECT_EQ(b->SetState(short_values).code(), StatusCode::kInvalidArgument);

  TensorSet missing = a->GetState().value();
  missing.pop_back();
  EXPECT_EQ(b->SetState(missing).code(), StatusCode::kInvalidArgument);

  TensorSet not_finite = a->GetState().value();
  not_finite[0].values[0] = std::nanf("");
  EXPECT_EQ(b->SetState(not_finite).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TensorSetSha256(a->GetState().value()), TensorSetSha256(b->GetState().value()));
  EXPECT_EQ(Make("mlp")->SetState(a->GetState().value()).code(), StatusCode::kInvalidArgument);
}

TEST_F(ModelTest, CreatedWithAStateHoldsThatStateAndRefusesAnotherLayout) {
  auto a = Make("simplecnn", 7);
  ModelConfig config;
  config.name = "simplecnn";
  config.seed = 1;  // a draw from this seed would differ from a's weights
  auto b = CreateModelWithState(config, device_.get(), a->GetState().value());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(TensorSetSha256((*b)->GetState().value()), TensorSetSha256(a->GetState().value()));

  TensorSet missing = a->GetState().value();
  missing.pop_back();
  auto refused = CreateModelWithState(config, device_.get(), missing);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  config.name = "mlp";
  EXPECT_EQ(CreateModelWithState(config, device_.get(), a->GetState().value()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateModelWithState(config, nullptr, a->GetState().value()).status().code(), StatusCode::kInvalidArgument);
}

// The whole model's flat gradient against central differences of the loss, on a few
// coordinates of every parameter tensor.
void ExpectModelGradientMatches(Device& device, Model& model, int batch) {
  const int64_t sample = model.input_shape().size();
  std::mt19937 engine(3);
  std::uniform_real_distribution<float> pixel(-1.0f, 1.0f);
  std::vector<float> images(batch * sample);
  for (float& v : images) v = pixel(engine);
  std::vector<int32_t> labels(batch);
  for (int i = 0; i < batch; ++i) labels[i] = i % model.classes();
  auto input = device.Allocate(images.size() * sizeof(float));
  auto targets = device.Allocate(labels.size() * sizeof(int32_t));
  auto loss = device.Allocate(sizeof(float));
  ASSERT_TRUE(device.CopyHostToDevice(images.data(), *input, 0, images.size() * sizeof(float)).ok());
  ASSERT_TRUE(device.CopyHostToDevice(labels.data(), *targets, 0, labels.size() * sizeof(int32_t)).ok());
  auto evaluate = [&]() {
    EXPECT_TRUE(model.Forward(input->f32(), batch).ok());
    device.SoftmaxCrossEntropy(batch, model.classes(), model.logits_buffer().f32(), targets->i32(), loss->f32(),
                               nullptr);
    float value = 0;
    EXPECT_TRUE(device.CopyDeviceToHost(*loss, 0, &value, sizeof(float)).ok());
    return static_cast<double>(value);
  };
  ASSERT_TRUE(model.Forward(input->f32(), batch).ok());
  ASSERT_TRUE(model.Backward(targets->i32(), loss->f32()).ok());
  std::vector<float> gradients(model.NumParameters());
  ASSERT_TRUE(device.CopyDeviceToHost(model.flat_gradients(), 0, gradients.data(), gradients.size() * 4).ok());
  std::vector<float> parameters(model.NumParameters());
  ASSERT_TRUE(device.CopyDeviceToHost(model.flat_parameters(), 0, parameters.data(), parameters.size() * 4).ok());
  const float epsilon = 2e-3f;
  const double centre = evaluate();
  int checked = 0;
  for (const ParameterView& view : model.parameter_views()) {
    for (int64_t j = 0; j < view.count; j += std::max<int64_t>(1, view.count / 5)) {
      const int64_t at = view.offset + j;
      const float saved = parameters[at];
      auto set = [&](float value) {
        ASSERT_TRUE(device.CopyHostToDevice(&value, model.flat_parameters(), at * sizeof(float), sizeof(float)).ok());
      };
      set(saved + epsilon);
      const double plus = evaluate();
      set(saved - epsilon);
      const double minus = evaluate();
      set(saved);
      // A ReLU kink inside [saved - epsilon, saved + epsilon] makes the one-sided slopes differ;
      // central differences mean nothing there.
      const double right = (plus - centre) / epsilon, left = (centre - minus) / epsilon;
      if (std::fabs(right - left) > 1e-2 * std::max(1.0, std::fabs(right)) + 2e-3) continue;
      ++checked;
      const double numeric = (plus - minus) / (2 * epsilon);
      EXPECT_NEAR(gradients[at], numeric, 1e-3 + 2e-2 * std::fabs(numeric)) << view.name << "[" << j << "]";
    }
  }
  EXPECT_GT(checked, static_cast<int>(model.parameter_views().size()) * 3);
}

// A batch whose buffers do not fit the device fails, and leaves nothing half-reserved: the
// smaller batch after it reserves every buffer again and computes what it did before.
TEST_F(ModelTest, ABatchThatDoesNotFitLeavesTheModelUsableAtASmallerOne) {
  DeviceProfile profile = *FindBuiltinProfile("generic");
  profile.memory_bytes = 8 << 20;
  auto device = CreateEmulatedDevice(profile);
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  ModelConfig config;
  config.name = "mlp";
  config.hidden = {64, 64};
  auto created = CreateModel(config, device->get());
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Model& model = **created;
  const int batch = 4;
  std::vector<float> images(batch * model.input_shape().size(), 0.25f);
  auto input = (*device)->Allocate(images.size() * sizeof(float));
  ASSERT_TRUE(input.ok());
  ASSERT_TRUE((*device)->CopyHostToDevice(images.data(), *input, 0, images.size() * sizeof(float)).ok());
  auto logits = [&] {
    std::vector<float> host(batch * model.classes());
    EXPECT_TRUE((*device)->CopyDeviceToHost(model.logits_buffer(), 0, host.data(), host.size() * 4).ok());
    return host;
  };
  ASSERT_TRUE(model.Forward(input->f32(), batch).ok());
  const auto before = logits();
  // 100,000 samples of the 64-wide layers' outputs and gradients are far past 8 MiB; the
  // first layers' buffers are released and replaced before an allocation fails.
  auto refused = model.Forward(input->f32(), 100000);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();
  ASSERT_TRUE(model.Forward(input->f32(), batch).ok());
  EXPECT_EQ(logits(), before);
}

TEST_F(ModelTest, SimpleCnnGradientsMatchFiniteDifferences) {
  auto model = Make("simplecnn", 9);
  ExpectModelGradientMatches(*device_, *model, 3);
}

TEST_F(ModelTest, McMahanCnnHasThePapersLayoutAnd1663370Parameters) {
  auto model = Make("mcmahan-cnn");
  EXPECT_EQ(model->NumParameters(), 1663370);
  TensorSet state = model->GetState().value();
  std::vector<std::string> names;
  for (const auto& tensor : state) names.push_back(tensor.name);
  EXPECT_EQ(names, (std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight",
                                             "fc1.bias", "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(state[0].shape, (std::vector<int64_t>{32, 1, 5, 5}));
  EXPECT_EQ(state[2].shape, (std::vector<int64_t>{64, 32, 5, 5}));
  EXPECT_EQ(state[4].shape, (std::vector<int64_t>{512, 7 * 7 * 64}));  // padded convolutions keep 28 -> 14 -> 7
  EXPECT_EQ(state[6].shape, (std::vector<int64_t>{10, 512}));
  ModelConfig config;
  config.name = "mcmahan-cnn";
  EXPECT_EQ(*CountParameters(config), 1663370);
}

TEST_F(ModelTest, McMahanCnnGradientsMatchFiniteDifferences) {
  // The padded convolutions on small images, so that every border position is exercised.
  // With 512 ReLU units behind the convolutions, some seeds put two activation kinks inside
  // one +-epsilon step, which the one-sided slope test in ExpectModelGradientMatches cannot
  // see (seeds 5 and 8 do; 6 and 7 do not); the device kernels' padding is checked exactly
  // in tests/device/device_ops_test.cc.
  ModelConfig config;
  config.name = "mcmahan-cnn";
  config.rows = config.cols = 8;
  config.seed = 7;
  auto model = CreateModel(config, device_.get());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ExpectModelGradientMatches(*device_, **model, 2);
}

TEST_F(ModelTest, MlpGradientsMatchFiniteDifferences) {
  ModelConfig config;
  config.name = "mlp";
  config.hidden = {16, 8};
  config.rows = config.cols = 6;
  auto model = CreateModel(config, device_.get());
  ASSERT_TRUE(model.ok());
  ExpectModelGradientMatches(*device_, **model, 4);
}

}  // namespace
}  // namespace tessera
