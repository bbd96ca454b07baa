// NumPy's .npy and .npz formats: round trips, files NumPy itself wrote (committed under
// tests/core/testdata/numpy, made by tests/core/testdata/numpy/make.py with numpy 1.24), and
// hostile files refused with a message naming what is wrong.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "core/data/numpy_format.h"
#include "tests/address_space.h"

namespace tessera {
namespace {

using testing::CapAddressSpace;

const std::string kData = std::string(TESSERA_SOURCE_DIR) + "/tests/core/testdata/numpy/";

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

NamedTensor Tensor(std::string name, std::vector<int64_t> shape, std::vector<float> values) {
  NamedTensor t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.values = std::move(values);
  return t;
}

TEST(NumpyFormatTest, TensorSetRoundTripsThroughAnArchive) {
  TensorSet set = {Tensor("conv1.weight", {2, 1, 1, 2}, {1.5f, -2.f, 3.25f, 0.f}), Tensor("conv1.bias", {2}, {7.f, -8.f}),
                   Tensor("scalar", {}, {42.f})};
  auto bytes = EncodeNpz(ToNumpy(set));
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto arrays = ParseNpz(*bytes, "round trip");
  ASSERT_TRUE(arrays.ok()) << arrays.status().ToString();
  ASSERT_EQ(arrays->size(), 3u);
  for (size_t i = 0; i < set.size(); ++i) {
    auto tensor = ToTensor((*arrays)[i], "round trip");
    ASSERT_TRUE(tensor.ok()) << tensor.status().ToString();
    EXPECT_EQ(tensor->name, set[i].name);
    EXPECT_EQ(tensor->shape, set[i].shape);
    EXPECT_EQ(tensor->values, set[i].values);
  }
}

TEST(NumpyFormatTest, HeaderIsPaddedToSixtyFourBytes) {
  NumpyArray a;
  a.dtype = "<f4";
  a.shape = {3};
  a.data = std::string(12, '\0');
  const std::string npy = EncodeNpy(a);
  EXPECT_EQ((npy.size() - 12) % 64, 0u);
  EXPECT_NE(npy.find("'shape': (3,)"), std::string::npos) << npy.substr(0, 80);
}

TEST(NumpyFormatTest, ReadsWhatNumpySavezWrote) {
  // np.savez(path, weights=np.arange(6, dtype=np.float32).reshape(2, 3), labels=np.array([0, 9, 3], np.uint8),
  //          ids=np.array([-1, 2**40], np.int64), f64=np.array([0.5, -1.25]))
  for (const char* file : {"savez.npz", "savez_compressed.npz"}) {
    SCOPED_TRACE(file);
    auto arrays = ReadNpz(kData + file);
    ASSERT_TRUE(arrays.ok()) << arrays.status().ToString();
    ASSERT_EQ(arrays->size(), 4u);
    std::map<std::string, NumpyArray> by_name;
    for (auto& a : *arrays) by_name[a.name] = a;
    ASSERT_EQ(by_name.count("weights"), 1u);
    EXPECT_EQ(by_name["weights"].dtype, "<f4");
    EXPECT_EQ(by_name["weights"].shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(*by_name["weights"].ToFloat32("weights"), (std::vector<float>{0, 1, 2, 3, 4, 5}));
    EXPECT_EQ(by_name["labels"].dtype, "|u1");
    EXPECT_EQ(*by_name["labels"].ToInt64("labels"), (std::vector<int64_t>{0, 9, 3}));
    EXPECT_EQ(*by_name["ids"].ToInt64("ids"), (std::vector<int64_t>{-1, int64_t{1} << 40}));
    EXPECT_EQ(*by_name["f64"].ToFloat32("f64"), (std::vector<float>{0.5f, -1.25f}));
  }
}

TEST(NumpyFormatTest, ReadsANpyNumpyWrote) {
  // np.save(path, np.array([[1, 2], [3, 4]], dtype=np.int32))
  auto a = ReadNpy(kData + "int32.npy");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(*a->ToInt64("int32"), (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST(NumpyFormatTest, NumpyCanReadWhatWeWrite) {
  // The archive written here is byte-for-byte what make.py checked numpy reads back
  // (tests/core/testdata/numpy/written.npz was produced by this encoder and loaded by numpy).
  TensorSet set = {Tensor("a", {2}, {1.f, 2.f}), Tensor("b.c", {1, 1}, {-3.f})};
  auto bytes = EncodeNpz(ToNumpy(set));
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, Slurp(kData + "written.npz"));
}

TEST(NumpyFormatTest, RefusesHostileFiles) {
  NumpyArray a;
  a.dtype = "<f4";
  a.shape = {4};
  a.data = std::string(16, '\0');
  const std::string good = EncodeNpy(a);
  struct Case {
    std::string bytes, expect;
  };
  std::string big_shape = good;
  big_shape.replace(big_shape.find("(4,)"), 4, "(99999999999,)");
  big_shape.resize(good.size());
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  std::string big_endian = good;
  big_endian.replace(big_endian.find("<f4"), 3, ">f4");
  std::string short_data = good.substr(0, good.size() - 4);
  std::string long_header = good;
  long_header[8] = '\xff';
  long_header[9] = '\xff';
  const Case cases[] = {
      {"not numpy at all", "not a .npy file"},
      {big_shape, "exceeds"},
      {fortran, "Fortran-order"},
      {big_endian, "not supported"},
      {short_data, "needs 16 data bytes, the file has 12"},
      {long_header, "does not fit"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseNpy(c.bytes, "hostile.npy", 1 << 20);
    ASSERT_FALSE(parsed.ok()) << c.expect;
    EXPECT_NE(parsed.status().message().find(c.expect), std::string::npos) << parsed.status().message();
    EXPECT_NE(parsed.status().message().find("hostile.npy"), std::string::npos);
  }
}

TEST(NumpyFormatTest, RefusesDamagedArchives) {
  TensorSet set = {Tensor("a", {64}, std::vector<float>(64, 1.f))};
  std::string bytes = *EncodeNpz(ToNumpy(set));
  std::string flipped = bytes;
  flipped[200] ^= 0x40;  // inside the array's bytes
  auto damaged = ParseNpz(flipped, "flipped.npz");
  ASSERT_FALSE(damaged.ok());
  EXPECT_NE(damaged.status().message().find("CRC-32 mismatch"), std::string::npos) << damaged.status().message();

  auto truncated = ParseNpz(bytes.substr(0, bytes.size() - 30), "truncated.npz");
  ASSERT_FALSE(truncated.ok());

  auto limited = ParseNpz(bytes, "limited.npz", 100);
  ASSERT_FALSE(limited.ok());
  EXPECT_NE(limited.status().message().find("limit"), std::string::npos) << limited.status().message();

  auto twice = EncodeNpz({ToNumpy(set[0]), ToNumpy(set[0])});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("twice"), std::string::npos);
}

// 65,534 arrays fit an archive without zip64 and read back; 65,535 is the count's zip64 mark,
// so the encoder refuses it rather than write an archive that readers take for zip64.
TEST(NumpyFormatTest, AnArchiveWithoutZip64HoldsAtMost65534ArraysAndReadsBack) {
  std::vector<NumpyArray> arrays(65534);
  for (size_t i = 0; i < arrays.size(); ++i) {
    arrays[i].name = "a" + std::to_string(i);
    arrays[i].dtype = "<f4";
    arrays[i].shape = {1};
    arrays[i].data.assign(4, '\0');
  }
  auto most = EncodeNpz(arrays);
  ASSERT_TRUE(most.ok()) << most.status().ToString();
  auto read = ParseNpz(*most, "most.npz");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->size(), 65534u);
  arrays.push_back(arrays.back());
  arrays.back().name = "one-more";
  auto over = EncodeNpz(arrays);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().message(), "npz: too many arrays or bytes for an archive without zip64");
}

// A deflated member whose directory claims 3 GiB (under the 4 GiB default limit) but whose
// data is a few hundred bytes is refused as damaged without setting 3 GiB aside first.
TEST(NumpyFormatTest, ADeflatedMemberClaimingGigabytesIsRefusedWithoutAllocatingThem) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::string bytes = *EncodeNpz(ToNumpy(TensorSet{Tensor("a", {64}, std::vector<float>(64, 1.f))}));
  const size_t central = bytes.find(std::string("PK\x01\x02", 4));
  ASSERT_NE(central, std::string::npos);
  bytes[central + 10] = 8;  // deflated: the stored bytes are taken for deflate data
  const uint32_t claimed = 3u << 30;
  for (int i = 0; i < 4; ++i) bytes[central + 24 + i] = static_cast<char>(claimed >> (8 * i));
  EXPECT_EXIT(
      {
        CapAddressSpace(uint64_t{1} << 30);
        auto parsed = ParseNpz(bytes, "bomb.npz");
        std::fprintf(stderr, "%s\n", parsed.status().ToString().c_str());
        const std::string message = parsed.status().message();
        std::exit(!parsed.ok() && parsed.status().code() == StatusCode::kInvalidArgument &&
                          message.find("bomb.npz") != std::string::npos &&
                          message.find("deflate data is damaged") != std::string::npos
                      ? 0
                      : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(NumpyFormatTest, WriteNpzReplacesTheFileAtomically) {
  const std::string path = ::testing::TempDir() + "/export.npz";
  ASSERT_TRUE(WriteNpz(path, ToNumpy(TensorSet{Tensor("x", {1}, {2.f})})).ok());
  auto back = ReadNpz(path);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->at(0).name, "x");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::remove(path.c_str());
}

// A FIFO where an archive should be (a trainer's "out", a data path) held the reader's open
// until a writer came, which might be never. It is refused as not a regular file. A writer
// waits on it here so that a reader that does block is let through, and fails the test.
TEST(NumpyFormatTest, AFifoInPlaceOfAnArchiveIsRefusedWithoutWaitingForAWriter) {
  const std::string path = ::testing::TempDir() + "/fifo-" + std::to_string(getpid()) + ".npz";
  std::remove(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  std::thread writer([&] {
    const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);  // until some reader opens it
    if (fd >= 0) close(fd);
  });
  const Status read = ReadNpz(path).status();
  EXPECT_EQ(read.code(), StatusCode::kInvalidArgument) << read.ToString();
  EXPECT_EQ(read.message(), path + ": not a regular file");
  const int reader = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // lets the writer go
  writer.join();
  if (reader >= 0) close(reader);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tessera
