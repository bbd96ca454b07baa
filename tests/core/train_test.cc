#include "core/train/trainer.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "core/data/idx.h"
#include "device/cpu/factory.h"

namespace tessera {
namespace {

// Two well-separated classes of 8x8 images: bright top half or bright bottom half, plus noise.
Dataset SeparableDataset(int64_t count, uint32_t seed) {
  Dataset data;
  data.source = "synthetic-halves";
  data.count = count;
  data.rows = data.cols = 8;
  data.num_classes = 2;
  std::mt19937 engine(seed);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  data.images.resize(count * 64);
  data.labels.resize(count);
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t label = static_cast<uint8_t>(engine() % 2);
    data.labels[i] = label;
    for (int p = 0; p < 64; ++p) {
      const bool top = p < 32;
      data.images[i * 64 + p] = ((top == (label == 0)) ? 1.0f : -1.0f) + noise(engine);
    }
  }
  return data;
}

std::vector<int64_t> FirstIndices(int64_t count) {
  std::vector<int64_t> indices(count);
  std::iota(indices.begin(), indices.end(), 0);
  return indices;
}

std::unique_ptr<Model> SmallMlp(Device* device, uint64_t seed = 1) {
  ModelConfig config;
  config.name = "mlp";
  config.hidden = {32};
  config.rows = config.cols = 8;
  config.classes = 2;
  config.seed = seed;
  return std::move(CreateModel(config, device)).value();
}

class CountingHook : public GradientHook {
 public:
  Status OnGradients(Device& device, DeviceBuffer& flat_gradients, int64_t count, int64_t step) override {
    driver_allocations.push_back(device.pool_stats().driver_allocations);
    last_count = count;
    steps.push_back(step);
    return fail_at_step == step ? UnavailableError("peer left the cohort") : Status::Ok();
  }
  std::vector<uint64_t> driver_allocations;
  std::vector<int64_t> steps;
  int64_t last_count = 0;
  int64_t fail_at_step = -1;
};

TEST(TrainLocalTest, LearnsASeparableDatasetAndCountsPartialBatches) {
  auto device = CreateCpuDevice();
  auto model = SmallMlp(device.get());
  Dataset data = SeparableDataset(300, 1);
  auto before = Evaluate(*model, data);
  ASSERT_TRUE(before.ok());
  TrainOptions options;
  options.epochs = 3;
  options.batch_size = 64;
  auto report = TrainLocal(*model, data, FirstIndices(300), options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->samples, 900u);
  EXPECT_EQ(report->steps, 15u);  // 4 full batches and one of 44, three times
  auto after = Evaluate(*model, data);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->samples, 300u);
  EXPECT_LT(after->loss, before->loss);
  EXPECT_GT(after->accuracy, 0.95);
}

TEST(TrainLocalTest, PoolTakesNothingFromTheDriverAfterTheFirstStep) {
  auto device = CreateCpuDevice();
  ModelConfig config;
  config.name = "simplecnn";
  auto model = std::move(CreateModel(config, device.get())).value();
  Dataset data;
  data.source = "random";
  data.count = 64;
  data.rows = data.cols = 28;
  data.images.assign(64 * 784, 0.5f);
  data.labels.assign(64, 3);
  std::vector<int64_t> indices(100 * 16);
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int64_t>(i % 64);
  CountingHook hook;
  TrainOptions options;
  options.batch_size = 16;
  options.gradient_hook = &hook;
  ASSERT_TRUE(TrainLocal(*model, data, indices, options).ok());
  ASSERT_EQ(hook.driver_allocations.size(), 100u);
  EXPECT_EQ(hook.last_count, 44426);
  for (size_t step = 1; step < 100; ++step) EXPECT_EQ(hook.driver_allocations[step], hook.driver_allocations[0]);
  // A second round reuses the pooled blocks too.
  const uint64_t after_first_round = device->pool_stats().driver_allocations;
  ASSERT_TRUE(TrainLocal(*model, data, indices, options).ok());
  EXPECT_EQ(device->pool_stats().driver_allocations, after_first_round);
}

TEST(TrainLocalTest, SameSeedSameResult) {
  auto device = CreateCpuDevice();
  Dataset data = SeparableDataset(100, 2);
  TrainOptions options;
  options.batch_size = 10;
  options.seed = 42;
  auto a = SmallMlp(device.get()), b = SmallMlp(device.get()), c = SmallMlp(device.get());
  ASSERT_TRUE(TrainLocal(*a, data, FirstIndices(100), options).ok());
  ASSERT_TRUE(TrainLocal(*b, data, FirstIndices(100), options).ok());
  options.seed = 43;
  ASSERT_TRUE(TrainLocal(*c, data, FirstIndices(100), options).ok());
  EXPECT_EQ(TensorSetSha256(a->GetState().value()), TensorSetSha256(b->GetState().value()));
  EXPECT_NE(TensorSetSha256(a->GetState().value()), TensorSetSha256(c->GetState().value()));
}

// A dataset of 8-bit pixels (as IDX files are held) trains to the same bits as the same values
// held as floats, with and without augmentation: the bytes are read through the table as each
// batch is gathered.
TEST(TrainLocalTest, EightBitPixelsTrainAsTheirFloats) {
  auto device = CreateCpuDevice();
  Dataset bytes;
  bytes.source = "synthetic-bytes";
  bytes.count = 60;
  bytes.rows = bytes.cols = 8;
  bytes.num_classes = 2;
  for (int v = 0; v < 256; ++v) bytes.pixel_values[v] = (static_cast<float>(v) / 255.0f - 0.3f) / 0.4f;
  std::mt19937 engine(7);
  for (int64_t i = 0; i < bytes.count; ++i) {
    const uint8_t label = static_cast<uint8_t>(engine() % 2);
    bytes.labels.push_back(label);
    for (int p = 0; p < 64; ++p) {
      const bool bright = (p < 32) == (label == 0);
      bytes.pixels.push_back(static_cast<uint8_t>((bright ? 180 : 20) + engine() % 60));
    }
  }
  ASSERT_TRUE(bytes.EightBit());
  Dataset floats = bytes;
  floats.images = bytes.Values();
  floats.pixels.clear();
  ASSERT_FALSE(floats.EightBit());
  EXPECT_EQ(floats.SampleBytes(), 4 * bytes.SampleBytes());
  for (bool augment : {false, true}) {
    SCOPED_TRACE(augment ? "augmented" : "plain");
    TrainOptions options;
    options.batch_size = 8;
    options.seed = 5;
    options.epochs = 2;
    options.augment.horizontal_flip = augment;
    options.augment.crop_padding = augment ? 1 : 0;
    auto a = SmallMlp(device.get()), b = SmallMlp(device.get());
    ASSERT_TRUE(TrainLocal(*a, bytes, FirstIndices(60), options).ok());
    ASSERT_TRUE(TrainLocal(*b, floats, FirstIndices(60), options).ok());
    EXPECT_EQ(TensorSetSha256(a->GetState().value()), TensorSetSha256(b->GetState().value()));
    EXPECT_NE(TensorSetSha256(a->GetState().value()), TensorSetSha256(SmallMlp(device.get())->GetState().value()));
  }
}

TEST(TrainLocalTest, StopsWhenAskedAndPropagatesHookErrors) {
  auto device = CreateCpuDevice();
  auto model = SmallMlp(device.get());
  Dataset data = SeparableDataset(100, 3);
  TrainOptions options;
  options.batch_size = 10;
  int checks = 0;
  options.should_stop = [&checks] { return ++checks > 3; };
  auto stopped = TrainLocal(*model, data, FirstIndices(100), options);
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), StatusCode::kCancelled);
  EXPECT_NE(stopped.status().message().find("3 steps"), std::string::npos) << stopped.status().ToString();

  CountingHook hook;
  hook.fail_at_step = 2;
  options.should_stop = nullptr;
  options.gradient_hook = &hook;
  auto failed = TrainLocal(*model, data, FirstIndices(100), options);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(hook.steps, (std::vector<int64_t>{0, 1, 2}));
}

TEST(TrainLocalTest, RefusesMismatchedDataAndBadIndices) {
  auto device = CreateCpuDevice();
  auto model = SmallMlp(device.get());
  Dataset data = SeparableDataset(10, 4);
  EXPECT_EQ(TrainLocal(*model, data, {0, 10}, {}).status().code(), StatusCode::kInvalidArgument);
  TrainOptions zero_batch;
  zero_batch.batch_size = 0;
  EXPECT_EQ(TrainLocal(*model, data, {0}, zero_batch).status().code(), StatusCode::kInvalidArgument);
  data.rows = 4;
  auto mismatched = TrainLocal(*model, data, {0}, {});
  EXPECT_EQ(mismatched.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mismatched.status().message().find("synthetic-halves"), std::string::npos);
}

TEST(TrainLocalTest, SimpleCnnLearnsFashionMnist) {
  auto train = LoadFashionMnist(kDefaultFashionMnistDir, true);
  auto test = LoadFashionMnist(kDefaultFashionMnistDir, false);
  if (!train.ok() || !test.ok()) {
    GTEST_SKIP() << "Fashion-MNIST not available: " << (train.ok() ? test : train).status().ToString();
  }
  auto device = CreateCpuDevice();
  ModelConfig config;
  config.seed = 3;
  auto model = std::move(CreateModel(config, device.get())).value();
  auto before = Evaluate(*model, *test, 500, 1000);
  ASSERT_TRUE(before.ok());
  TrainOptions options;
  options.epochs = 2;
  options.batch_size = 32;
  options.weight_decay = 1e-5f;
  auto report = TrainLocal(*model, *train, FirstIndices(3000), options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  auto after = Evaluate(*model, *test, 500, 1000);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->samples, 1000u);
  EXPECT_LT(after->loss, before->loss - 0.5);
  EXPECT_GT(after->accuracy, 0.65);
  EXPECT_GT(after->accuracy, before->accuracy + 0.3);
}

}  // namespace
}  // namespace tessera
