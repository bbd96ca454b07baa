// Datasets in every format a job may name (core/data/dataset_source.h): small files written
// here in each format, read back with their shapes, labels, rows and normalisation, and
// hostile files refused with a message naming the file and what was wrong.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/data/dataset_source.h"
#include "core/data/idx.h"
#include "core/data/numpy_format.h"
#include "tests/address_space.h"

namespace tessera {
namespace {

using testing::CapAddressSpace;

namespace fs = std::filesystem;

class DataSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / (std::string("tessera_source_") + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  DataSource Source(DataFormat format) const {
    DataSource s;
    s.format = format;
    s.dir = dir_.string();
    return s;
  }
  void WriteText(const std::string& name, const std::string& text) const {
    std::ofstream out(Path(name), std::ios::binary);
    out << text;
  }

  // CIFAR-10 records whose pixel p of record r is (r * 7 + p) % 256, labels r % 10.
  void WriteCifar(const std::string& name, int records, int first_record) const {
    std::vector<uint8_t> labels, pixels;
    for (int r = first_record; r < first_record + records; ++r) {
      labels.push_back(static_cast<uint8_t>(r % 10));
      for (int p = 0; p < 3072; ++p) pixels.push_back(static_cast<uint8_t>((r * 7 + p) % 256));
    }
    ASSERT_TRUE(WriteCifar10Batch(Path(name), labels, pixels).ok());
  }

  fs::path dir_;
};

TEST_F(DataSourceTest, FormatNamesRoundTripAndTyposAreRefused) {
  for (DataFormat f : {DataFormat::kIdx, DataFormat::kCifar10, DataFormat::kNpz, DataFormat::kCsv}) {
    auto parsed = ParseDataFormat(DataFormatName(f));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, f);
  }
  auto typo = ParseDataFormat("cifar-10");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("'cifar-10'"), std::string::npos) << typo.status().message();
}

TEST_F(DataSourceTest, IdxAnyMnistFormatSetWithItsOwnNormalisation) {
  // 3 images of 2x3, pixel values chosen so that scaling and normalising are visible.
  std::vector<uint8_t> pixels = {0, 51, 102, 153, 204, 255, 255, 255, 255, 0, 0, 0, 10, 20, 30, 40, 50, 60};
  ASSERT_TRUE(WriteIdxPair(Path("train-images-idx3-ubyte.gz"), Path("train-labels-idx1-ubyte.gz"), 2, 3, pixels,
                           {4, 0, 7})
                  .ok());
  ASSERT_TRUE(WriteIdxPair(Path("t10k-images-idx3-ubyte"), Path("t10k-labels-idx1-ubyte"), 2, 3,
                           std::vector<uint8_t>(pixels.begin(), pixels.begin() + 6), {2})
                  .ok());
  DataSource source = Source(DataFormat::kIdx);
  auto shape = InspectSplit(source, true);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(shape->channels, 1);
  EXPECT_EQ(shape->rows, 2);
  EXPECT_EQ(shape->cols, 3);
  EXPECT_EQ(shape->count, 3);
  EXPECT_EQ(shape->max_label, 7);
  auto test_shape = InspectSplit(source, false);
  ASSERT_TRUE(test_shape.ok());
  EXPECT_EQ(test_shape->count, 1);

  source.mean = {0.5f};
  source.std = {0.25f};
  auto rows = LoadSplitRows(source, true, {2, 0}, 8);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->count, 2);
  EXPECT_EQ(rows->labels, (std::vector<uint8_t>{7, 4}));
  // Row 0's first pixels: 0 -> (0 - 0.5) / 0.25 = -2; 255 -> 2; 51 -> (0.2 - 0.5) * 4 = -1.2.
  EXPECT_FLOAT_EQ(rows->ImageValues(1)[0], -2.0f);
  EXPECT_NEAR(rows->ImageValues(1)[1], -1.2f, 1e-5);
  EXPECT_FLOAT_EQ(rows->ImageValues(1)[5], 2.0f);
  // Row 2's first pixel: 10 / 255.
  EXPECT_NEAR(rows->ImageValues(0)[0], (10.0f / 255.0f - 0.5f) * 4.0f, 1e-5);

  // A label past the classes the job declares is refused with the sample and the key.
  auto few = LoadSplitRows(source, true, {2}, 5);
  ASSERT_FALSE(few.ok());
  EXPECT_NE(few.status().message().find("label 7"), std::string::npos) << few.status().message();
  EXPECT_NE(few.status().message().find("data.classes"), std::string::npos) << few.status().message();
  // And a row outside the split.
  auto outside = LoadSplitRows(source, true, {0, 3}, 8);
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(outside.status().message().find("row 3"), std::string::npos) << outside.status().message();
}

// An idx split is read as Fashion-MNIST's is: its labels and shape from its label file and
// its image file's header, a share of it by streaming the image file and keeping only the
// rows asked for. A worker read the whole image file into memory once for the labels and again
// for its share. Here 1 GiB of (sparse) images is read under an address space that may grow
// by 256 MiB.
TEST_F(DataSourceTest, AnIdxSplitIsStreamedNotHeldWhole) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr uint32_t kCount = (uint32_t{1} << 30) / 784;
  std::vector<uint8_t> header;
  std::vector<uint8_t> labels;
  for (uint32_t v : {0x00000803u, kCount, 28u, 28u}) {
    for (int shift = 24; shift >= 0; shift -= 8) header.push_back(static_cast<uint8_t>(v >> shift));
  }
  for (uint32_t v : {0x00000801u, kCount}) {
    for (int shift = 24; shift >= 0; shift -= 8) labels.push_back(static_cast<uint8_t>(v >> shift));
  }
  for (uint32_t i = 0; i < kCount; ++i) labels.push_back(static_cast<uint8_t>(i % 10));
  const std::string images = Path("train-images-idx3-ubyte");
  {
    std::ofstream out(images, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), static_cast<std::streamsize>(header.size()));
  }
  std::error_code ec;
  fs::resize_file(images, header.size() + uint64_t{kCount} * 784 - 1, ec);
  if (ec) GTEST_SKIP() << "no sparse file of 1 GiB here: " << ec.message();
  {
    std::ofstream out(images, std::ios::binary | std::ios::app);
    out.put(static_cast<char>(255));  // the last image's last pixel
  }
  {
    std::ofstream out(Path("train-labels-idx1-ubyte"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(labels.data()), static_cast<std::streamsize>(labels.size()));
  }
  const DataSource source = Source(DataFormat::kIdx);
  EXPECT_EXIT(
      {
        CapAddressSpace(uint64_t{256} << 20);
        auto read = ReadSplitLabels(source, /*train=*/true);
        if (!read.ok() || read->size() != kCount) std::exit(1);
        auto shape = InspectSplit(source, /*train=*/true);
        if (!shape.ok() || shape->count != kCount || shape->rows != 28 || shape->max_label != 9) std::exit(2);
        auto share = LoadSplitRows(source, /*train=*/true, {kCount - 1, 0}, 10);
        if (!share.ok()) {
          std::fprintf(stderr, "%s\n", share.status().ToString().c_str());
          std::exit(3);
        }
        if (share->count != 2 || share->ImageValues(0)[783] != 1.0f || share->ImageValues(1)[783] != 0.0f ||
            share->labels != std::vector<uint8_t>{static_cast<uint8_t>((kCount - 1) % 10), 0}) {
          std::exit(4);
        }
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
  fs::remove(images);
}

// A std whose reciprocal is not finite is refused before any sample is read; one that is
// finite but, with the mean, sends values past float's range is refused at the first such value.
// Either way the message names data.std instead of handing out infinite inputs.
TEST_F(DataSourceTest, ANormalisationThatOverflowsIsRefusedNamingDataStd) {
  ASSERT_TRUE(WriteIdxPair(Path("train-images-idx3-ubyte"), Path("train-labels-idx1-ubyte"), 2, 2,
                           {0, 1, 2, 3, 4, 5, 6, 7}, {0, 1})
                  .ok());
  DataSource source = Source(DataFormat::kIdx);
  source.mean = {0.5f};
  source.std = {1e-45f};
  auto subnormal = LoadSplitRows(source, true, {0, 1}, 2);
  ASSERT_FALSE(subnormal.ok());
  EXPECT_EQ(subnormal.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(subnormal.status().message().find("data.std[0]"), std::string::npos) << subnormal.status().message();
  EXPECT_NE(subnormal.status().message().find("1/std is finite"), std::string::npos) << subnormal.status().message();

  source.mean = {-1e6f};
  source.std = {1.5e-38f};
  auto overflowing = LoadSplitRows(source, true, {1}, 2);
  ASSERT_FALSE(overflowing.ok());
  EXPECT_EQ(overflowing.status().code(), StatusCode::kInvalidArgument);
  const std::string& message = overflowing.status().message();
  EXPECT_NE(message.find("train-images-idx3-ubyte: sample 1, channel 0, value 0"), std::string::npos) << message;
  EXPECT_NE(message.find("data.std[0] 1.5e-38"), std::string::npos) << message;
  EXPECT_NE(message.find("not finite"), std::string::npos) << message;

  // The IDX loaders' own pixel table, as a Fashion-MNIST job uses it.
  for (PixelNormalisation normalisation : {PixelNormalisation{0.5f, 1e-45f}, PixelNormalisation{-1e6f, 1.5e-38f}}) {
    auto pair = LoadIdxPair(Path("train-images-idx3-ubyte"), Path("train-labels-idx1-ubyte"), 2, normalisation);
    ASSERT_FALSE(pair.ok());
    EXPECT_EQ(pair.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(pair.status().message().find("data.std"), std::string::npos) << pair.status().message();
    auto rows = LoadIdxPairRows(Path("train-images-idx3-ubyte"), Path("train-labels-idx1-ubyte"), {1}, 2,
                                normalisation);
    ASSERT_FALSE(rows.ok());
    EXPECT_EQ(rows.status().message(), pair.status().message());
  }
}

TEST_F(DataSourceTest, Cifar10ReadsRecordsAcrossBatchesAndOnlyTheRowsAsked) {
  WriteCifar("data_batch_1.bin", 4, 0);
  WriteCifar("data_batch_2.bin", 3, 4);
  WriteCifar("test_batch.bin", 2, 100);
  DataSource source = Source(DataFormat::kCifar10);
  auto shape = InspectSplit(source, true);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(shape->channels, 3);
  EXPECT_EQ(shape->rows, 32);
  EXPECT_EQ(shape->cols, 32);
  EXPECT_EQ(shape->count, 7);
  EXPECT_EQ(shape->max_label, 6);
  auto labels = ReadSplitLabels(source, true);
  ASSERT_TRUE(labels.ok());
  EXPECT_EQ(*labels, (std::vector<uint8_t>{0, 1, 2, 3, 4, 5, 6}));

  // Row 5 lies in the second batch (its record 1): global record 5.
  auto rows = LoadSplitRows(source, true, {5, 1}, 10);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  EXPECT_EQ(rows->labels, (std::vector<uint8_t>{5, 1}));
  EXPECT_FLOAT_EQ(rows->ImageValues(0)[0], static_cast<float>((5 * 7) % 256) / 255.0f);
  // Channel 2 (blue) starts at 2,048: pixel value (35 + 2048) % 256.
  EXPECT_FLOAT_EQ(rows->ImageValues(0)[2048], static_cast<float>((35 + 2048) % 256) / 255.0f);
  EXPECT_FLOAT_EQ(rows->ImageValues(1)[3071], static_cast<float>((7 + 3071) % 256) / 255.0f);

  // Per-channel normalisation: three means and deviations.
  source.mean = {0.0f, 0.5f, 1.0f};
  source.std = {1.0f, 0.5f, 2.0f};
  auto normalised = LoadSplitRows(source, true, {0}, 10);
  ASSERT_TRUE(normalised.ok()) << normalised.status().ToString();
  EXPECT_FLOAT_EQ(normalised->ImageValues(0)[0], 0.0f);
  EXPECT_NEAR(normalised->ImageValues(0)[1024], ((1024 % 256) / 255.0f - 0.5f) / 0.5f, 1e-6);
  EXPECT_NEAR(normalised->ImageValues(0)[2048], ((2048 % 256) / 255.0f - 1.0f) / 2.0f, 1e-6);
  source.mean = {0.0f, 0.5f};
  source.std = {1.0f, 0.5f};
  auto wrong = LoadSplitRows(source, true, {0}, 10);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("data.mean"), std::string::npos) << wrong.status().message();
}

TEST_F(DataSourceTest, Cifar10RefusesACutRecordAndAMissingSplit) {
  DataSource source = Source(DataFormat::kCifar10);
  auto missing = InspectSplit(source, true);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("data_batch_1.bin"), std::string::npos) << missing.status().message();
  WriteCifar("data_batch_1.bin", 2, 0);
  fs::resize_file(Path("data_batch_1.bin"), 3073 * 2 - 5);
  auto cut = InspectSplit(source, true);
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(cut.status().message().find("data_batch_1.bin"), std::string::npos) << cut.status().message();
  EXPECT_NE(cut.status().message().find("3073"), std::string::npos) << cut.status().message();
}

// Batches 1, 3, 4 and 5 without 2: the training split is refused naming data_batch_2.bin rather
// than read as batch 1 alone; and so is 2 to 5 without 1.
// A batch larger than a split may be (here a sparse file of whole records just over 4 GiB,
// 1.4 million of them) is refused by its size, naming it, before a label is read.
TEST_F(DataSourceTest, Cifar10RefusesABatchLargerThanASplitMayBe) {
  DataSource source = Source(DataFormat::kCifar10);
  const uint64_t record = 1 + 3072;
  const uint64_t records = ((uint64_t{4} << 30) + record) / record;
  { std::ofstream(Path("test_batch.bin"), std::ios::binary); }
  std::error_code ec;
  fs::resize_file(Path("test_batch.bin"), records * record, ec);
  if (ec) GTEST_SKIP() << "no sparse file of " << records * record << " bytes here: " << ec.message();
  auto shape = InspectSplit(source, false);
  ASSERT_FALSE(shape.ok()) << shape->count << " records read";
  EXPECT_EQ(shape.status().code(), StatusCode::kInvalidArgument) << shape.status().ToString();
  EXPECT_NE(shape.status().message().find("test_batch.bin"), std::string::npos) << shape.status().message();
  EXPECT_NE(shape.status().message().find("at most 4294967296 bytes"), std::string::npos) << shape.status().message();
}

TEST_F(DataSourceTest, Cifar10RefusesAGapInItsBatches) {
  WriteCifar("data_batch_1.bin", 2, 0);
  for (int b = 3; b <= 5; ++b) WriteCifar("data_batch_" + std::to_string(b) + ".bin", 2, 2 * b);
  DataSource source = Source(DataFormat::kCifar10);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const std::string missing = attempt == 0 ? "data_batch_2.bin" : "data_batch_1.bin";
    auto shape = InspectSplit(source, true);
    ASSERT_FALSE(shape.ok()) << shape->count;
    EXPECT_EQ(shape.status().code(), StatusCode::kNotFound);
    EXPECT_NE(shape.status().message().find(Path(missing) + " not found"), std::string::npos)
        << shape.status().message();
    EXPECT_FALSE(ReadSplitLabels(source, true).ok());
    if (attempt == 0) fs::rename(Path("data_batch_1.bin"), Path("data_batch_2.bin"));
  }
}

TEST_F(DataSourceTest, NpzImagesFeaturesAndDtypes) {
  // x: (2, 1, 2, 2) uint8 images; y: int64 labels.
  NumpyArray x{"x", "|u1", {2, 1, 2, 2}, std::string("\x00\xff\x33\x66\x10\x20\x30\x40", 8)};
  NumpyArray y{"y", "<i8", {2}, std::string("\x03\0\0\0\0\0\0\0\x01\0\0\0\0\0\0\0", 16)};
  ASSERT_TRUE(WriteNpz(Path("train.npz"), {x, y}).ok());
  DataSource source = Source(DataFormat::kNpz);
  auto shape = InspectSplit(source, true);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(shape->channels, 1);
  EXPECT_EQ(shape->rows, 2);
  EXPECT_EQ(shape->cols, 2);
  EXPECT_EQ(shape->max_label, 3);
  auto rows = LoadSplitRows(source, true, {1, 0}, 4);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  EXPECT_EQ(rows->labels, (std::vector<uint8_t>{1, 3}));
  EXPECT_FLOAT_EQ(rows->ImageValues(0)[0], 16.0f / 255.0f);
  EXPECT_FLOAT_EQ(rows->ImageValues(1)[1], 1.0f);

  // (N, F) float32 features: F channels of 1x1, values as they are.
  std::vector<float> features = {1.5f, -2.0f, 3.0f, 0.25f, 8.0f, -1.0f};
  NumpyArray fx{"x", "<f4", {2, 3}, std::string(reinterpret_cast<const char*>(features.data()), 24)};
  NumpyArray fy{"y", "|u1", {2}, std::string("\x00\x01", 2)};
  ASSERT_TRUE(WriteNpz(Path("test.npz"), {fy, fx}).ok());
  auto tabular = LoadSplit(source, false, 2);
  ASSERT_TRUE(tabular.ok()) << tabular.status().ToString();
  EXPECT_EQ(tabular->channels, 3);
  EXPECT_EQ(tabular->rows, 1);
  EXPECT_EQ(tabular->cols, 1);
  EXPECT_FLOAT_EQ(tabular->ImageValues(1)[0], 0.25f);
  EXPECT_FLOAT_EQ(tabular->ImageValues(0)[1], -2.0f);
}

TEST_F(DataSourceTest, NpzRefusesMissingArraysMismatchedLabelsAndBadValues) {
  DataSource source = Source(DataFormat::kNpz);
  NumpyArray x{"x", "|u1", {2, 2}, std::string("\x01\x02\x03\x04", 4)};
  NumpyArray labels_typo{"Y", "|u1", {2}, std::string("\x00\x01", 2)};
  ASSERT_TRUE(WriteNpz(Path("train.npz"), {x, labels_typo}).ok());
  auto typo = InspectSplit(source, true);
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("'y'"), std::string::npos) << typo.status().message();
  EXPECT_NE(typo.status().message().find("Y"), std::string::npos) << typo.status().message();

  NumpyArray short_y{"y", "|u1", {1}, std::string("\x00", 1)};
  ASSERT_TRUE(WriteNpz(Path("train.npz"), {x, short_y}).ok());
  auto mismatch = InspectSplit(source, true);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("one label per sample"), std::string::npos) << mismatch.status().message();

  NumpyArray negative{"y", "<i4", {2}, std::string("\x00\0\0\0\xff\xff\xff\xff", 8)};
  ASSERT_TRUE(WriteNpz(Path("train.npz"), {x, negative}).ok());
  auto below = InspectSplit(source, true);
  ASSERT_FALSE(below.ok());
  EXPECT_NE(below.status().message().find("y[1]"), std::string::npos) << below.status().message();

  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> values = {1.0f, nan};
  NumpyArray bad_x{"x", "<f4", {2, 1}, std::string(reinterpret_cast<const char*>(values.data()), 8)};
  NumpyArray y{"y", "|u1", {2}, std::string("\x00\x01", 2)};
  ASSERT_TRUE(WriteNpz(Path("train.npz"), {bad_x, y}).ok());
  auto not_finite = LoadSplit(source, true, 2);
  ASSERT_FALSE(not_finite.ok());
  EXPECT_NE(not_finite.status().message().find("x[1], value 0: nan; expected a finite number"), std::string::npos)
      << not_finite.status().message();

  // A float64 value past float's range is finite in the file: the message says what it is and
  // what was expected, not that it is not finite.
  std::vector<double> wide = {1.0, 2.0, -1e300, 3.0};
  NumpyArray wide_x{"x", "<f8", {2, 2}, std::string(reinterpret_cast<const char*>(wide.data()), 32)};
  ASSERT_TRUE(WriteNpz(Path("train.npz"), {wide_x, y}).ok());
  auto too_large = LoadSplit(source, true, 2);
  ASSERT_FALSE(too_large.ok());
  EXPECT_EQ(too_large.status().message(), Path("train.npz") + ": x[1], value 0: -1e+300; expected a finite number "
                                          "within float's range (magnitude at most 3.40282e+38)");
}

// A split of no samples (an idx pair of count 0, an npz of (0, ...) arrays) is refused naming
// its file, as a csv of no rows and a cifar10 batch of no records are: the coordinator
// evaluated every round on it, scoring 0 on 0 samples.
TEST_F(DataSourceTest, ASplitOfNoSamplesIsRefusedNamingItsFile) {
  ASSERT_TRUE(WriteIdxPair(Path("t10k-images-idx3-ubyte"), Path("t10k-labels-idx1-ubyte"), 2, 2, {}, {}).ok());
  auto idx = InspectSplit(Source(DataFormat::kIdx), /*train=*/false);
  ASSERT_FALSE(idx.ok());
  EXPECT_EQ(idx.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(idx.status().message().find(Path("t10k-images-idx3-ubyte") + ": holds no samples; expected at least "
                                        "one in the test split"),
            std::string::npos)
      << idx.status().message();

  ASSERT_TRUE(WriteNpz(Path("train.npz"), {NumpyArray{"x", "<f4", {0, 1, 2, 2}, ""}, NumpyArray{"y", "|u1", {0}, ""}})
                  .ok());
  auto npz = LoadSplit(Source(DataFormat::kNpz), /*train=*/true, 2);
  ASSERT_FALSE(npz.ok());
  EXPECT_EQ(npz.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(npz.status().message().find(Path("train.npz") + ": holds no samples; expected at least one in the "
                                        "training split"),
            std::string::npos)
      << npz.status().message();
}

// An archive without 'x' and 'y' is refused with the names it has: escaped, each cut short,
// and only the first eight, however many arrays and however long their names.
TEST_F(DataSourceTest, NpzWithoutXAndYListsAFewOfItsNamesEscaped) {
  std::vector<NumpyArray> arrays;
  arrays.push_back(NumpyArray{"forged\nERROR line", "|u1", {1}, std::string(1, '\0')});
  for (int i = 0; i < 2000; ++i) {
    arrays.push_back(NumpyArray{std::to_string(i) + std::string(1000, 'n'), "|u1", {1}, std::string(1, '\0')});
  }
  ASSERT_TRUE(WriteNpz(Path("train.npz"), arrays).ok());
  auto split = InspectSplit(Source(DataFormat::kNpz), true);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), StatusCode::kInvalidArgument);
  const std::string& message = split.status().message();
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_NE(message.find("'forged\\nERROR line'"), std::string::npos) << message;
  EXPECT_NE(message.find("and 1993 more"), std::string::npos) << message;
  EXPECT_LT(message.size(), 2000u) << message;
}

TEST_F(DataSourceTest, CsvTabularWithANamedLabelColumn) {
  WriteText("train.csv", "f1, kind ,f2\r\n0.5,1,-3\n\n2e2,0,4.25\r\n");
  DataSource source = Source(DataFormat::kCsv);
  source.label_column = "kind";
  auto shape = InspectSplit(source, true);
  ASSERT_TRUE(shape.ok()) << shape.status().ToString();
  EXPECT_EQ(shape->channels, 2);
  EXPECT_EQ(shape->rows, 1);
  EXPECT_EQ(shape->cols, 1);
  EXPECT_EQ(shape->count, 2);
  EXPECT_EQ(shape->max_label, 1);
  source.mean = {0.0f, 1.0f};
  source.std = {100.0f, 2.0f};
  auto data = LoadSplitRows(source, true, {1, 0}, 2);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ(data->labels, (std::vector<uint8_t>{0, 1}));
  EXPECT_FLOAT_EQ(data->ImageValues(0)[0], 2.0f);
  EXPECT_FLOAT_EQ(data->ImageValues(0)[1], 1.625f);
  EXPECT_FLOAT_EQ(data->ImageValues(1)[1], -2.0f);
  // The written form reads back.
  ASSERT_TRUE(WriteCsv(Path("test.csv"), {"label", "a"}, {{1, 0.125}, {0, -7}}).ok());
  source.label_column = "label";
  source.mean.clear();
  source.std.clear();
  auto test = LoadSplit(source, false, 2);
  ASSERT_TRUE(test.ok()) << test.status().ToString();
  EXPECT_EQ(test->labels, (std::vector<uint8_t>{1, 0}));
  EXPECT_FLOAT_EQ(test->ImageValues(0)[0], 0.125f);
}

// Spreadsheets save "CSV UTF-8" with a byte-order mark before the header: the first column's
// name was read with the mark in it, and a label column there was not found.
TEST_F(DataSourceTest, CsvHeaderAfterAUtf8ByteOrderMarkNamesItsFirstColumn) {
  WriteText("train.csv", "\xEF\xBB\xBFlabel,a\r\n1,0.5\r\n0,2\r\n");
  auto data = LoadSplit(Source(DataFormat::kCsv), true, 2);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ(data->labels, (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(data->channels, 1);
  EXPECT_FLOAT_EQ(data->ImageValues(1)[0], 2.0f);
  // Only before the header: a mark inside a row is not a number.
  WriteText("train.csv", "label,a\n1,\xEF\xBB\xBF" "0.5\n");
  auto inside = InspectSplit(Source(DataFormat::kCsv), true);
  ASSERT_FALSE(inside.ok());
  EXPECT_NE(inside.status().message().find("line 2, column 'a': expected a finite number"), std::string::npos)
      << inside.status().message();
}

TEST_F(DataSourceTest, CsvErrorsNameTheFileLineAndColumn) {
  DataSource source = Source(DataFormat::kCsv);
  const struct {
    const char* text;
    std::vector<std::string> expected;
  } cases[] = {
      {"a,b\n1,2\n", {"train.csv", "line 1", "'label'", "data.label_column"}},
      {"label,a\n1,2\n3\n", {"line 3", "expected 2 fields"}},
      {"label,a\n1,2\nx,2\n", {"line 3", "column 'label'", "integer label", "'x'"}},
      {"label,a\n1,nan\n", {"line 2", "column 'a'", "finite number", "'nan'"}},
      {"label,a\n1,1e39\n", {"line 2", "finite number"}},
      {"label,a\n300,1\n", {"line 2", "label 300", "[0, 255]"}},
      {"label,a\n", {"no samples"}},
      {"label,label,a\n1,1,1\n", {"appears twice"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    WriteText("train.csv", c.text);
    auto got = InspectSplit(source, true);
    ASSERT_FALSE(got.ok());
    for (const std::string& piece : c.expected) {
      EXPECT_NE(got.status().message().find(piece), std::string::npos) << got.status().message();
    }
  }
}

// A line of 32 Mi commas, as the header or as a sample, is refused as too many fields without
// holding a view of each (512 MiB): what is held stays near the line's own bytes.
TEST_F(DataSourceTest, CsvLinesOfNothingButCommasAreRefusedWithoutAViewPerField) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string commas(size_t{32} << 20, ',');
  const struct {
    std::string text;
    std::vector<std::string> expected;
  } cases[] = {
      {"label" + commas + "\n1\n", {"line 1", "2 to 65536 columns", "got more"}},
      {"label,a\n1" + commas + "\n", {"line 2", "expected 2 fields", "got more"}},
  };
  DataSource source = Source(DataFormat::kCsv);
  for (const auto& c : cases) {
    WriteText("train.csv", c.text);
    EXPECT_EXIT(
        {
          CapAddressSpace(uint64_t{256} << 20);
          auto got = InspectSplit(source, true);
          std::fprintf(stderr, "%s\n", got.status().ToString().c_str());
          bool named = !got.ok() && got.status().message().find("train.csv") != std::string::npos;
          for (const std::string& piece : c.expected) {
            named = named && got.status().message().find(piece) != std::string::npos;
          }
          std::exit(named ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "");
  }
}

// A line past 64 MiB (a file without newlines, say) is refused naming the line and the limit,
// read no further than that: not held whole, as a plain getline would hold it.
TEST_F(DataSourceTest, ACsvLineLongerThanTheLimitIsRefusedNamingIt) {
  DataSource source = Source(DataFormat::kCsv);
  WriteText("train.csv", "label,a\n" + std::string((size_t{64} << 20) + 10, '1'));
  auto got = InspectSplit(source, true);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  for (const char* piece : {"train.csv", "line 2", "longer than 64 MiB"}) {
    EXPECT_NE(got.status().message().find(piece), std::string::npos) << got.status().message();
  }
  WriteText("train.csv", std::string((size_t{64} << 20) + 1, 'x'));
  got = InspectSplit(source, true);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("line 1: longer than 64 MiB"), std::string::npos) << got.status().message();
}

}  // namespace
}  // namespace tessera
