// TrainLocal and Evaluate at the edges of what their options and data allow: memory sized from
// the data rather than from a batch size the data never fills, and options refused before they
// reach the arithmetic.
#include <gtest/gtest.h>

#include <numeric>

#include "core/train/trainer.h"
#include "device/emulated/factory.h"
#include "device/emulated/profile.h"

namespace tessera {
namespace {

// `count` samples of 3x64x64, labels alternating between two classes.
Dataset LargeImages(int64_t count) {
  Dataset data;
  data.source = "synthetic-large";
  data.count = count;
  data.channels = 3;
  data.rows = data.cols = 64;
  data.num_classes = 2;
  data.images.resize(static_cast<size_t>(count * data.SampleSize()));
  for (size_t i = 0; i < data.images.size(); ++i) data.images[i] = static_cast<float>(i % 7) * 0.1f;
  for (int64_t i = 0; i < count; ++i) data.labels.push_back(static_cast<uint8_t>(i % 2));
  return data;
}

ModelConfig SmallMlpFor(const Dataset& data) {
  ModelConfig config;
  config.name = "mlp";
  config.hidden = {8};
  config.channels = data.channels;
  config.rows = data.rows;
  config.cols = data.cols;
  config.classes = data.num_classes;
  config.seed = 2;
  return config;
}

// A party with a handful of samples under a job's batch size of 8192 staged 8192 samples
// (400 MB of 3x64x64 images) before it loaded any: on a device of 64 MB, out of memory.
TEST(TrainLimitsTest, BatchStagingIsSizedByTheSamplesNotTheBatchSize) {
  DeviceProfile profile = *FindBuiltinProfile("generic");
  profile.memory_bytes = 64u << 20;
  auto device = CreateEmulatedDevice(profile);
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  const Dataset data = LargeImages(4);
  auto model = CreateModel(SmallMlpFor(data), device->get());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  TrainOptions options;
  options.batch_size = 8192;
  std::vector<int64_t> indices(4);
  std::iota(indices.begin(), indices.end(), 0);
  auto report = TrainLocal(**model, data, indices, options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->steps, 1u);
  EXPECT_EQ(report->samples, 4u);
  auto evaluated = Evaluate(**model, data, 8192);
  ASSERT_TRUE(evaluated.ok()) << evaluated.status().ToString();
  EXPECT_EQ(evaluated->samples, 4u);
  // No samples at all: nothing to stage, and nothing fails.
  auto nothing = TrainLocal(**model, data, {}, options);
  ASSERT_TRUE(nothing.ok()) << nothing.status().ToString();
  EXPECT_EQ(nothing->steps, 0u);
  auto none = Evaluate(**model, LargeImages(0), 8192);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->samples, 0u);
}

}  // namespace
}  // namespace tessera
