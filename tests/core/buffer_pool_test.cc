#include "core/buffer_pool.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(FloatBufferPoolTest, ABufferGivenBackIsTakenAgainForItsSizeOnly) {
  FloatBufferPool pool(1 << 20);
  std::vector<float> first = pool.Take(1000);
  ASSERT_EQ(first.size(), 1000u);
  EXPECT_EQ(first[0], 0.0f);  // a new buffer is zero-filled
  first[0] = 7;
  const float* storage = first.data();
  pool.Give(std::move(first));
  EXPECT_EQ(pool.idle_bytes(), 4000u);

  std::vector<float> other = pool.Take(999);  // another size: a new buffer
  EXPECT_NE(other.data(), storage);
  std::vector<float> again = pool.Take(1000);
  EXPECT_EQ(again.data(), storage);  // the same memory, as it was left
  EXPECT_EQ(again[0], 7.0f);
  EXPECT_EQ(pool.idle_bytes(), 0u);
}

TEST(FloatBufferPoolTest, KeepsNoMoreIdleBytesThanItsBoundAndClearFreesThem) {
  FloatBufferPool pool(10000);  // two buffers of 1,000 values, not three
  std::vector<std::vector<float>> taken;
  for (int i = 0; i < 3; ++i) taken.push_back(pool.Take(1000));
  for (auto& buffer : taken) pool.Give(std::move(buffer));
  EXPECT_EQ(pool.idle_bytes(), 8000u);
  pool.Clear();
  EXPECT_EQ(pool.idle_bytes(), 0u);
}

TEST(FloatBufferPoolTest, ATensorSetGoesBackWholeAndEmptyOrOversizedBuffersAreNotKept) {
  FloatBufferPool pool(1 << 20);
  TensorSet set = {{"w", {2, 3}, pool.Take(6)}, {"b", {3}, pool.Take(3)}};
  pool.Give(std::move(set));
  EXPECT_TRUE(set.empty());
  EXPECT_EQ(pool.idle_bytes(), 36u);
  pool.Give(std::vector<float>());  // nothing to keep
  std::vector<float> grown;
  grown.reserve(100);
  grown.resize(10);  // its capacity is not its size: it would hand out more memory than asked
  pool.Give(std::move(grown));
  EXPECT_EQ(pool.idle_bytes(), 36u);
}

}  // namespace
}  // namespace tessera
