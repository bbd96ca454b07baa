#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/data/idx.h"
#include "tests/address_space.h"

namespace tessera {
namespace {

using testing::CapAddressSpace;

namespace fs = std::filesystem;

// Big-endian uint32 bytes, for writing IDX headers by hand.
void Append32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

// A fresh directory per test, under gtest's temporary directory.
class IdxFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / (std::string("tessera_idx_") + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes `count` images of 4x3 with pixel value (i * 7 + j) % 256 and labels i % 10.
  void WriteSmall(const std::string& images, const std::string& labels, int count) {
    std::vector<uint8_t> pixels(static_cast<size_t>(count) * 12);
    for (size_t j = 0; j < pixels.size(); ++j) pixels[j] = static_cast<uint8_t>(j * 7 % 256);
    std::vector<uint8_t> label_values(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) label_values[static_cast<size_t>(i)] = static_cast<uint8_t>(i % 10);
    ASSERT_TRUE(WriteIdxPair(Path(images), Path(labels), 4, 3, pixels, label_values).ok());
  }

  static std::vector<uint8_t> ReadRaw(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
  }
  static void WriteRaw(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }

  fs::path dir_;
};

bool HaveFashionMnist() {
  return fs::exists(fs::path(kDefaultFashionMnistDir) / "train-images-idx3-ubyte.gz") ||
         fs::exists(fs::path(kDefaultFashionMnistDir) / "train-images-idx3-ubyte");
}

TEST(FashionMnistTest, LoadsTrainingSplit) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST not installed in " << kDefaultFashionMnistDir;
  const auto start = std::chrono::steady_clock::now();
  Result<Dataset> train = LoadFashionMnist("", /*train=*/true);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  EXPECT_EQ(train->count, 60000);
  EXPECT_EQ(train->rows, 28);
  EXPECT_EQ(train->cols, 28);
  EXPECT_EQ(train->channels, 1);
  EXPECT_EQ(train->num_classes, 10);
  EXPECT_EQ(train->source, "train-images-idx3-ubyte.gz");
  // Held as bytes: a quarter of the memory of floats.
  ASSERT_TRUE(train->EightBit());
  ASSERT_EQ(train->pixels.size(), size_t{60000} * 784);
  EXPECT_TRUE(train->images.empty());
  const std::vector<float> values = train->Values();
  ASSERT_EQ(values.size(), size_t{60000} * 784);
  ASSERT_EQ(train->labels.size(), size_t{60000});
  std::vector<int64_t> per_class(10, 0);
  for (uint8_t label : train->labels) {
    ASSERT_LT(label, 10);
    ++per_class[label];
  }
  for (int64_t n : per_class) EXPECT_EQ(n, 6000);
  // Normalised with the training set's own statistics: mean ~0, standard deviation ~1.
  double sum = 0, sum_sq = 0;
  for (float x : values) {
    sum += x;
    sum_sq += double{x} * x;
  }
  const double mean = sum / values.size();
  const double stddev = std::sqrt(sum_sq / values.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(stddev, 1.0, 0.01);
  // Printed, not asserted: the machine's load decides it (bench/ measures speed).
  std::cout << "loaded 60000 training images in " << seconds << " s\n";
}

TEST(FashionMnistTest, LoadsOnlyTheRowsAskedFor) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST not installed in " << kDefaultFashionMnistDir;
  Result<IdxPairPaths> paths = FindFashionMnist("", /*train=*/false);
  ASSERT_TRUE(paths.ok()) << paths.status().ToString();
  Result<Dataset> all = LoadIdxPair(paths->images, paths->labels, 10);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  const std::vector<int64_t> rows = {9999, 0, 17, 17, 5000};
  Result<Dataset> some = LoadIdxPairRows(paths->images, paths->labels, rows, 10);
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  ASSERT_EQ(some->count, 5);
  ASSERT_EQ(some->pixels.size(), size_t{5} * 784);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(some->labels[i], all->labels[static_cast<size_t>(rows[i])]);
    EXPECT_EQ(some->ImageValues(static_cast<int64_t>(i)), all->ImageValues(rows[i])) << i;
  }
  Result<Dataset> outside = LoadIdxPairRows(paths->images, paths->labels, {3, 10000}, 10);
  EXPECT_EQ(outside.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(outside.status().message().find("row 10000 at position 1"), std::string::npos) << outside.status().message();
}

TEST(FashionMnistTest, LoadsTestSplit) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "Fashion-MNIST not installed in " << kDefaultFashionMnistDir;
  Result<Dataset> test = LoadFashionMnist(kDefaultFashionMnistDir, /*train=*/false);
  ASSERT_TRUE(test.ok()) << test.status().ToString();
  EXPECT_EQ(test->count, 10000);
  EXPECT_EQ(test->rows, 28);
  EXPECT_EQ(test->cols, 28);
  EXPECT_EQ(test->source, "t10k-images-idx3-ubyte.gz");
  for (uint8_t label : test->labels) ASSERT_LT(label, 10);
  const std::vector<float> values = test->Values();
  EXPECT_FLOAT_EQ(*std::min_element(values.begin(), values.end()), -0.2860f / 0.3530f);
}

TEST_F(IdxFilesTest, RoundTripsGzipAndPlain) {
  for (const char* suffix : {".gz", ""}) {
    SCOPED_TRACE(suffix);
    std::string images = std::string("img") + suffix, labels = std::string("lbl") + suffix;
    WriteSmall(images, labels, 25);
    Result<Dataset> data = LoadIdxPair(Path(images), Path(labels));
    ASSERT_TRUE(data.ok()) << data.status().ToString();
    EXPECT_EQ(data->count, 25);
    EXPECT_EQ(data->rows, 4);
    EXPECT_EQ(data->cols, 3);
    EXPECT_EQ(data->source, images);
    EXPECT_EQ(data->labels[13], 3);
    // Pixel 5 of image 2 is byte 29, value 29 * 7 % 256 = 203.
    EXPECT_FLOAT_EQ(data->ImageValues(2)[5], (203.0f / 255.0f - kFashionMnistMean) / kFashionMnistStd);
  }
}

TEST_F(IdxFilesTest, GzipIsDetectedByContentNotName) {
  WriteSmall("img.gz", "lbl", 5);
  fs::rename(Path("img.gz"), Path("img-without-suffix"));
  Result<Dataset> data = LoadIdxPair(Path("img-without-suffix"), Path("lbl"));
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ(data->count, 5);
}

TEST_F(IdxFilesTest, MissingFileIsNotFound) {
  Result<Dataset> data = LoadIdxPair(Path("nope"), Path("nope-labels"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kNotFound);
  EXPECT_NE(data.status().message().find(Path("nope")), std::string::npos) << data.status().message();
}

TEST_F(IdxFilesTest, TruncatedPlainFileIsDataLoss) {
  WriteSmall("img", "lbl", 10);
  std::vector<uint8_t> bytes = ReadRaw(Path("img"));
  bytes.resize(bytes.size() - 7);
  WriteRaw(Path("img"), bytes);
  Result<Dataset> data = LoadIdxPair(Path("img"), Path("lbl"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kDataLoss);
  const std::string& message = data.status().message();
  EXPECT_NE(message.find(Path("img")), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  EXPECT_NE(message.find("expects 136 bytes, found 129"), std::string::npos) << message;
}

TEST_F(IdxFilesTest, TruncatedHeaderIsDataLoss) {
  WriteRaw(Path("img"), {0x00, 0x00, 0x08, 0x03, 0x00, 0x00});
  WriteSmall("unused", "lbl", 1);
  Result<Dataset> data = LoadIdxPair(Path("img"), Path("lbl"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(data.status().message().find("header"), std::string::npos) << data.status().message();
}

TEST_F(IdxFilesTest, TrailingBytesAreDataLoss) {
  WriteSmall("img", "lbl", 10);
  std::vector<uint8_t> bytes = ReadRaw(Path("lbl"));
  bytes.push_back(1);
  WriteRaw(Path("lbl"), bytes);
  Result<Dataset> data = LoadIdxPair(Path("img"), Path("lbl"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(data.status().message().find(Path("lbl")), std::string::npos) << data.status().message();
}

TEST_F(IdxFilesTest, TruncatedGzipIsDataLoss) {
  WriteSmall("img.gz", "lbl.gz", 200);
  std::vector<uint8_t> bytes = ReadRaw(Path("img.gz"));
  bytes.resize(bytes.size() / 2);
  WriteRaw(Path("img.gz"), bytes);
  Result<Dataset> data = LoadIdxPair(Path("img.gz"), Path("lbl.gz"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kDataLoss);
  const std::string& message = data.status().message();
  EXPECT_NE(message.find(Path("img.gz")), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
}

TEST_F(IdxFilesTest, CorruptGzipIsDataLoss) {
  WriteSmall("img", "lbl.gz", 200);
  std::vector<uint8_t> bytes = ReadRaw(Path("lbl.gz"));
  ASSERT_GT(bytes.size(), 30u);
  for (size_t i = 12; i < bytes.size() - 8; ++i) bytes[i] ^= 0x5a;
  WriteRaw(Path("lbl.gz"), bytes);
  Result<Dataset> data = LoadIdxPair(Path("img"), Path("lbl.gz"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(data.status().message().find(Path("lbl.gz")), std::string::npos) << data.status().message();
}

// The row loader streams the image file: rows across its read blocks (about 256 KiB of whole
// images each, 64 images of 64x64 here), in any order and repeated, match the whole-file
// loader's, and every damage the whole-file reader refuses it refuses with the same code.
TEST_F(IdxFilesTest, RowLoaderStreamsAcrossBlocksWithTheWholeFileChecks) {
  const int count = 150, side = 64;
  std::vector<uint8_t> pixels(static_cast<size_t>(count) * side * side);
  for (size_t j = 0; j < pixels.size(); ++j) pixels[j] = static_cast<uint8_t>((j * 31 + j / 4096) % 251);
  std::vector<uint8_t> labels(count);
  for (int i = 0; i < count; ++i) labels[static_cast<size_t>(i)] = static_cast<uint8_t>(i % 10);
  const std::vector<int64_t> rows = {149, 0, 63, 64, 64, 127, 128, 5};
  for (const char* suffix : {".gz", ""}) {
    SCOPED_TRACE(suffix);
    const std::string images = Path(std::string("img") + suffix), label_file = Path(std::string("lbl") + suffix);
    ASSERT_TRUE(WriteIdxPair(images, label_file, side, side, pixels, labels).ok());
    Result<Dataset> all = LoadIdxPair(images, label_file, 10);
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    Result<Dataset> some = LoadIdxPairRows(images, label_file, rows, 10);
    ASSERT_TRUE(some.ok()) << some.status().ToString();
    ASSERT_EQ(some->count, static_cast<int64_t>(rows.size()));
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(some->labels[i], all->labels[static_cast<size_t>(rows[i])]) << i;
      EXPECT_EQ(some->ImageValues(static_cast<int64_t>(i)), all->ImageValues(rows[i])) << i;
    }
    const std::vector<uint8_t> good = ReadRaw(images);
    auto damaged = [&](std::vector<uint8_t> bytes) {
      WriteRaw(images, bytes);
      Result<Dataset> whole = LoadIdxPair(images, label_file, 10);
      Result<Dataset> streamed = LoadIdxPairRows(images, label_file, {0, 1}, 10);
      EXPECT_FALSE(whole.ok());
      EXPECT_FALSE(streamed.ok());
      EXPECT_EQ(streamed.status().code(), whole.status().code()) << streamed.status().message();
      EXPECT_NE(streamed.status().message().find(images), std::string::npos) << streamed.status().message();
      return streamed.status().message();
    };
    std::vector<uint8_t> bytes = good;
    bytes.resize(bytes.size() / 2);
    EXPECT_NE(damaged(bytes).find("truncated"), std::string::npos);
    if (std::string(suffix).empty()) {
      bytes = good;
      bytes.push_back(7);
      EXPECT_NE(damaged(bytes).find("trailing data"), std::string::npos);
      bytes = good;
      bytes.resize(10);
      EXPECT_NE(damaged(bytes).find("header"), std::string::npos);
    } else {
      bytes = good;
      for (size_t i = 12; i < bytes.size() - 8; ++i) bytes[i] ^= 0x5a;
      damaged(bytes);
    }
    WriteRaw(images, good);
  }
}

// A 16-byte image file whose header promises 64 images of 32768x32768 (64 GiB), with a
// matching label file: the row loaders refuse it as truncated without setting aside room for
// the promise, whether the file is plain (its size is known) or gzip (the buffer grows only as
// rows arrive).
TEST_F(IdxFilesTest, AHeaderPromisingMoreThanTheFileHoldsIsRefusedBeforeAllocating) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<uint8_t> header;
  for (uint32_t v : {0x00000803u, 64u, 32768u, 32768u}) Append32(header, v);
  std::vector<uint8_t> labels;
  for (uint32_t v : {0x00000801u, 64u}) Append32(labels, v);
  labels.resize(labels.size() + 64, 3);
  for (const char* suffix : {"", ".gz"}) {
    SCOPED_TRACE(suffix);
    const std::string images = Path(std::string("img") + suffix), label_file = Path(std::string("lbl") + suffix);
    ASSERT_TRUE(WriteMaybeGzipFile(images, header).ok());
    ASSERT_TRUE(WriteMaybeGzipFile(label_file, labels).ok());
    EXPECT_EXIT(
        {
          CapAddressSpace(uint64_t{1} << 30);
          for (Result<Dataset> data :
               {LoadIdxPairFirst(images, label_file, 0), LoadIdxPairRows(images, label_file, {63, 0})}) {
            const std::string message = data.status().message();
            std::fprintf(stderr, "%s\n", data.status().ToString().c_str());
            if (data.ok() || data.status().code() != StatusCode::kDataLoss ||
                message.find(images) == std::string::npos || message.find("truncated") == std::string::npos) {
              std::exit(1);
            }
          }
          std::exit(0);
        },
        ::testing::ExitedWithCode(0), "");
  }
}

// A label file promising 8 labels that goes on for 512 MiB more: as a sparse plain file, and
// as gzip members of zeros after the real file (half a megabyte compressed). Each reader
// refuses it as trailing data, the plain file from its size and the gzip stream one byte past
// the promise, without holding the rest; the row loader's image file likewise.
TEST_F(IdxFilesTest, AFileLongerThanItsHeaderPromisesIsRefusedWithoutReadingItWhole) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr uint64_t kExtra = uint64_t{512} << 20;
  std::vector<uint8_t> labels;
  for (uint32_t v : {0x00000801u, 8u}) Append32(labels, v);
  labels.resize(labels.size() + 8, 1);
  std::vector<uint8_t> images;
  for (uint32_t v : {0x00000803u, 8u, 2u, 2u}) Append32(images, v);
  images.resize(images.size() + 32, 9);
  ASSERT_TRUE(WriteMaybeGzipFile(Path("zeros.gz"), std::vector<uint8_t>(1 << 20)).ok());
  const std::vector<uint8_t> zeros_member = ReadRaw(Path("zeros.gz"));
  auto bomb = [&](const std::string& name, const std::vector<uint8_t>& idx) {
    ASSERT_TRUE(WriteMaybeGzipFile(Path(name), idx).ok());
    std::vector<uint8_t> bytes = ReadRaw(Path(name));
    for (uint64_t i = 0; i < (kExtra >> 20); ++i) bytes.insert(bytes.end(), zeros_member.begin(), zeros_member.end());
    WriteRaw(Path(name), bytes);
  };
  bomb("lbl.gz", labels);
  bomb("img.gz", images);
  WriteRaw(Path("lbl"), labels);
  fs::resize_file(Path("lbl"), labels.size() + kExtra);
  WriteRaw(Path("img"), images);
  fs::resize_file(Path("img"), images.size() + kExtra);
  WriteRaw(Path("lbl-ok"), labels);

  // The number of readers that do not refuse their file as they should.
  auto misread = [&] {
    const std::vector<uint8_t> gzip_bytes = ReadRaw(Path("lbl.gz"));
    struct Case {
      std::string file, expect;
      Status status;
    };
    const Case cases[] = {
        {Path("lbl"), "expects 16 bytes, found 536870928", ReadIdxLabels(Path("lbl")).status()},
        {Path("lbl.gz"), "expects 16 bytes, found 17 or more", ReadIdxLabels(Path("lbl.gz")).status()},
        {"in-memory", "expects 16 bytes, found 17 or more", ParseIdxLabels(gzip_bytes, "in-memory").status()},
        {Path("img"), "expects 48 bytes, found 536870960", LoadIdxPairFirst(Path("img"), Path("lbl-ok"), 0).status()},
        {Path("img.gz"), "expects 48 bytes, found 49 or more",
         LoadIdxPairRows(Path("img.gz"), Path("lbl-ok"), {1}).status()},
        {Path("img.gz"), "expects 48 bytes, found 49 or more", ReadIdxImages(Path("img.gz")).status()},
    };
    int bad = 0;
    for (const Case& c : cases) {
      const std::string& message = c.status.message();
      std::fprintf(stderr, "%s\n", c.status.ToString().c_str());
      bad += c.status.code() != StatusCode::kDataLoss || message.find(c.file) == std::string::npos ||
             message.find("trailing data") == std::string::npos || message.find(c.expect) == std::string::npos;
    }
    return bad;
  };
  EXPECT_EXIT(
      {
        CapAddressSpace(uint64_t{256} << 20);
        std::exit(misread());
      },
      ::testing::ExitedWithCode(0), "");
}

// A sparse image file of the size its header promises, 5 GiB of pixels: read whole, the reader
// set aside the promise (std::bad_alloc killed the coordinator inspecting a dataset), and a gzip
// stream of it would have grown its buffer as far as it inflated. Both are refused by the header.
TEST_F(IdxFilesTest, AFileReadWholeHoldsAtMostFourGiB) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<uint8_t> header;
  for (uint32_t v : {0x00000803u, 5u, 32768u, 32768u}) Append32(header, v);
  WriteRaw(Path("img"), header);
  fs::resize_file(Path("img"), header.size() + (uint64_t{5} << 30));
  ASSERT_TRUE(WriteMaybeGzipFile(Path("img.gz"), header).ok());
  std::vector<uint8_t> labels;
  for (uint32_t v : {0x00000801u, 5u}) Append32(labels, v);
  labels.resize(labels.size() + 5, 1);
  WriteRaw(Path("lbl"), labels);
  EXPECT_EXIT(
      {
        CapAddressSpace(uint64_t{1} << 30);
        int bad = 0;
        for (const std::string& images : {Path("img"), Path("img.gz")}) {
          for (const Status& status : {ReadIdxImages(images).status(), LoadIdxPair(images, Path("lbl")).status()}) {
            std::fprintf(stderr, "%s\n", status.ToString().c_str());
            bad += status.code() != StatusCode::kInvalidArgument ||
                   status.message().find(images + ": header [5x32768x32768] promises 5368709120 bytes of elements; "
                                                  "a file read whole may hold at most 4294967296") == std::string::npos;
          }
        }
        std::exit(bad);
      },
      ::testing::ExitedWithCode(0), "");
}

// 2^20 x 2^20 x 2^24 elements is 2^64, which wrapped to 0 in the product and made a 16-byte
// file look complete; the product is checked before each step can wrap.
TEST_F(IdxFilesTest, HeaderDimensionsWhoseProductWrapsAreRefused) {
  std::vector<uint8_t> header;
  for (uint32_t v : {0x00000803u, 1u << 20, 1u << 20, 1u << 24}) Append32(header, v);
  Result<IdxImages> images = ParseIdxImages(header, "wrapping-images");
  ASSERT_FALSE(images.ok());
  EXPECT_EQ(images.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(images.status().message().find("wrapping-images: header dimensions [1048576x1048576x16777216] are "
                                           "implausibly large: expected at most 2^40 elements"),
            std::string::npos)
      << images.status().message();
}

TEST_F(IdxFilesTest, ReadMaybeGzipFileStopsOneBytePastItsLimit) {
  WriteSmall("img.gz", "lbl", 10);
  Result<std::vector<uint8_t>> whole = ReadMaybeGzipFile(Path("img.gz"), 136);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->size(), 136u);
  Result<std::vector<uint8_t>> unlimited = ReadMaybeGzipFile(Path("img.gz"), UINT64_MAX);
  ASSERT_TRUE(unlimited.ok()) << unlimited.status().ToString();
  EXPECT_EQ(unlimited->size(), 136u);
  for (const char* name : {"img.gz", "lbl"}) {
    Result<std::vector<uint8_t>> cut = ReadMaybeGzipFile(Path(name), 12);
    ASSERT_FALSE(cut.ok());
    EXPECT_EQ(cut.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(cut.status().message().find(Path(name)), std::string::npos) << cut.status().message();
    EXPECT_NE(cut.status().message().find("the limit is 12"), std::string::npos) << cut.status().message();
  }
}

// A FIFO where a file should be (a job's data.path names the directory) held the reader's
// open until a writer came, which might be never. It is refused as not a regular file, as a
// directory is. A writer waits on the FIFO here so that a reader that does block is let
// through, and fails the test.
TEST_F(IdxFilesTest, AFifoOrADirectoryInPlaceOfAFileIsRefusedWithoutWaitingForAWriter) {
  WriteSmall("img", "lbl", 4);
  const std::string fifo = Path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] {
    const int fd = open(fifo.c_str(), O_WRONLY | O_CLOEXEC);  // until some reader opens it
    if (fd >= 0) close(fd);
  });
  const Status labels = ReadIdxLabels(fifo).status();
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // lets the writer go
  writer.join();
  if (reader >= 0) close(reader);
  EXPECT_EQ(labels.code(), StatusCode::kInvalidArgument) << labels.ToString();
  EXPECT_EQ(labels.message(), fifo + ": not a regular file");

  fs::create_directories(Path("dir"));
  const Status rows = LoadIdxPairRows(Path("dir"), Path("lbl"), {0, 1}).status();
  EXPECT_EQ(rows.code(), StatusCode::kInvalidArgument) << rows.ToString();
  EXPECT_EQ(rows.message(), Path("dir") + ": not a regular file");
}

// A pair of files holding no images was read as a split of no samples: a coordinator
// evaluated every round on it, scoring 0 on 0 samples, and a worker's own files (local-files)
// sent updates of 0 samples, which the coordinator refuses as malformed. Every loader of a
// pair refuses it, naming the image file.
TEST_F(IdxFilesTest, APairOfNoImagesIsRefusedByEveryPairLoader) {
  ASSERT_TRUE(WriteIdxPair(Path("t10k-images-idx3-ubyte"), Path("t10k-labels-idx1-ubyte"), 28, 28, {}, {}).ok());
  const std::string images = Path("t10k-images-idx3-ubyte"), labels = Path("t10k-labels-idx1-ubyte");
  const std::string expected = images + ": holds no images; expected at least one";
  const Status statuses[] = {
      LoadFashionMnist(dir_.string(), /*train=*/false).status(),
      LoadIdxPair(images, labels).status(),
      LoadIdxPairFirst(images, labels, 0).status(),
      LoadIdxPairRows(images, labels, {}).status(),
  };
  for (const Status& status : statuses) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
    EXPECT_EQ(status.message(), expected);
  }
  // The files alone still read as empty.
  Result<IdxImages> alone = ReadIdxImages(images);
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  EXPECT_EQ(alone->count, 0);
}

TEST_F(IdxFilesTest, WrongMagicIsInvalidArgument) {
  WriteSmall("img", "lbl", 10);
  // The label file where the image file belongs.
  Result<Dataset> data = LoadIdxPair(Path("lbl"), Path("lbl"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument);
  const std::string& message = data.status().message();
  EXPECT_NE(message.find(Path("lbl")), std::string::npos) << message;
  EXPECT_NE(message.find("expected 0x00000803"), std::string::npos) << message;
  EXPECT_NE(message.find("found 0x00000801"), std::string::npos) << message;

  WriteRaw(Path("junk"), std::vector<uint8_t>(64, 0xff));
  Result<std::vector<uint8_t>> labels = ReadIdxLabels(Path("junk"));
  ASSERT_FALSE(labels.ok());
  EXPECT_EQ(labels.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(labels.status().message().find("found 0xffffffff"), std::string::npos) << labels.status().message();
}

TEST_F(IdxFilesTest, CountMismatchNamesBothFiles) {
  WriteSmall("img5", "lbl5", 5);
  WriteSmall("img4", "lbl4", 4);
  Result<Dataset> data = LoadIdxPair(Path("img5"), Path("lbl4"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument);
  const std::string& message = data.status().message();
  EXPECT_NE(message.find(Path("img5")), std::string::npos) << message;
  EXPECT_NE(message.find(Path("lbl4")), std::string::npos) << message;
  EXPECT_NE(message.find("5 images"), std::string::npos) << message;
  EXPECT_NE(message.find("4 labels"), std::string::npos) << message;
}

TEST_F(IdxFilesTest, LabelOutOfRangeIsInvalidArgument) {
  std::vector<uint8_t> pixels(3 * 4, 0);
  ASSERT_TRUE(WriteIdxPair(Path("img"), Path("lbl"), 2, 2, pixels, {1, 10, 2}).ok());
  Result<Dataset> data = LoadIdxPair(Path("img"), Path("lbl"));
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument);
  const std::string& message = data.status().message();
  EXPECT_NE(message.find(Path("lbl")), std::string::npos) << message;
  EXPECT_NE(message.find("label 10 at index 1"), std::string::npos) << message;
  // With more classes the same files are fine.
  EXPECT_TRUE(LoadIdxPair(Path("img"), Path("lbl"), 11).ok());
}

TEST_F(IdxFilesTest, WriteRefusesWrongPixelCount) {
  Status status = WriteIdxPair(Path("img"), Path("lbl"), 2, 2, std::vector<uint8_t>(7), {1, 2});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
}

TEST_F(IdxFilesTest, FashionMnistAcceptsUncompressedNames) {
  WriteSmall("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", 12);
  Result<Dataset> test = LoadFashionMnist(dir_.string(), /*train=*/false);
  ASSERT_TRUE(test.ok()) << test.status().ToString();
  EXPECT_EQ(test->count, 12);
  Result<Dataset> train = LoadFashionMnist(dir_.string(), /*train=*/true);
  ASSERT_FALSE(train.ok());
  EXPECT_EQ(train.status().code(), StatusCode::kNotFound);
  EXPECT_NE(train.status().message().find("train-images-idx3-ubyte.gz"), std::string::npos)
      << train.status().message();
}

TEST_F(IdxFilesTest, SubsetAndTakeFirst) {
  WriteSmall("img", "lbl", 20);
  Result<Dataset> data = LoadIdxPair(Path("img"), Path("lbl"));
  ASSERT_TRUE(data.ok());
  Result<Dataset> subset = Subset(*data, {7, 3, 7});
  ASSERT_TRUE(subset.ok()) << subset.status().ToString();
  EXPECT_EQ(subset->count, 3);
  EXPECT_EQ(subset->labels, (std::vector<uint8_t>{7, 3, 7}));
  EXPECT_EQ(subset->ImageValues(1), data->ImageValues(3));
  // Bytes stay bytes: the subset holds 3 x 12 pixels, not floats.
  EXPECT_TRUE(subset->EightBit());
  EXPECT_EQ(subset->pixels.size(), size_t{3 * 12});
  EXPECT_TRUE(subset->images.empty());
  EXPECT_EQ(subset->SampleBytes(), size_t{3 * 12});
  Result<Dataset> bad = Subset(*data, {1, 20});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(bad.status().message().find("index 20"), std::string::npos) << bad.status().message();

  Dataset head = TakeFirst(*data, 6);
  EXPECT_EQ(head.count, 6);
  EXPECT_EQ(head.Values().size(), size_t{6 * 12});
  EXPECT_EQ(head.ImageValues(5), data->ImageValues(5));
  EXPECT_TRUE(head.EightBit());
  // A dataset of floats is cut as floats.
  Dataset floats = *data;
  floats.images = data->Values();
  floats.pixels.clear();
  Result<Dataset> float_subset = Subset(floats, {7, 3, 7});
  ASSERT_TRUE(float_subset.ok());
  EXPECT_FALSE(float_subset->EightBit());
  EXPECT_EQ(float_subset->Values(), subset->Values());
  EXPECT_EQ(TakeFirst(floats, 6).Values(), head.Values());
  EXPECT_EQ(head.labels.size(), size_t{6});
  EXPECT_EQ(TakeFirst(*data, 0).count, 20);
  EXPECT_EQ(TakeFirst(*data, 1000).count, 20);
}

}  // namespace
}  // namespace tessera
