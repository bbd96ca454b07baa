#include "core/update_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "base/huge_pages.h"

namespace tessera {
namespace {

void PutU16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>(v >> 8));
}

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint16_t GetU16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// Rounds `value >> shift` to nearest, ties to even (shift >= 1).
uint32_t ShiftRoundEven(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
}

// Magnitude for top-k's order: NaN counts as the largest, so that it is sent (and refused).
float Magnitude(float x) { return std::isnan(x) ? std::numeric_limits<float>::infinity() : std::fabs(x); }

Status SizeError(UpdateEncoding encoding, uint64_t elements, uint64_t expected, size_t got) {
  return InvalidArgumentError(std::string(UpdateEncodingName(encoding)) + " encoding of " + std::to_string(elements) +
                              " values: expected " + std::to_string(expected) + " bytes, got " + std::to_string(got));
}

}  // namespace

const char* UpdateEncodingName(UpdateEncoding encoding) {
  switch (encoding) {
    case UpdateEncoding::kFloat32: return "float32";
    case UpdateEncoding::kFloat16: return "float16";
    case UpdateEncoding::kBFloat16: return "bfloat16";
    case UpdateEncoding::kInt8: return "int8";
    case UpdateEncoding::kTopK: return "topk";
  }
  return "unknown";
}

uint16_t FloatToHalf(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t exponent = (x >> 23) & 0xff;
  const uint32_t mantissa = x & 0x7fffff;
  if (exponent == 0xff) {  // inf, or NaN (quiet, with the payload's top bits)
    return mantissa == 0 ? static_cast<uint16_t>(sign | 0x7c00)
                         : static_cast<uint16_t>(sign | 0x7e00 | (mantissa >> 13));
  }
  const int e = static_cast<int>(exponent) - 127 + 15;  // binary16's biased exponent
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  if (e <= 0) {
    // Below binary16's normal range: a subnormal in units of 2^-24, or zero. Under 2^-25 every
    // value rounds to zero (float32 subnormals included).
    if (e < -10) return sign;
    const uint32_t significand = mantissa | 0x800000;
    return static_cast<uint16_t>(sign | ShiftRoundEven(significand, 14 - e));
  }
  // A carry out of the mantissa moves into the exponent, up to inf: what rounding demands.
  const uint32_t rounded = ShiftRoundEven((static_cast<uint32_t>(e) << 23) | mantissa, 13);
  return static_cast<uint16_t>(sign | rounded);
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000 | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

uint16_t FloatToBFloat16(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((x >> 16) | 0x40);  // stays a (quiet) NaN
  return static_cast<uint16_t>((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

float BFloat16ToFloat(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint64_t TopKCount(uint64_t n, double fraction) {
  if (n == 0) return 0;
  // The small allowance keeps a product such as 0.07 x 100 = 7.000000000000001 at 7.
  const double wanted = std::ceil(fraction * static_cast<double>(n) - 1e-9);
  if (!(wanted >= 1)) return 1;
  if (wanted >= static_cast<double>(n)) return n;
  return static_cast<uint64_t>(wanted);
}

std::optional<uint64_t> EncodedByteSize(UpdateEncoding encoding, uint64_t elements, double fraction) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  switch (encoding) {
    case UpdateEncoding::kFloat32:
      if (elements > kMax / 4) return std::nullopt;
      return elements * 4;
    case UpdateEncoding::kFloat16:
    case UpdateEncoding::kBFloat16:
      if (elements > kMax / 2) return std::nullopt;
      return elements * 2;
    case UpdateEncoding::kInt8:
      if (elements > kMax - 4) return std::nullopt;
      return elements + 4;
    case UpdateEncoding::kTopK: {
      const uint64_t k = TopKCount(elements, fraction);
      if (k > kMax / 8) return std::nullopt;
      return k * 8;
    }
  }
  return std::nullopt;
}

std::string EncodeValues(UpdateEncoding encoding, std::span<const float> values, double fraction) {
  std::string out;
  switch (encoding) {
    case UpdateEncoding::kFloat32:
      ResizeZeroed(out, values.size_bytes());
      if (!values.empty()) std::memcpy(out.data(), values.data(), values.size_bytes());
      return out;
    case UpdateEncoding::kFloat16:
      out.reserve(values.size() * 2);
      for (float v : values) PutU16(&out, FloatToHalf(v));
      return out;
    case UpdateEncoding::kBFloat16:
      out.reserve(values.size() * 2);
      for (float v : values) PutU16(&out, FloatToBFloat16(v));
      return out;
    case UpdateEncoding::kInt8: {
      float largest = 0;
      bool nan = false;
      for (float v : values) {
        nan = nan || std::isnan(v);
        largest = std::max(largest, std::fabs(v));
      }
      // A NaN or an infinity makes the scale non-finite, which every decoder refuses.
      float scale = nan ? std::numeric_limits<float>::quiet_NaN() : largest / 127.0f;
      // At the top of the float range 127 s can round past it, which the decoder refuses:
      // one step down keeps the largest value's 127 s finite.
      if (std::isfinite(scale) && !std::isfinite(127.0f * scale)) scale = std::nextafter(scale, 0.0f);
      out.reserve(values.size() + 4);
      PutU32(&out, std::bit_cast<uint32_t>(scale));
      for (float v : values) {
        long q = 0;
        if (scale > 0 && std::isfinite(scale)) q = std::clamp(std::lround(v / scale), -127L, 127L);
        out.push_back(static_cast<char>(static_cast<int8_t>(q)));
      }
      return out;
    }
    case UpdateEncoding::kTopK: {
      const uint64_t k = TopKCount(values.size(), fraction);
      std::vector<uint32_t> order(values.size());
      std::iota(order.begin(), order.end(), 0u);
      auto larger = [&](uint32_t a, uint32_t b) {
        const float ma = Magnitude(values[a]), mb = Magnitude(values[b]);
        return ma != mb ? ma > mb : a < b;
      };
      std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), larger);
      order.resize(k);
      std::sort(order.begin(), order.end());
      out.reserve(k * 8);
      for (uint32_t i : order) {
        PutU32(&out, i);
        PutU32(&out, std::bit_cast<uint32_t>(values[i]));
      }
      return out;
    }
  }
  return out;
}

std::vector<float> EncodingResidual(UpdateEncoding encoding, std::span<const float> values, double fraction) {
  std::vector<float> residual(values.size());
  // The encoder's own output always decodes.
  DecodeValues(encoding, EncodeValues(encoding, values, fraction), fraction, residual).ok();
  for (size_t i = 0; i < values.size(); ++i) residual[i] = values[i] - residual[i];
  return residual;
}

size_t KeepSumNotNegative(UpdateEncoding encoding, std::span<const float> base, std::span<float> values,
                          double fraction) {
  const std::vector<float> original(values.begin(), values.end());
  // base + v >= 0 holds for v >= -base in float too: rounding to nearest never crosses 0.
  for (size_t i = 0; i < values.size(); ++i) {
    if (base[i] + values[i] < 0.0f) values[i] = -base[i];
  }
  // What the decoder reads back may still fall below -base (a float16 step, an int8 scale's).
  // Each value that does is raised by twice its shortfall for a few passes, then sent as 0,
  // which every encoding reads back exactly; a value once 0 stays so, so the passes end.
  constexpr int kRaises = 3;
  std::vector<float> decoded(values.size());
  for (int pass = 0; encoding != UpdateEncoding::kFloat32; ++pass) {
    // The encoder's own output always decodes.
    DecodeValues(encoding, EncodeValues(encoding, values, fraction), fraction, decoded).ok();
    bool again = false;
    for (size_t i = 0; i < values.size(); ++i) {
      const float sum = base[i] + decoded[i];
      if (!(sum < 0.0f) || values[i] == 0.0f) continue;
      values[i] = pass < kRaises ? values[i] - 2.0f * sum : 0.0f;
      again = true;
    }
    if (!again) break;
  }
  size_t changed = 0;
  for (size_t i = 0; i < values.size(); ++i) changed += values[i] != original[i];
  return changed;
}

Status DecodeValues(UpdateEncoding encoding, std::string_view bytes, double fraction, std::span<float> out) {
  const uint64_t n = out.size();
  const std::optional<uint64_t> expected = EncodedByteSize(encoding, n, fraction);
  if (!expected) {
    return InvalidArgumentError(std::string(UpdateEncodingName(encoding)) + " encoding of " + std::to_string(n) +
                                " values: the byte count overflows");
  }
  if (bytes.size() != *expected) return SizeError(encoding, n, *expected, bytes.size());
  const char* p = bytes.data();
  switch (encoding) {
    case UpdateEncoding::kFloat32:
      if (n > 0) std::memcpy(out.data(), p, bytes.size());
      return Status::Ok();
    case UpdateEncoding::kFloat16:
      for (uint64_t i = 0; i < n; ++i) out[i] = HalfToFloat(GetU16(p + 2 * i));
      return Status::Ok();
    case UpdateEncoding::kBFloat16:
      for (uint64_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(GetU16(p + 2 * i));
      return Status::Ok();
    case UpdateEncoding::kInt8: {
      const float scale = std::bit_cast<float>(GetU32(p));
      if (!std::isfinite(scale) || scale < 0) {
        return InvalidArgumentError("int8 encoding: expected a finite scale >= 0, got " +
                                    std::string(std::isnan(scale) ? "NaN" : std::to_string(scale)));
      }
      for (uint64_t i = 0; i < n; ++i) {
        const int8_t q = static_cast<int8_t>(p[4 + i]);
        if (q == -128) {
          return InvalidArgumentError("int8 encoding: value " + std::to_string(i) + " is -128, expected -127 to 127");
        }
        out[i] = scale * static_cast<float>(q);
        if (!std::isfinite(out[i])) {  // a scale near the float maximum, times up to 127
          return InvalidArgumentError("int8 encoding: value " + std::to_string(i) + " (" + std::to_string(q) +
                                      " times the scale " + std::to_string(scale) +
                                      ") is past the float range; expected a scale of at most the largest "
                                      "magnitude / 127");
        }
      }
      return Status::Ok();
    }
    case UpdateEncoding::kTopK: {
      std::fill(out.begin(), out.end(), 0.0f);
      const uint64_t k = bytes.size() / 8;
      uint64_t previous = 0;
      for (uint64_t j = 0; j < k; ++j) {
        const uint64_t index = GetU32(p + 8 * j);
        if (index >= n) {
          return InvalidArgumentError("topk encoding: pair " + std::to_string(j) + " has index " +
                                      std::to_string(index) + ", expected below " + std::to_string(n));
        }
        if (j > 0 && index <= previous) {
          return InvalidArgumentError("topk encoding: pair " + std::to_string(j) + " has index " +
                                      std::to_string(index) + " after " + std::to_string(previous) +
                                      "; expected strictly increasing indices");
        }
        out[index] = std::bit_cast<float>(GetU32(p + 8 * j + 4));
        previous = index;
      }
      return Status::Ok();
    }
  }
  return InvalidArgumentError("unknown encoding");
}

}  // namespace tessera
