// Image augmentation in local training: flips and crops against hand-computed images, and
// training with augmentation reproducible from its seed.
#include <gtest/gtest.h>

#include <numeric>

#include "core/train/trainer.h"
#include "device/cpu/factory.h"

namespace tessera {
namespace {

// One 2-channel 3x3 image whose value at (c, y, x) is 100c + 10y + x + 1.
Dataset CountingImage() {
  Dataset data;
  data.source = "counting";
  data.count = 1;
  data.channels = 2;
  data.rows = data.cols = 3;
  data.images.resize(18);
  for (int c = 0; c < 2; ++c)
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 3; ++x) data.images[c * 9 + y * 3 + x] = static_cast<float>(100 * c + 10 * y + x + 1);
  data.labels = {0};
  return data;
}

std::vector<float> Augmented(const Augmentation& augment, uint64_t bits) {
  const Dataset data = CountingImage();
  std::vector<float> out(18, -1.0f);
  AugmentImage(data, 0, augment, bits, out.data());
  return out;
}

TEST(AugmentImageTest, FlipMirrorsEveryChannelWhenBitZeroIsSet) {
  const Augmentation flip{.horizontal_flip = true};
  EXPECT_EQ(Augmented(flip, 0), CountingImage().images);  // bit 0 clear: as it is
  const std::vector<float> mirrored = Augmented(flip, 1);
  const std::vector<float> expected = {3, 2, 1, 13, 12, 11, 23, 22, 21, 103, 102, 101, 113, 112, 111, 123, 122, 121};
  EXPECT_EQ(mirrored, expected);
}

TEST(AugmentImageTest, CropShiftsAndFillsZeros) {
  const Augmentation crop{.crop_padding = 1};  // shifts in [-1, 1]: (bits % 3) - 1
  // dy = 2 - 1 = +1 (bits 8..), dx = 0 - 1 = -1 (bits 24..).
  const uint64_t bits = (uint64_t{2} << 8) | (uint64_t{0} << 24);
  const std::vector<float> out = Augmented(crop, bits);
  // out(y, x) = in(y + 1, x - 1): row 0 is input row 1 shifted right, the last row zeros.
  const std::vector<float> channel0 = {0, 11, 12, 0, 21, 22, 0, 0, 0};
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 9), channel0);
  EXPECT_FLOAT_EQ(out[9 + 1], 111.0f);
  // No shift (both draws 1: (bits >> 8) % 3 = 65536 % 3 = 1, (bits >> 24) % 3 = 1), flip bit
  // clear: unchanged.
  EXPECT_EQ(Augmented(crop, uint64_t{1} << 24), CountingImage().images);
}

// Eight 4x4 images of two classes (bright left or right half), the augmented training's input.
Dataset Halves() {
  Dataset data;
  data.source = "halves";
  data.count = 8;
  data.rows = data.cols = 4;
  data.num_classes = 2;
  data.images.resize(8 * 16);
  data.labels.resize(8);
  for (int i = 0; i < 8; ++i) {
    data.labels[i] = static_cast<uint8_t>(i % 2);
    for (int p = 0; p < 16; ++p) data.images[i * 16 + p] = ((p % 4 < 2) == (i % 2 == 0)) ? 1.0f : -1.0f;
  }
  return data;
}

TEST(TrainAugmentTest, AugmentedTrainingRepeatsFromItsSeedAndDiffersFromPlain) {
  auto device = CreateCpuDevice();
  const Dataset data = Halves();
  std::vector<int64_t> indices(8);
  std::iota(indices.begin(), indices.end(), 0);
  auto train = [&](const Augmentation& augment) {
    ModelConfig config;
    config.name = "mlp";
    config.hidden = {8};
    config.rows = config.cols = 4;
    config.classes = 2;
    config.seed = 3;
    auto model = std::move(CreateModel(config, device.get())).value();
    TrainOptions options;
    options.epochs = 3;
    options.batch_size = 4;
    options.seed = 11;
    options.augment = augment;
    auto report = TrainLocal(*model, data, indices, options);
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    return model->GetState().value();
  };
  const Augmentation both{.horizontal_flip = true, .crop_padding = 1};
  const TensorSet a = train(both), b = train(both), plain = train(Augmentation{});
  ASSERT_EQ(a.size(), plain.size());
  bool differs = false;
  for (size_t t = 0; t < a.size(); ++t) {
    EXPECT_EQ(a[t].values, b[t].values) << a[t].name;
    differs = differs || a[t].values != plain[t].values;
  }
  EXPECT_TRUE(differs) << "augmentation changed nothing";
}

}  // namespace
}  // namespace tessera
