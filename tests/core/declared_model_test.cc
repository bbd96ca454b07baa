// Declared layer graphs (core/model/model.h, LayerConfig): shapes and names, the resnet8
// preset's size, errors that name the layer, training versus inference, and every layer's
// gradient against central differences of the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/model/model.h"
#include "core/train/trainer.h"
#include "device/cpu/factory.h"
#include "device/emulated/factory.h"
#include "device/emulated/profile.h"

namespace tessera {
namespace {

LayerConfig L(std::string type, std::string name = "", int out = 0) {
  LayerConfig layer;
  layer.type = std::move(type);
  layer.name = std::move(name);
  layer.out = out;
  return layer;
}

LayerConfig Conv(std::string name, int out, int kernel, int stride = 1, int padding = 0, bool bias = true) {
  LayerConfig layer = L("conv2d", std::move(name), out);
  layer.kernel = kernel;
  layer.stride = stride;
  layer.padding = padding;
  layer.bias = bias;
  return layer;
}

ModelConfig Declared(std::vector<LayerConfig> layers, int channels = 1, int size = 8, int classes = 3) {
  ModelConfig config;
  config.name = "declared";
  config.layers = std::move(layers);
  config.channels = channels;
  config.rows = config.cols = size;
  config.classes = classes;
  config.seed = 5;
  return config;
}

std::vector<std::string> Names(const Model& model) {
  std::vector<std::string> names;
  for (const ParameterView& view : model.parameter_views()) names.push_back(view.name);
  return names;
}

class DeclaredModelTest : public ::testing::Test {
 protected:
  std::unique_ptr<Model> Build(const ModelConfig& config) {
    auto model = CreateModel(config, device_.get());
    EXPECT_TRUE(model.ok()) << model.status().ToString();
    return model.ok() ? std::move(model).value() : nullptr;
  }
  std::string ErrorOf(const ModelConfig& config) {
    auto model = CreateModel(config, device_.get());
    EXPECT_FALSE(model.ok());
    auto counted = CountParameters(config);
    EXPECT_FALSE(counted.ok()) << "CountParameters refuses what CreateModel refuses";
    return model.ok() ? "" : model.status().message();
  }
  std::unique_ptr<Device> device_ = CreateCpuDevice();
};

TEST_F(DeclaredModelTest, NamesFollowPyTorchAndBuffersComeAfterTheTrainedParameters) {
  LayerConfig block = L("residual", "block");
  block.body = {Conv("conv1", 4, 3, 1, 1, false), L("batch_norm", "bn1"), L("relu"), Conv("", 4, 3, 1, 1)};
  auto model = Build(Declared({Conv("stem", 4, 3, 1, 1), L("batch_norm"), L("relu"), block, L("global_avg_pool"),
                               L("linear")}));
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(Names(*model),
            (std::vector<std::string>{"stem.weight", "stem.bias", "layers.1.weight", "layers.1.bias",
                                      "block.conv1.weight", "block.bn1.weight", "block.bn1.bias",
                                      "block.body.3.weight", "block.body.3.bias", "layers.5.weight", "layers.5.bias",
                                      "layers.1.running_mean", "layers.1.running_var", "block.bn1.running_mean",
                                      "block.bn1.running_var"}));
  const int64_t trained = 4 * 9 + 4 + 8 + 4 * 4 * 9 + 8 + 4 * 4 * 9 + 4 + 3 * 4 + 3;
  EXPECT_EQ(model->NumTrainable(), trained);
  EXPECT_EQ(model->NumParameters(), trained + 16);
  auto counted = CountParameters(Declared({Conv("stem", 4, 3, 1, 1), L("batch_norm"), L("relu"), block,
                                           L("global_avg_pool"), L("linear")}));
  ASSERT_TRUE(counted.ok()) << counted.status().ToString();
  EXPECT_EQ(*counted, model->NumParameters());
  // PyTorch's initial values: norms' weights 1, shifts 0, running means 0, variances 1.
  const TensorSet state = model->GetState().value();
  for (const NamedTensor& t : state) {
    const bool ones = t.name == "layers.1.weight" || t.name == "block.bn1.weight" || t.name.ends_with("running_var");
    const bool zeros = t.name == "layers.1.bias" || t.name == "block.bn1.bias" || t.name.ends_with("running_mean");
    for (float v : t.values) {
      if (ones) {
        EXPECT_EQ(v, 1.0f) << t.name;
      }
      if (zeros) {
        EXPECT_EQ(v, 0.0f) << t.name;
      }
    }
  }
}

TEST_F(DeclaredModelTest, ResNet8HasTheHandCountedSize) {
  ModelConfig config;
  config.name = "resnet8";
  config.channels = 3;
  config.rows = config.cols = 32;
  auto model = Build(config);
  ASSERT_NE(model, nullptr);
  // stem 432 + bn 32; stage 1: 2 x (2,304 + 32); stage 2: 4,608 + 64 + 9,216 + 64 + shortcut 512 + 64;
  // stage 3: 18,432 + 128 + 36,864 + 128 + shortcut 2,048 + 128; fc 650.
  EXPECT_EQ(model->NumTrainable(), 464 + 4672 + 14528 + 57728 + 650);
  EXPECT_EQ(model->NumParameters(), 78042 + 2 * (16 + 16 + 16 + 32 + 32 + 32 + 64 + 64 + 64));
  const auto names = Names(*model);
  EXPECT_EQ(names.front(), "conv1.weight");
  EXPECT_NE(std::find(names.begin(), names.end(), "layer2.shortcut.0.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "layer3.bn2.running_var"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "layer1.shortcut.0.weight"), names.end()) << "stage 1 is the identity";
  EXPECT_EQ(model->classes(), 10);
  auto counted = CountParameters(config);
  ASSERT_TRUE(counted.ok());
  EXPECT_EQ(*counted, model->NumParameters());
}

TEST_F(DeclaredModelTest, ErrorsNameTheLayerAndWhatWasExpected) {
  EXPECT_NE(ErrorOf(Declared({L("convolution")})).find("model.layers[0] (convolution): unknown layer type"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Declared({L("relu"), Conv("c", 4, 9), L("linear")})).find("model.layers[1] (conv2d): kernel 9"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Declared({Conv("c", 0, 3), L("linear")})).find("model.layers[0] (conv2d): out must be in [1"),
            std::string::npos);
  LayerConfig grouped = Conv("g", 4, 3);
  grouped.groups = 2;
  EXPECT_NE(ErrorOf(Declared({grouped, L("linear")})).find("model.layers[0] (conv2d): groups 2 must divide its 1 input"),
            std::string::npos);
  LayerConfig mismatched = L("residual", "r");
  mismatched.body = {Conv("c", 8, 3, 1, 1)};
  EXPECT_NE(ErrorOf(Declared({mismatched, L("linear")})).find("model.layers[0] (residual): its body ends at 8x8x8"),
            std::string::npos);
  LayerConfig nested = L("residual", "outer");
  LayerConfig inner = L("residual", "inner");
  inner.body = {L("relu")};
  nested.body = {inner};
  EXPECT_NE(ErrorOf(Declared({nested, L("linear")})).find("model.layers[0] (residual).body[0] (residual)"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Declared({L("flatten"), L("linear", "", 5)})).find("the data has 3 classes"), std::string::npos);
  EXPECT_NE(ErrorOf(Declared({L("linear", "fc", 4), L("linear", "fc")})).find("name 'fc' is used twice"),
            std::string::npos);
  LayerConfig dropout = L("dropout");
  dropout.probability = 1.0f;
  EXPECT_NE(ErrorOf(Declared({dropout, L("linear")})).find("probability must be in [0, 1)"), std::string::npos);
  LayerConfig pool = L("max_pool");
  pool.window = 9;
  EXPECT_NE(ErrorOf(Declared({pool, L("linear")})).find("window 9 is larger than its 1x8x8 input"), std::string::npos);
  std::vector<LayerConfig> many(kMaxDeclaredLayers + 1, L("relu"));
  EXPECT_NE(ErrorOf(Declared(many)).find("at most 256 layers"), std::string::npos);
  // Settings a type has no use for were ignored (but for these two on linear and layer_norm):
  // a job sent over the wire with a "local" convolution trained it global.
  LayerConfig local_conv = Conv("c", 4, 3);
  local_conv.local = true;
  EXPECT_NE(ErrorOf(Declared({local_conv, L("linear")})).find("model.layers[0] (conv2d): local applies to batch_norm"),
            std::string::npos);
  LayerConfig local_norm = L("layer_norm");
  local_norm.local = true;
  EXPECT_NE(ErrorOf(Declared({local_norm, L("linear")})).find("model.layers[0] (layer_norm): local applies to"),
            std::string::npos);
  LayerConfig unbiased_relu = L("relu"), unbiased_linear = L("linear");
  unbiased_relu.bias = unbiased_linear.bias = false;
  EXPECT_NE(ErrorOf(Declared({unbiased_relu, L("linear")})).find("model.layers[0] (relu): bias = false applies to"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Declared({unbiased_linear})).find("model.layers[0] (linear): bias = false applies to conv2d"),
            std::string::npos);
  LayerConfig bad_name = L("linear", "fc\n1");
  EXPECT_NE(ErrorOf(Declared({bad_name})).find("name must be at most 64 letters"), std::string::npos);
  EXPECT_NE(ErrorOf(Declared({L("softmax_cross_entropy"), L("linear")})).find("the loss may only be the model's last"),
            std::string::npos);
  // As the last entry it names the loss the model ends in, and adds nothing.
  auto with_loss = Build(Declared({L("flatten"), L("linear"), L("softmax_cross_entropy")}));
  ASSERT_NE(with_loss, nullptr);
  EXPECT_EQ(with_loss->DescribeLayers(1).size(), 2u);
  // Every other setting on a type with no use for it is refused likewise, naming it.
  LayerConfig kernel_linear = L("linear");
  kernel_linear.kernel = 3;
  EXPECT_NE(ErrorOf(Declared({L("flatten"), kernel_linear})).find("model.layers[1] (linear): kernel applies to conv2d only"),
            std::string::npos);
  LayerConfig window_conv = Conv("c", 4, 3);
  window_conv.window = 2;
  EXPECT_NE(ErrorOf(Declared({window_conv, L("linear")}))
                .find("model.layers[0] (conv2d): window applies to max_pool, avg_pool only"),
            std::string::npos);
  LayerConfig body_relu = L("relu");
  body_relu.body = {L("relu")};
  EXPECT_NE(ErrorOf(Declared({body_relu, L("linear")})).find("model.layers[0] (relu): body applies to residual only"),
            std::string::npos);
  LayerConfig momentum_norm = L("layer_norm");
  momentum_norm.momentum = 0.2f;
  EXPECT_NE(ErrorOf(Declared({momentum_norm, L("linear")})).find("momentum applies to batch_norm only"),
            std::string::npos);
}

// A kernel near the size of its padded input keeps the output within its bound while the
// input the convolution unfolds for each sample (16,000,000 rows by 16,507,969 positions) is
// beyond any memory: refused when the model is declared, not when a step allocates it.
TEST_F(DeclaredModelTest, AConvolutionWhoseUnfoldedInputIsTooLargeIsRefused) {
  const std::string error =
      ErrorOf(Declared({Conv("wide", 1, 4000, 1, 3999), L("global_avg_pool"), L("linear")}, 1, 64));
  EXPECT_NE(error.find("model.layers[0] (conv2d): its input unfolded for one sample (16000000 rows"), std::string::npos)
      << error;
  // Each group unfolds its own channels only: 1,024 channels at 128x128 under a padded 5x5
  // kernel unfold to 1,024 x 25 x 16,384 values, over the bound; in four groups to a quarter.
  LayerConfig grouped = Conv("g", 4, 5, 1, 2);
  EXPECT_NE(ErrorOf(Declared({grouped, L("global_avg_pool"), L("linear")}, 1024, 128)).find("(25600 rows"),
            std::string::npos);
  grouped.groups = 4;
  EXPECT_TRUE(CountParameters(Declared({grouped, L("global_avg_pool"), L("linear")}, 1024, 128)).ok());
  // The resnet8 preset at the largest images its output bound allows stays within it.
  ModelConfig resnet;
  resnet.name = "resnet8";
  resnet.channels = 3;
  resnet.rows = resnet.cols = 1024;
  EXPECT_TRUE(CountParameters(resnet).ok());
}

// An input's values per sample were multiplied in int64 unchecked: 65536 x 2^24 x 2^24 wrapped
// to 0, passed every layer's bound, and declared a linear layer of no inputs. The input is
// bounded as every layer's output is.
TEST_F(DeclaredModelTest, AnInputOfMoreValuesThanALayerMayGiveIsRefused) {
  auto counted = CountParameters(Declared({L("relu"), L("linear")}, 65536, 1 << 24));
  ASSERT_FALSE(counted.ok());
  EXPECT_EQ(counted.status().message(),
            "model 'declared': an input of 65536x16777216x16777216 exceeds 16777216 values per sample");
  counted = CountParameters(Declared({L("relu"), L("linear")}, 5, 2048));
  ASSERT_FALSE(counted.ok());
  EXPECT_NE(counted.status().message().find("an input of 5x2048x2048 exceeds"), std::string::npos);
  EXPECT_TRUE(CountParameters(Declared({L("global_avg_pool"), L("linear")}, 1, 4096)).ok());
}

// A global average pool is one Gemm of batch x channels rows, which the Gemm takes as an int:
// 8192 samples of 262,144 channels (a flattened 512x512 image) made 2^31 rows, which wrapped
// negative, and the CPU device's Gemm did nothing, leaving the output unwritten. The pool now
// runs as several Gemms of whole samples where the rows pass INT_MAX.
TEST_F(DeclaredModelTest, AGlobalAveragePoolOfMoreRowsThanAnIntSplitsItsGemm) {
  const ModelConfig config = Declared({L("flatten"), L("global_avg_pool"), Conv("c", 3, 1)}, 1, 512);
  auto model = Build(config);
  ASSERT_NE(model, nullptr);
  const int batch = 8192;
  const std::vector<LayerInfo> layers = model->DescribeLayers(batch);
  ASSERT_EQ(layers[1].kind, "global_avg_pool");
  double forward_flops = 0, backward_flops = 0;
  int forward_gemms = 0;
  for (const LayerOp& op : layers[1].ops) {
    EXPECT_EQ(op.op, Op::kGemm);
    EXPECT_GT(op.cost.flops, 0);
    (op.backward ? backward_flops : forward_flops) += op.cost.flops;
    forward_gemms += op.backward ? 0 : 1;
  }
  EXPECT_EQ(forward_gemms, 2);  // 8191 samples of 262,144 rows fit an int, then the last one
  EXPECT_EQ(forward_flops, 2.0 * batch * 512 * 512);
  EXPECT_EQ(backward_flops, 2.0 * batch * 512 * 512);
  // A batch within the bound stays one Gemm each way.
  EXPECT_EQ(model->DescribeLayers(64)[1].ops.size(), 2u);
}

// Inputs and labels for `batch` samples of the config's shape.
struct Batch {
  DeviceBuffer images, labels, loss;
};

Batch MakeBatch(Device& device, const ModelConfig& config, int batch, uint32_t seed) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal;
  std::vector<float> images(static_cast<size_t>(batch) * config.channels * config.rows * config.cols);
  for (float& v : images) v = normal(engine);
  std::vector<int32_t> labels(batch);
  for (int i = 0; i < batch; ++i) labels[i] = static_cast<int32_t>(engine() % config.classes);
  Batch b;
  b.images = device.Allocate(images.size() * sizeof(float)).value();
  b.labels = device.Allocate(labels.size() * sizeof(int32_t)).value();
  b.loss = device.Allocate(sizeof(float)).value();
  EXPECT_TRUE(device.CopyHostToDevice(images.data(), b.images, 0, images.size() * sizeof(float)).ok());
  EXPECT_TRUE(device.CopyHostToDevice(labels.data(), b.labels, 0, labels.size() * sizeof(int32_t)).ok());
  return b;
}

float Loss(Model& model, Batch& b, int batch) {
  EXPECT_TRUE(model.Forward(b.images.f32(), batch).ok());
  EXPECT_TRUE(model.Backward(b.labels.i32(), b.loss.f32()).ok());
  float loss = 0;
  EXPECT_TRUE(model.device().CopyDeviceToHost(b.loss, 0, &loss, sizeof(float)).ok());
  return loss;
}

// Every declared layer type but dropout (whose mask changes each step; its own test is below),
// in one model: the analytic gradient of each trained parameter tensor, at a few positions,
// against central differences of the loss.
TEST_F(DeclaredModelTest, EveryLayersGradientMatchesCentralDifferences) {
  LayerConfig block = L("residual", "block");
  block.body = {Conv("conv1", 4, 3, 1, 1, false), L("batch_norm", "bn1"), L("gelu"), Conv("conv2", 4, 3, 2, 1)};
  LayerConfig avg = L("avg_pool");
  avg.window = 2;
  block.shortcut = {Conv("down", 4, 1, 2), L("batch_norm", "down_bn")};
  LayerConfig grouped = Conv("grouped", 4, 3, 1, 1);
  grouped.groups = 2;
  const ModelConfig config =
      Declared({Conv("stem", 4, 3, 1, 1), L("batch_norm", "bn"), L("tanh"), grouped, block, L("sigmoid"), avg,
                L("flatten"), L("linear", "fc1", 6), L("layer_norm", "ln"), L("relu"), L("linear", "fc2")},
               2, 8, 3);
  auto model = Build(config);
  ASSERT_NE(model, nullptr);
  const int batch = 5;
  Batch b = MakeBatch(*device_, config, batch, 11);
  Loss(*model, b, batch);
  std::vector<float> gradients(model->NumParameters()), parameters(model->NumParameters());
  ASSERT_TRUE(device_->CopyDeviceToHost(model->flat_gradients(), 0, gradients.data(), gradients.size() * 4).ok());
  ASSERT_TRUE(device_->CopyDeviceToHost(model->flat_parameters(), 0, parameters.data(), parameters.size() * 4).ok());
  int checked = 0;
  for (const ParameterView& view : model->parameter_views()) {
    if (!view.trainable) {
      for (int64_t j = 0; j < view.count; ++j) EXPECT_EQ(gradients[view.offset + j], 0.0f) << view.name;
      continue;
    }
    for (int64_t j : {int64_t(0), view.count / 2, view.count - 1}) {
      const int64_t at = view.offset + j;
      // Small enough that no ReLU kink is crossed at these seeded inputs, large enough for
      // float32's loss to resolve.
      const float h = 2e-4f, original = parameters[at];
      auto loss_at = [&](float value) {
        ASSERT_TRUE(device_->CopyHostToDevice(&value, model->flat_parameters(), at * sizeof(float), sizeof(float)).ok());
      };
      loss_at(original + h);
      const double plus = Loss(*model, b, batch);
      loss_at(original - h);
      const double minus = Loss(*model, b, batch);
      loss_at(original);
      const double numeric = (plus - minus) / (2.0 * h);
      EXPECT_NEAR(gradients[at], numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << view.name << "[" << j << "]";
      ++checked;
    }
  }
  EXPECT_GE(checked, 3 * 16);
}

// A grouped convolution's output, against the definition computed here: group g's outputs sum
// over group g's inputs only.
TEST_F(DeclaredModelTest, AGroupedConvolutionSeesOnlyItsGroupsChannels) {
  LayerConfig grouped = Conv("g", 6, 3, 1, 1);
  grouped.groups = 3;
  const ModelConfig config = Declared({grouped, L("flatten"), L("linear")}, 3, 5, 3);
  auto model = Build(config);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->parameter_views()[0].shape, (std::vector<int64_t>{6, 1, 3, 3}));
  const int batch = 2;
  Batch b = MakeBatch(*device_, config, batch, 21);
  std::vector<std::vector<float>> outputs;
  ASSERT_TRUE(model->ForwardCapture(b.images.f32(), batch, &outputs).ok());
  std::vector<float> x(batch * 3 * 25), parameters(model->NumParameters());
  ASSERT_TRUE(device_->CopyDeviceToHost(b.images, 0, x.data(), x.size() * 4).ok());
  ASSERT_TRUE(device_->CopyDeviceToHost(model->flat_parameters(), 0, parameters.data(), parameters.size() * 4).ok());
  const float* w = parameters.data();
  const float* bias = w + 6 * 9;
  for (int n = 0; n < batch; ++n) {
    for (int o = 0; o < 6; ++o) {
      const int c = o / 2;  // 3 groups of 1 input and 2 outputs
      for (int i = 0; i < 5; ++i) {
        for (int j = 0; j < 5; ++j) {
          double sum = bias[o];
          for (int di = 0; di < 3; ++di) {
            for (int dj = 0; dj < 3; ++dj) {
              const int r = i + di - 1, q = j + dj - 1;
              if (r < 0 || r >= 5 || q < 0 || q >= 5) continue;
              sum += double(w[o * 9 + di * 3 + dj]) * x[((n * 3 + c) * 5 + r) * 5 + q];
            }
          }
          EXPECT_NEAR(outputs[0][((n * 6 + o) * 5 + i) * 5 + j], sum, 1e-5) << n << " " << o << " " << i << " " << j;
        }
      }
    }
  }
}

TEST_F(DeclaredModelTest, InferenceUsesRunningStatisticsAndSkipsDropout) {
  LayerConfig dropout = L("dropout");
  dropout.probability = 0.5f;
  const ModelConfig config = Declared({Conv("c", 3, 3), L("batch_norm", "bn"), L("flatten"), dropout, L("linear")});
  auto model = Build(config);
  ASSERT_NE(model, nullptr);
  const int batch = 6;
  Batch b = MakeBatch(*device_, config, batch, 3);
  const int classes = config.classes;
  auto logits = [&] {
    EXPECT_TRUE(model->Forward(b.images.f32(), batch).ok());
    std::vector<float> host(batch * classes);
    EXPECT_TRUE(device_->CopyDeviceToHost(model->logits_buffer(), 0, host.data(), host.size() * 4).ok());
    return host;
  };
  // Training: each step draws a new dropout mask, so two forwards differ; the running
  // statistics move away from (0, 1).
  const auto first = logits(), second = logits();
  EXPECT_NE(first, second);
  const TensorSet state = model->GetState().value();
  const NamedTensor& running_var = state.back();
  ASSERT_EQ(running_var.name, "bn.running_var");
  EXPECT_NE(running_var.values[0], 1.0f);
  // Inference: no dropout and fixed statistics, so the same input gives the same logits, and
  // the running statistics stay put.
  model->SetTraining(false);
  const auto a = logits(), again = logits();
  EXPECT_EQ(a, again);
  EXPECT_EQ(model->GetState().value().back().values, running_var.values);
  EXPECT_NE(a, first);
}

// A worker builds each round's model with a seed of the round and the party
// (wire::ToTrainingModelConfig): the masks follow the model's seed, so parties and rounds do
// not drop the same units, while a rerun drops them again.
TEST_F(DeclaredModelTest, TheDropoutMasksFollowTheModelsSeed) {
  LayerConfig dropout = L("dropout");
  dropout.probability = 0.5f;
  ModelConfig config = Declared({L("flatten"), dropout, L("linear")});
  config.seed = 11;
  auto a = Build(config), rerun = Build(config);
  config.seed = 12;
  auto other = Build(config);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(rerun, nullptr);
  ASSERT_NE(other, nullptr);
  // The same weights in all three: only the masks can differ.
  ASSERT_TRUE(rerun->SetState(a->GetState().value()).ok());
  ASSERT_TRUE(other->SetState(a->GetState().value()).ok());
  const int batch = 4;
  Batch b = MakeBatch(*device_, config, batch, 3);
  auto logits = [&](Model& model) {
    EXPECT_TRUE(model.Forward(b.images.f32(), batch).ok());
    std::vector<float> host(batch * config.classes);
    EXPECT_TRUE(device_->CopyDeviceToHost(model.logits_buffer(), 0, host.data(), host.size() * 4).ok());
    return host;
  };
  const auto first = logits(*a);
  EXPECT_EQ(logits(*rerun), first);
  EXPECT_NE(logits(*other), first);
}

// As ModelTest.ABatchThatDoesNotFitLeavesTheModelUsableAtASmallerOne, inside a residual
// block: its paths' buffers released by a reservation that failed are reserved again.
TEST_F(DeclaredModelTest, AResidualBlockLeftHalfReservedByABatchThatDoesNotFitReservesAgain) {
  DeviceProfile profile = *FindBuiltinProfile("generic");
  profile.memory_bytes = 12 << 20;
  auto device = CreateEmulatedDevice(profile);
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  LayerConfig block = L("residual", "block");
  block.body = {Conv("conv1", 4, 3, 1, 1, false), L("relu")};
  const ModelConfig config = Declared({block, L("global_avg_pool"), L("linear")}, 4, 16);
  auto created = CreateModel(config, device->get());
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Model& model = **created;
  const int batch = 2;
  Batch b = MakeBatch(**device, config, batch, 3);
  auto logits = [&] {
    std::vector<float> host(batch * config.classes);
    EXPECT_TRUE((*device)->CopyDeviceToHost(model.logits_buffer(), 0, host.data(), host.size() * 4).ok());
    return host;
  };
  ASSERT_TRUE(model.Forward(b.images.f32(), batch).ok());
  const auto before = logits();
  // 1,024 samples of 4 x 16 x 16: 4 MiB a buffer. The model's own output and its gradient
  // fit; the block's first path buffer does not.
  auto refused = model.Forward(b.images.f32(), 1024);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();
  ASSERT_TRUE(model.Forward(b.images.f32(), batch).ok());
  EXPECT_EQ(logits(), before);
}

TEST_F(DeclaredModelTest, TrainingLowersTheLossAndLeavesBuffersToTheForwardPass) {
  LayerConfig block = L("residual", "block");
  block.body = {Conv("conv1", 4, 3, 1, 1, false), L("batch_norm", "bn1"), L("relu")};
  block.shortcut = {Conv("proj", 4, 1)};
  const ModelConfig config = Declared({block, L("global_avg_pool"), L("linear")}, 1, 6, 2);
  auto model = Build(config);
  ASSERT_NE(model, nullptr);
  // Two classes by the image's sign.
  Dataset data;
  data.count = 64;
  data.channels = 1;
  data.rows = data.cols = 6;
  data.num_classes = 2;
  std::mt19937 engine(2);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  for (int i = 0; i < data.count; ++i) {
    data.labels.push_back(static_cast<uint8_t>(i % 2));
    for (int p = 0; p < 36; ++p) data.images.push_back((i % 2 ? 1.0f : -1.0f) + noise(engine));
  }
  std::vector<int64_t> indices(data.count);
  for (int i = 0; i < data.count; ++i) indices[i] = i;
  TrainOptions options;
  options.batch_size = 8;
  options.learning_rate = 0.05f;
  options.momentum = 0.9f;
  options.weight_decay = 0.5f;  // large: it would pull buffers toward 0 if it reached them
  options.epochs = 1;
  auto first = TrainLocal(*model, data, indices, options);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  options.epochs = 5;
  auto later = TrainLocal(*model, data, indices, options);
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  EXPECT_LT(later->mean_loss, first->mean_loss);
  auto evaluated = Evaluate(*model, data, 16, 0);
  ASSERT_TRUE(evaluated.ok()) << evaluated.status().ToString();
  EXPECT_GT(evaluated->accuracy, 0.9);
  EXPECT_TRUE(model->training()) << "Evaluate restores the mode";
  // The running variance follows the batches' variance (about 0.25 + the class offset's
  // spread after the convolution), not weight decay's pull to 0.
  const TensorSet state = model->GetState().value();
  ASSERT_EQ(state.back().name, "block.bn1.running_var");
  for (float v : state.back().values) EXPECT_GT(v, 1e-3f);
}

TEST_F(DeclaredModelTest, DropoutDrawsDependOnTheSeedAndStep) {
  LayerConfig dropout = L("dropout");
  dropout.probability = 0.3f;
  ModelConfig config = Declared({L("flatten"), dropout, L("linear")});
  auto a = Build(config), b = Build(config);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Batch input = MakeBatch(*device_, config, 4, 9);
  auto run = [&](Model& model) {
    EXPECT_TRUE(model.Forward(input.images.f32(), 4).ok());
    std::vector<float> host(4 * 3);
    EXPECT_TRUE(device_->CopyDeviceToHost(model.logits_buffer(), 0, host.data(), host.size() * 4).ok());
    return host;
  };
  // Same seed, same step: the same units dropped.
  EXPECT_EQ(run(*a), run(*b));
  // The next step draws another mask; so does another seed at the same step.
  b = Build(config);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(run(*a), run(*b));
  config.seed = 6;
  auto c = Build(config), d = Build(Declared({L("flatten"), dropout, L("linear")}));
  ASSERT_NE(c, nullptr);
  ASSERT_NE(d, nullptr);
  ASSERT_TRUE(c->SetState(d->GetState().value()).ok());
  EXPECT_NE(run(*c), run(*d)) << "another seed draws another mask";
}

}  // namespace
}  // namespace tessera
