// StreamingCopy (core/streaming_copy.h) against memcpy: every byte at every alignment of
// either side, lengths around its 16- and 64-byte steps, and nothing written past the end.
#include "core/streaming_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace tessera {
namespace {

TEST(StreamingCopyTest, CopiesEveryByteAtAnyAlignmentAndLengthAndNothingBeyond) {
  constexpr size_t kMax = 300;
  std::vector<uint8_t> source(kMax + 64);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 37 + 11);
  for (size_t src_at = 0; src_at < 17; ++src_at) {
    for (size_t dst_at = 0; dst_at < 33; ++dst_at) {
      for (size_t n : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257, 300}) {
        std::vector<uint8_t> dst(kMax + 64, 0xEE);
        StreamingCopy(dst.data() + dst_at, source.data() + src_at, n);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= dst_at && i < dst_at + n;
          const uint8_t want = inside ? source[src_at + i - dst_at] : 0xEE;
          ASSERT_EQ(dst[i], want) << "byte " << i << " of a copy of " << n << " bytes from offset " << src_at
                                  << " to offset " << dst_at;
        }
      }
    }
  }
}

TEST(StreamingCopyTest, ALargeCopyIsTheSourceByteForByte) {
  std::vector<float> source(1 << 20);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<float>(i) * 0.25f - 7.0f;
  std::vector<float> copy(source.size(), 0.0f);
  StreamingCopy(copy.data(), source.data(), source.size() * sizeof(float));
  EXPECT_EQ(copy, source);
}

}  // namespace
}  // namespace tessera
