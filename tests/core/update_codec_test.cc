// The update encodings (core/update_codec.h): bit patterns computed by hand from IEEE 754
// binary16 and bfloat16, int8's scale and values, top-k's choice and error feedback over two
// steps, and decoders given hostile bytes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/update_codec.h"

namespace tessera {
namespace {

float Bits(uint32_t bits) { return std::bit_cast<float>(bits); }

std::string LittleEndian32(uint32_t v) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

TEST(Float16Test, KnownValuesRoundToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(0.1f), 0x2e66);         // 0.0999755859375
  EXPECT_EQ(FloatToHalf(1.0f / 3.0f), 0x3555);  // 0.333251953125
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);     // the largest finite binary16
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);     // below the halfway point to 65536
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);     // halfway, 0x7bff is odd: up, to inf
  // Halfway between 1 and 1 + 2^-10 goes to the even 1; between 1 + 2^-10 and 1 + 2^-9 up.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);  // past halfway
  // Subnormals in units of 2^-24: 2^-25 is halfway to 0 and goes to even 0; 1.5 x 2^-25 up.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalf(-std::ldexp(3.0f, -24)), 0x8003);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(FloatToHalf(Bits(0x00000001)), 0x0000);  // a float32 subnormal
  // The largest subnormal plus half a unit carries into the smallest normal, 2^-14.
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.5f, -24)), 0x0400);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);
  // Infinities and NaN.
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  const uint16_t nan = FloatToHalf(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  EXPECT_NE(FloatToHalf(Bits(0x7f800001)) & 0x03ff, 0) << "a signalling NaN must not become inf";
}

TEST(Float16Test, DecodesEveryPatternAndRoundTripsExactly) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(std::bit_cast<uint32_t>(HalfToFloat(0x8000)), 0x80000000u);
  EXPECT_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  // Every binary16 value that is not NaN survives float32 and back bit for bit.
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
}

TEST(BFloat16Test, KnownValuesRoundToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBFloat16(Bits(0x40490fdb)), 0x4049);  // pi: the lower half is below halfway
  EXPECT_EQ(FloatToBFloat16(Bits(0x3f808000)), 0x3f80);  // halfway, 0x3f80 even: down
  EXPECT_EQ(FloatToBFloat16(Bits(0x3f818000)), 0x3f82);  // halfway, 0x3f81 odd: up
  EXPECT_EQ(FloatToBFloat16(Bits(0x3f808001)), 0x3f81);  // past halfway
  EXPECT_EQ(FloatToBFloat16(Bits(0x7f7fffff)), 0x7f80);  // the largest float rounds to inf
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()), 0x7fc0);
  EXPECT_EQ(FloatToBFloat16(Bits(0x7f800001)), 0x7fc0) << "a signalling NaN must not become inf";
  EXPECT_EQ(BFloat16ToFloat(0x4049), Bits(0x40490000));
  EXPECT_EQ(BFloat16ToFloat(0xff80), -std::numeric_limits<float>::infinity());
}

TEST(Int8Test, OneScalePerTensorAndSymmetricValues) {
  const std::vector<float> values = {0.5f, -1.27f, 0.01f, 1.27f, 0.0f};
  const std::string bytes = EncodeValues(UpdateEncoding::kInt8, values, 0);
  ASSERT_EQ(bytes.size(), 4u + values.size());
  const float scale = 1.27f / 127.0f;
  EXPECT_EQ(bytes.substr(0, 4), LittleEndian32(std::bit_cast<uint32_t>(scale)));
  EXPECT_EQ(static_cast<int8_t>(bytes[4]), 50);
  EXPECT_EQ(static_cast<int8_t>(bytes[5]), -127);
  EXPECT_EQ(static_cast<int8_t>(bytes[6]), 1);
  EXPECT_EQ(static_cast<int8_t>(bytes[7]), 127);
  EXPECT_EQ(static_cast<int8_t>(bytes[8]), 0);
  std::vector<float> back(values.size());
  ASSERT_TRUE(DecodeValues(UpdateEncoding::kInt8, bytes, 0, back).ok());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_NEAR(back[i], values[i], scale / 2 + 1e-7) << i;
  EXPECT_EQ(back[3], 127 * scale);

  // A zero tensor: scale 0, every value 0.
  const std::vector<float> zeros(3, 0.0f);
  const std::string zero_bytes = EncodeValues(UpdateEncoding::kInt8, zeros, 0);
  EXPECT_EQ(zero_bytes, std::string(7, '\0'));
  std::vector<float> zero_back(3, 9.0f);
  ASSERT_TRUE(DecodeValues(UpdateEncoding::kInt8, zero_bytes, 0, zero_back).ok());
  EXPECT_EQ(zero_back, zeros);
}

// The largest float over 127, times 127, rounds past the float range: the encoder wrote a
// scale its own decoder refuses. Every finite tensor's encoding decodes, to finite values.
TEST(Int8Test, TheLargestFiniteValuesEncodeToWhatDecodes) {
  const float top = std::numeric_limits<float>::max();
  for (const std::vector<float>& values : {std::vector<float>{top, -1.0f, 0.0f}, std::vector<float>{-top, top / 2},
                                           std::vector<float>{std::nextafter(top, 0.0f), 3.0f}}) {
    const std::string bytes = EncodeValues(UpdateEncoding::kInt8, values, 0);
    std::vector<float> back(values.size());
    const Status decoded = DecodeValues(UpdateEncoding::kInt8, bytes, 0, back);
    ASSERT_TRUE(decoded.ok()) << values[0] << ": " << decoded.ToString();
    const float scale = std::bit_cast<float>(static_cast<uint32_t>(static_cast<uint8_t>(bytes[0])) |
                                             static_cast<uint32_t>(static_cast<uint8_t>(bytes[1])) << 8 |
                                             static_cast<uint32_t>(static_cast<uint8_t>(bytes[2])) << 16 |
                                             static_cast<uint32_t>(static_cast<uint8_t>(bytes[3])) << 24);
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_TRUE(std::isfinite(back[i])) << i;
      EXPECT_LE(std::fabs(back[i] - values[i]), scale) << i;
    }
    for (float residual : EncodingResidual(UpdateEncoding::kInt8, values, 0)) EXPECT_TRUE(std::isfinite(residual));
  }
}

TEST(TopKTest, CountsAreTheCeilingWithinOneAndN) {
  EXPECT_EQ(TopKCount(100, 0.01), 1u);
  EXPECT_EQ(TopKCount(1000, 0.01), 10u);
  EXPECT_EQ(TopKCount(100, 0.07), 7u);  // 0.07 x 100 is 7.000000000000001 in double
  EXPECT_EQ(TopKCount(10, 0.25), 3u);
  EXPECT_EQ(TopKCount(7, 0.01), 1u);
  EXPECT_EQ(TopKCount(3, 1.0), 3u);
  EXPECT_EQ(TopKCount(0, 0.5), 0u);
  EXPECT_EQ(TopKCount(44426, 0.01), 445u);
}

TEST(TopKTest, SendsTheLargestMagnitudesInIndexOrder) {
  // Magnitudes 5 (index 5), 3 (1), then a tie at 2 (2 and 4) that the lower index wins.
  const std::vector<float> values = {0.1f, -3.0f, 2.0f, 0.0f, -2.0f, 5.0f};
  const std::string bytes = EncodeValues(UpdateEncoding::kTopK, values, 0.5);
  const std::string expected = LittleEndian32(1) + LittleEndian32(std::bit_cast<uint32_t>(-3.0f)) + LittleEndian32(2) +
                               LittleEndian32(std::bit_cast<uint32_t>(2.0f)) + LittleEndian32(5) +
                               LittleEndian32(std::bit_cast<uint32_t>(5.0f));
  EXPECT_EQ(bytes, expected);
  std::vector<float> back(values.size(), 7.0f);
  ASSERT_TRUE(DecodeValues(UpdateEncoding::kTopK, bytes, 0.5, back).ok());
  EXPECT_EQ(back, (std::vector<float>{0, -3, 2, 0, 0, 5}));
}

TEST(TopKTest, ErrorFeedbackCarriesWhatWasNotSentIntoTheNextStep) {
  const double fraction = 0.25;  // one entry of four
  // Step 1: the delta alone; its largest entry goes, the rest stays behind.
  const std::vector<float> delta1 = {1.0f, 0.5f, -0.25f, 0.125f};
  std::vector<float> sent1(4);
  ASSERT_TRUE(DecodeValues(UpdateEncoding::kTopK, EncodeValues(UpdateEncoding::kTopK, delta1, fraction), fraction,
                           sent1).ok());
  EXPECT_EQ(sent1, (std::vector<float>{1.0f, 0, 0, 0}));
  const std::vector<float> residual1 = EncodingResidual(UpdateEncoding::kTopK, delta1, fraction);
  EXPECT_EQ(residual1, (std::vector<float>{0, 0.5f, -0.25f, 0.125f}));
  // Step 2: the residual joins the next delta before the choice; entry 1 now leads, though
  // this step's own delta alone would have sent entry 2.
  const std::vector<float> delta2 = {0.125f, 0.25f, -0.375f, 0.125f};
  std::vector<float> corrected(4);
  for (size_t i = 0; i < 4; ++i) corrected[i] = delta2[i] + residual1[i];
  std::vector<float> sent2(4);
  ASSERT_TRUE(DecodeValues(UpdateEncoding::kTopK, EncodeValues(UpdateEncoding::kTopK, corrected, fraction), fraction,
                           sent2).ok());
  EXPECT_EQ(sent2, (std::vector<float>{0, 0.75f, 0, 0}));
  const std::vector<float> residual2 = EncodingResidual(UpdateEncoding::kTopK, corrected, fraction);
  EXPECT_EQ(residual2, (std::vector<float>{0.125f, 0, -0.625f, 0.25f}));
  // Nothing is lost: what was sent plus what remains is the sum of the deltas.
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(sent1[i] + sent2[i] + residual2[i], delta1[i] + delta2[i]) << i;
}

TEST(UpdateCodecTest, EveryEncodingRoundTripsWithinItsPrecision) {
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.37f * static_cast<float>(i)) * 0.01f;
  const struct {
    UpdateEncoding encoding;
    double relative;  // the error allowed, relative to max|x|
    uint64_t bytes;
  } cases[] = {{UpdateEncoding::kFloat32, 0, 4000},
               {UpdateEncoding::kFloat16, 1.0 / 1024, 2000},
               {UpdateEncoding::kBFloat16, 1.0 / 128, 2000},
               {UpdateEncoding::kInt8, 0.5 / 127 + 1e-6, 1004}};
  for (const auto& c : cases) {
    SCOPED_TRACE(UpdateEncodingName(c.encoding));
    const std::string bytes = EncodeValues(c.encoding, values, 0);
    EXPECT_EQ(bytes.size(), c.bytes);
    EXPECT_EQ(EncodedByteSize(c.encoding, values.size(), 0), c.bytes);
    std::vector<float> back(values.size());
    ASSERT_TRUE(DecodeValues(c.encoding, bytes, 0, back).ok());
    for (size_t i = 0; i < values.size(); ++i) ASSERT_LE(std::fabs(back[i] - values[i]), c.relative * 0.01) << i;
  }
  const std::string sparse = EncodeValues(UpdateEncoding::kTopK, values, 0.01);
  EXPECT_EQ(sparse.size(), 10u * 8);
  EXPECT_EQ(EncodedByteSize(UpdateEncoding::kTopK, values.size(), 0.01), 80u);
}

TEST(UpdateCodecTest, DecodersRefuseHostileBytes) {
  std::vector<float> out(4);
  auto refused = [&](UpdateEncoding encoding, const std::string& bytes, double fraction, const std::string& part) {
    Status s = DecodeValues(encoding, bytes, fraction, out);
    ASSERT_FALSE(s.ok()) << part;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
  };
  // Sizes that do not match the element count.
  refused(UpdateEncoding::kFloat32, std::string(15, '\0'), 0, "float32 encoding of 4 values: expected 16 bytes, got 15");
  refused(UpdateEncoding::kFloat16, std::string(9, '\0'), 0, "expected 8 bytes, got 9");
  refused(UpdateEncoding::kInt8, std::string(4, '\0'), 0, "int8 encoding of 4 values: expected 8 bytes, got 4");
  refused(UpdateEncoding::kTopK, std::string(16, '\0'), 0.25, "topk encoding of 4 values: expected 8 bytes, got 16");
  // int8: the scale must be finite and not negative; -128 is not a value the encoder sends.
  const std::string q(4, '\x01');
  refused(UpdateEncoding::kInt8, LittleEndian32(std::bit_cast<uint32_t>(-1.0f)) + q, 0, "a finite scale >= 0, got -1");
  refused(UpdateEncoding::kInt8, LittleEndian32(0x7fc00000) + q, 0, "a finite scale >= 0, got NaN");
  refused(UpdateEncoding::kInt8, LittleEndian32(0x7f800000) + q, 0, "a finite scale >= 0");
  refused(UpdateEncoding::kInt8, LittleEndian32(std::bit_cast<uint32_t>(1.0f)) + std::string("\x01\x80\x01\x01", 4), 0,
          "value 1 is -128, expected -127 to 127");
  // A finite scale whose product with a value passes the float range.
  const std::string huge_scale = LittleEndian32(std::bit_cast<uint32_t>(std::numeric_limits<float>::max() / 2));
  refused(UpdateEncoding::kInt8, huge_scale + std::string("\x00\x00\x03\x00", 4), 0,
          "int8 encoding: value 2 (3 times the scale");
  refused(UpdateEncoding::kInt8, huge_scale + std::string("\x00\x00\x00\x81", 4), 0, "value 3 (-127 times");
  // top-k: indices in range, strictly increasing.
  const std::string one = LittleEndian32(std::bit_cast<uint32_t>(1.0f));
  refused(UpdateEncoding::kTopK, LittleEndian32(4) + one, 0.25, "pair 0 has index 4, expected below 4");
  refused(UpdateEncoding::kTopK, LittleEndian32(0xffffffff) + one, 0.25, "expected below 4");
  refused(UpdateEncoding::kTopK, LittleEndian32(2) + one + LittleEndian32(2) + one, 0.5,
          "pair 1 has index 2 after 2; expected strictly increasing indices");
  refused(UpdateEncoding::kTopK, LittleEndian32(3) + one + LittleEndian32(1) + one, 0.5, "has index 1 after 3");
  // Byte counts that would pass 64 bits.
  EXPECT_FALSE(EncodedByteSize(UpdateEncoding::kFloat32, std::numeric_limits<uint64_t>::max() / 2, 0).has_value());
  EXPECT_FALSE(EncodedByteSize(UpdateEncoding::kFloat16, std::numeric_limits<uint64_t>::max(), 0).has_value());
  EXPECT_FALSE(EncodedByteSize(UpdateEncoding::kInt8, std::numeric_limits<uint64_t>::max() - 3, 0).has_value());
  EXPECT_FALSE(EncodedByteSize(UpdateEncoding::kTopK, std::numeric_limits<uint64_t>::max(), 1.0).has_value());
}

// A running variance's delta, added to the model it is a delta from, stays 0 or more as each
// encoding reads it back: float16's step (-1000.3 reads back as -1000.5), int8's and
// bfloat16's, top-k's (a value below -base, from the residual added, is raised to it) and
// float32's (a value below -base from the training's numerics). Values that keep the sum at 0
// or more are left as they were.
TEST(KeepSumNotNegativeTest, TheSumStaysAtZeroOrMoreAsEachEncodingReadsItBack) {
  EXPECT_LT(1000.3f + HalfToFloat(FloatToHalf(-1000.3f)), 0.0f);  // what float16 did unguarded
  const std::vector<float> base = {1000.3f, 0.2f, 5.0f, 0.0f};
  for (UpdateEncoding encoding : {UpdateEncoding::kFloat32, UpdateEncoding::kFloat16, UpdateEncoding::kBFloat16,
                                  UpdateEncoding::kInt8, UpdateEncoding::kTopK}) {
    SCOPED_TRACE(UpdateEncodingName(encoding));
    std::vector<float> values = {-1000.3f, -0.25f, 3.0f, -1e-7f};
    const size_t changed = KeepSumNotNegative(encoding, base, values, 0.5);
    EXPECT_GE(changed, 2u);  // elements 1 and 3 at least
    EXPECT_EQ(values[2], 3.0f);
    std::vector<float> decoded(values.size());
    ASSERT_TRUE(DecodeValues(encoding, EncodeValues(encoding, values, 0.5), 0.5, decoded).ok());
    for (size_t i = 0; i < values.size(); ++i) EXPECT_GE(base[i] + decoded[i], 0.0f) << "element " << i;
    if (encoding == UpdateEncoding::kFloat32) {
      EXPECT_EQ(changed, 2u);
      EXPECT_EQ(values, (std::vector<float>{-1000.3f, -0.2f, 3.0f, 0.0f}));
    }
  }
}

}  // namespace
}  // namespace tessera
