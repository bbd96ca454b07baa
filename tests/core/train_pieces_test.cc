// Training without a model-sized gradient buffer (Model::BackwardInPieces): TrainLocal steps
// each layer's parameters as the backward pass hands their gradients over, and must end on the
// same bits as the whole-gradient step it replaces (which a gradient hook still takes).
#include <gtest/gtest.h>

#include <random>

#include "core/model/model.h"
#include "core/train/trainer.h"
#include "device/cpu/factory.h"
#include "device/memory_pool.h"

namespace tessera {
namespace {

Dataset RandomImages(int64_t count, int channels, int size, int classes, uint32_t seed) {
  Dataset data;
  data.source = "random-images";
  data.count = count;
  data.channels = channels;
  data.rows = data.cols = size;
  data.num_classes = classes;
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  data.images.resize(static_cast<size_t>(count) * channels * size * size);
  for (float& value : data.images) value = pixel(engine);
  data.labels.resize(static_cast<size_t>(count));
  for (auto& label : data.labels) label = static_cast<uint8_t>(engine() % classes);
  return data;
}

// Passes the whole flat gradient through unchanged: TrainLocal then steps all of it at once.
class PassThroughHook : public GradientHook {
 public:
  Status OnGradients(Device&, DeviceBuffer&, int64_t, int64_t) override { return Status::Ok(); }
};

struct Case {
  const char* label;
  ModelConfig config;
};

LayerConfig Layer(const char* type, const char* name = "", int out = 0) {
  LayerConfig layer;
  layer.type = type;
  layer.name = name;
  layer.out = out;
  return layer;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  ModelConfig mlp;  // 784 x 1400 weights: above LinearLayer::kPieceAboveValues, cut in rows
  mlp.name = "mlp";
  mlp.hidden = {1400};
  mlp.seed = 3;
  cases.push_back({"mlp 784-1400-10", mlp});
  ModelConfig cnn;
  cnn.name = "simplecnn";
  cnn.seed = 4;
  cases.push_back({"simplecnn", cnn});
  // Residual, batch norm (running statistics after the trained parameters), grouped
  // convolution, layer norm: every other layer's gradients handed over at once.
  ModelConfig declared;
  declared.name = "declared";
  declared.channels = 2;
  declared.rows = declared.cols = 8;
  declared.classes = 3;
  declared.seed = 5;
  LayerConfig stem = Layer("conv2d", "stem", 4);
  stem.kernel = 3;
  stem.padding = 1;
  LayerConfig grouped = stem;
  grouped.name = "grouped";
  grouped.groups = 2;
  LayerConfig block = Layer("residual", "block");
  LayerConfig inner = stem;
  inner.name = "conv1";
  block.body = {inner, Layer("batch_norm", "bn1"), Layer("relu")};
  declared.layers = {stem, Layer("batch_norm", "bn"), Layer("tanh"), grouped, block, Layer("flatten"),
                     Layer("linear", "fc1", 6), Layer("layer_norm", "ln"), Layer("relu"), Layer("linear", "fc2")};
  cases.push_back({"declared", declared});
  return cases;
}

// One BLAS thread: more split a large layer's whole product across threads, which changes the
// last bits of its gradient by itself (LinearLayer::BackwardInPieces).
std::unique_ptr<Device> OneThreadDevice() {
  CpuDeviceOptions one_thread;
  one_thread.num_threads = 1;
  return CreateCpuDevice(one_thread);
}

// `count` random samples in the shape `config`'s model takes.
Dataset DataFor(const ModelConfig& config, int64_t count, uint32_t seed) {
  const ActivationShape input = InputShape(config);
  return RandomImages(count, input.channels, input.height, config.classes, seed);
}

std::vector<int64_t> AllIndices(const Dataset& data) {
  std::vector<int64_t> indices(static_cast<size_t>(data.count));
  for (int64_t i = 0; i < data.count; ++i) indices[static_cast<size_t>(i)] = i;
  return indices;
}

TensorSet Train(const ModelConfig& config, Device* device, const Dataset& data, TrainOptions options,
                bool whole, const std::vector<float>* server = nullptr, const std::vector<float>* client = nullptr) {
  auto model = CreateModel(config, device);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return {};
  PassThroughHook hook;
  if (whole) options.gradient_hook = &hook;
  options.server_control = server;
  options.client_control = client;
  auto report = TrainLocal(**model, data, AllIndices(data), options);
  EXPECT_TRUE(report.ok()) << report.status().ToString();
  // Without a hook the flat gradients were given up for the velocity.
  EXPECT_EQ((*model)->flat_gradients().empty(), !whole);
  return (*model)->GetState().value();
}

TEST(TrainInPiecesTest, EndsOnTheBitsOfTheWholeGradientStep) {
  auto device = OneThreadDevice();
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.label);
    const Dataset data = DataFor(c.config, 40, 7);
    TrainOptions options;
    options.epochs = 2;
    options.batch_size = 16;  // two full batches and one of 8 per epoch
    options.learning_rate = 0.05f;
    options.momentum = 0.9f;
    options.weight_decay = 1e-4f;
    options.seed = 11;
    const TensorSet pieces = Train(c.config, device.get(), data, options, false);
    const TensorSet whole = Train(c.config, device.get(), data, options, true);
    ASSERT_FALSE(pieces.empty());
    EXPECT_EQ(TensorSetSha256(pieces), TensorSetSha256(whole));
    // The steps moved the weights: the comparison is not of two untouched initialisations.
    auto fresh = CreateModel(c.config, device.get());
    ASSERT_TRUE(fresh.ok());
    EXPECT_NE(TensorSetSha256(pieces), TensorSetSha256((*fresh)->GetState().value()));

    // FedProx's proximal term and SCAFFOLD's correction ride on every piece alike.
    options.proximal_mu = 0.01f;
    const int64_t parameters = (*fresh)->NumParameters();
    std::vector<float> server(static_cast<size_t>(parameters)), client(static_cast<size_t>(parameters));
    std::mt19937 engine(13);
    std::normal_distribution<float> variate(0.0f, 0.01f);
    for (float& v : server) v = variate(engine);
    for (float& v : client) v = variate(engine);
    EXPECT_EQ(TensorSetSha256(Train(c.config, device.get(), data, options, false, &server, &client)),
              TensorSetSha256(Train(c.config, device.get(), data, options, true, &server, &client)));
  }
}

// A model that trained in pieces (its gradients released, its layers pointed at scratch) and
// then trains with a hook gets its flat gradients back, zeroed and bound: the same bits as a
// model that always stepped the whole gradient.
TEST(TrainInPiecesTest, AModelGoesBackToWholeGradientsWhenAHookNeedsThem) {
  auto device = OneThreadDevice();
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.label);
    const Dataset data = DataFor(c.config, 24, 17);
    const std::vector<int64_t> indices = AllIndices(data);
    TrainOptions options;
    options.batch_size = 8;
    options.learning_rate = 0.05f;
    options.seed = 3;
    PassThroughHook hook;
    TrainOptions hooked = options;
    hooked.gradient_hook = &hook;
    auto mixed = std::move(CreateModel(c.config, device.get())).value();
    auto whole = std::move(CreateModel(c.config, device.get())).value();
    ASSERT_TRUE(TrainLocal(*mixed, data, indices, options).ok());
    EXPECT_TRUE(mixed->flat_gradients().empty());
    ASSERT_TRUE(TrainLocal(*mixed, data, indices, hooked).ok());
    EXPECT_FALSE(mixed->flat_gradients().empty());
    ASSERT_TRUE(TrainLocal(*whole, data, indices, hooked).ok());
    ASSERT_TRUE(TrainLocal(*whole, data, indices, hooked).ok());
    EXPECT_EQ(TensorSetSha256(mixed->GetState().value()), TensorSetSha256(whole->GetState().value()));
  }
}

TEST(TrainInPiecesTest, OnlyLargeFullyConnectedLayersCutTheirOwnPieces) {
  LinearLayer large("fc1", {1, 28, 28}, 1400);
  EXPECT_GT(large.PieceScratch(64), 0);
  // Whole rows of 784 weights, about kPieceValues a piece in multiples of 96 rows (96), and
  // the piece's columns of dy.
  EXPECT_EQ(large.PieceScratch(64), 96 * 784 + 64 * 96);
  EXPECT_LT(large.PieceScratch(64), 1400 * 784 / 4);
  LinearLayer small("fc2", {1400, 1, 1}, 10);
  EXPECT_EQ(small.PieceScratch(64), 0);
  // Large, but one piece would hold it all: handed over at once.
  LinearLayer wide("wide", {1, 1, 1 << 20}, 2);
  EXPECT_EQ(wide.PieceScratch(64), 0);
}

// The memory the pieces save: without a hook the velocity takes the gradients' pooled block,
// so training holds one model-sized buffer fewer on the device.
TEST(TrainInPiecesTest, HoldsOneModelSizedBufferFewer) {
  ModelConfig mlp;
  mlp.name = "mlp";
  mlp.hidden = {1400};
  const Dataset data = RandomImages(16, 1, 28, 10, 9);
  TrainOptions options;
  options.batch_size = 16;
  uint64_t held[2] = {0, 0};
  for (bool whole : {false, true}) {
    auto device = CreateCpuDevice();
    auto model = std::move(CreateModel(mlp, device.get())).value();
    PassThroughHook hook;
    if (whole) options.gradient_hook = &hook;
    ASSERT_TRUE(TrainLocal(*model, data, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, options).ok());
    held[whole ? 1 : 0] = device->pool_stats().bytes_from_driver;
  }
  // Whole: parameters, gradients and velocity. In pieces: parameters, the velocity in the
  // gradients' block, and the scratch of the largest piece. The activations are alike.
  const size_t model_bytes = (784 * 1400 + 1400 + 1400 * 10 + 10) * sizeof(float);
  const size_t scratch_bytes = LinearLayer("fc1", {1, 28, 28}, 1400).PieceScratch(16) * sizeof(float);
  EXPECT_EQ(held[1] - held[0], MemoryPool::SizeClass(model_bytes) - MemoryPool::SizeClass(scratch_bytes))
      << "in pieces " << held[0] << " bytes, whole " << held[1];
  EXPECT_GT(model_bytes, 3 * scratch_bytes);
}

}  // namespace
}  // namespace tessera
