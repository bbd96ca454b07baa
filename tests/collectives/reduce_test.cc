// The host reduction kernels (collectives/reduce.h) and what ranks see of them: max and min
// agree bit for bit whichever operand comes first, so every rank of a recursive-doubling
// allreduce ends with the same bytes; averages divide without trapping whatever the rank
// count, and a float16 average does not overflow where the float16 sum would.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "collectives/reduce.h"
#include "test_backends.h"

namespace tessera::collectives::testing {
namespace {

template <typename T>
std::vector<uint8_t> Bits(const T& value) {
  std::vector<uint8_t> bits(sizeof(T));
  std::memcpy(bits.data(), &value, sizeof(T));
  return bits;
}

// op(a, b) and op(b, a) through ReduceElements, as their bytes.
template <typename T>
std::pair<std::vector<uint8_t>, std::vector<uint8_t>> BothWays(T a, T b, DataType type, ReduceOp op) {
  T ab, ba;
  ReduceElements(&ab, &a, &b, 1, type, op);
  ReduceElements(&ba, &b, &a, 1, type, op);
  return {Bits(ab), Bits(ba)};
}

template <typename T>
T WithBits(uint64_t bits) {
  T value;
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

TEST(ReduceTest, MaxAndMinGiveTheSameBitsWhicheverSideTheNanIsOn) {
  for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
    const std::string name(ReduceOpName(op));
    {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      auto [ab, ba] = BothWays(nan, 1.0f, DataType::kFloat32, op);
      EXPECT_EQ(ab, ba) << name << " float32";
      float result;
      std::memcpy(&result, ab.data(), sizeof(result));
      EXPECT_TRUE(std::isnan(result)) << name << " float32: a NaN on either side is NaN";
      // Two NaNs with different payloads: one canonical NaN, whichever comes first.
      auto [xy, yx] = BothWays(WithBits<float>(0x7fc00001u), WithBits<float>(0xffc00002u),
                               DataType::kFloat32, op);
      EXPECT_EQ(xy, yx) << name << " float32 NaN payloads";
    }
    {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      auto [ab, ba] = BothWays(-2.0, nan, DataType::kFloat64, op);
      EXPECT_EQ(ab, ba) << name << " float64";
      double result;
      std::memcpy(&result, ab.data(), sizeof(result));
      EXPECT_TRUE(std::isnan(result)) << name << " float64";
    }
    {
      const uint16_t nan = 0x7e00, one = 0x3c00;
      auto [ab, ba] = BothWays(nan, one, DataType::kFloat16, op);
      EXPECT_EQ(ab, ba) << name << " float16";
      uint16_t result;
      std::memcpy(&result, ab.data(), sizeof(result));
      EXPECT_TRUE(std::isnan(HalfToFloat(result))) << name << " float16";
    }
  }
}

TEST(ReduceTest, MaxRanksPositiveZeroAboveNegativeZeroWhicheverSideItIsOn) {
  auto [max_ab, max_ba] = BothWays(0.0f, -0.0f, DataType::kFloat32, ReduceOp::kMax);
  EXPECT_EQ(max_ab, max_ba);
  EXPECT_EQ(max_ab, Bits(0.0f));
  auto [min_ab, min_ba] = BothWays(0.0, -0.0, DataType::kFloat64, ReduceOp::kMin);
  EXPECT_EQ(min_ab, min_ba);
  EXPECT_EQ(min_ab, Bits(-0.0));
}

// A signed integer sum that passes its type's range wraps modulo 2^bits (what NCCL and MPI
// give in practice), without the undefined behaviour of a signed overflow (the sanitizer build
// stops on one).
TEST(ReduceTest, ASignedIntegerSumPastItsRangeWraps) {
  const int32_t a32[] = {std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(), 5};
  const int32_t b32[] = {1, -1, -7};
  int32_t sum32[3];
  ReduceElements(sum32, a32, b32, 3, DataType::kInt32, ReduceOp::kSum);
  EXPECT_EQ(sum32[0], std::numeric_limits<int32_t>::min());
  EXPECT_EQ(sum32[1], std::numeric_limits<int32_t>::max());
  EXPECT_EQ(sum32[2], -2);
  const int64_t a64[] = {std::numeric_limits<int64_t>::max(), -3};
  const int64_t b64[] = {2, 1};
  int64_t sum64[2];
  ReduceElements(sum64, a64, b64, 2, DataType::kInt64, ReduceOp::kSum);
  EXPECT_EQ(sum64[0], std::numeric_limits<int64_t>::min() + 1);
  EXPECT_EQ(sum64[1], -2);
}

TEST(ReduceTest, AveragingOver256RanksDividesUint8InsteadOfTrapping) {
  std::vector<uint8_t> bytes = {0, 255, 128};
  DivideElements(bytes.data(), bytes.size(), DataType::kUint8, 256);
  EXPECT_EQ(bytes, (std::vector<uint8_t>{0, 0, 0}));
  std::vector<uint8_t> small = {255, 100};
  DivideElements(small.data(), small.size(), DataType::kUint8, 300);
  EXPECT_EQ(small, (std::vector<uint8_t>{0, 0}));
  std::vector<int32_t> ints = {512, -512, 255};
  DivideElements(ints.data(), ints.size(), DataType::kInt32, 256);
  EXPECT_EQ(ints, (std::vector<int32_t>{2, -2, 0}));
  std::vector<int64_t> longs = {int64_t{1} << 40, -7};
  DivideElements(longs.data(), longs.size(), DataType::kInt64, 256);
  EXPECT_EQ(longs, (std::vector<int64_t>{int64_t{1} << 32, 0}));
}

// The backends whose host reductions are this layer's own: p2p natively, the fallback over
// send/recv, and gloo (float16 averages composed from its float32 ones) where it is built.
std::vector<std::string> HostBackends() {
  std::vector<std::string> backends = {"p2p", "sendrecv-local"};
  if (SkipReason("gloo").empty()) backends.push_back("gloo");
  return backends;
}

TEST(AllreduceTest, MaxAndMinWithANanOnOneRankGiveTheSameBytesOnEveryRank) {
  for (const std::string& backend : HostBackends()) {
    for (int n : {2, 3}) {
      for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
        World world(n, RankMode::kThreads);
        std::vector<std::vector<float>> floats(n);
        std::vector<std::vector<uint16_t>> halves(n);
        auto results = RunRanks(n, RankMode::kThreads, [&](int rank) -> Status {
          ASSIGN_OR_RETURN(auto c, world.Create(backend, rank, 20000));
          // Element 0: NaN on rank 1 only; element 1: +0 on rank 0, -0 elsewhere.
          const float nan = std::numeric_limits<float>::quiet_NaN();
          std::vector<float> data = {rank == 1 ? nan : static_cast<float>(rank), rank == 0 ? 0.0f : -0.0f,
                                     static_cast<float>(rank)};
          RETURN_IF_ERROR(c->Allreduce(data.data(), data.data(), data.size(), DataType::kFloat32, op));
          floats[rank] = data;
          std::vector<uint16_t> half = {rank == 1 ? uint16_t{0x7e00} : FloatToHalf(static_cast<float>(rank)),
                                        FloatToHalf(static_cast<float>(rank))};
          RETURN_IF_ERROR(c->Allreduce(half.data(), half.data(), half.size(), DataType::kFloat16, op));
          halves[rank] = half;
          return Status::Ok();
        });
        const std::string what = backend + ", " + std::to_string(n) + " ranks, " + std::string(ReduceOpName(op));
        for (int rank = 0; rank < n; ++rank) ASSERT_TRUE(results[rank].ok()) << what << ": " << results[rank].ToString();
        EXPECT_TRUE(std::isnan(floats[0][0])) << what;
        EXPECT_EQ(Bits(floats[0][1]), Bits(op == ReduceOp::kMax ? 0.0f : -0.0f)) << what;
        EXPECT_TRUE(std::isnan(HalfToFloat(halves[0][0]))) << what;
        for (int rank = 1; rank < n; ++rank) {
          EXPECT_EQ(std::memcmp(floats[0].data(), floats[rank].data(), floats[0].size() * sizeof(float)), 0)
              << what << ": rank " << rank << " differs from rank 0";
          EXPECT_EQ(halves[0], halves[rank]) << what << ": rank " << rank << " differs from rank 0";
        }
      }
    }
  }
}

TEST(AllreduceTest, AFloat16AverageWhoseSumOverflowsFloat16IsExact) {
  // 32768 + 40000 + 47232 = 120000 is past float16's 65504; the average, 40000, is not.
  const float values[3] = {32768.0f, 40000.0f, 47232.0f};
  const uint16_t average = FloatToHalf(40000.0f);
  for (const std::string& backend : HostBackends()) {
    // 7 elements take recursive doubling; 50000 (100 KB) the ring.
    for (size_t count : {size_t{7}, size_t{50000}}) {
      World world(3, RankMode::kThreads);
      auto results = RunRanks(3, RankMode::kThreads, [&](int rank) -> Status {
        ASSIGN_OR_RETURN(auto c, world.Create(backend, rank, 20000));
        std::vector<uint16_t> data(count, FloatToHalf(values[rank]));
        RETURN_IF_ERROR(c->Allreduce(data.data(), data.data(), count, DataType::kFloat16, ReduceOp::kAvg));
        for (size_t i = 0; i < count; ++i) {
          if (data[i] != average) {
            return InternalError("allreduce element " + std::to_string(i) + " is " +
                                 std::to_string(HalfToFloat(data[i])));
          }
        }
        std::vector<uint16_t> all(count * 3, FloatToHalf(values[rank])), mine(count);
        RETURN_IF_ERROR(c->ReduceScatter(all.data(), mine.data(), count, DataType::kFloat16, ReduceOp::kAvg));
        for (size_t i = 0; i < count; ++i) {
          if (mine[i] != average) {
            return InternalError("reduce_scatter element " + std::to_string(i) + " is " +
                                 std::to_string(HalfToFloat(mine[i])));
          }
        }
        return Status::Ok();
      });
      for (int rank = 0; rank < 3; ++rank) {
        EXPECT_TRUE(results[rank].ok()) << backend << " count " << count << " rank " << rank << ": "
                                        << results[rank].ToString();
      }
    }
  }
}

}  // namespace
}  // namespace tessera::collectives::testing
