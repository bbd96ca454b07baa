// IEEE 754 binary16 (DType::kFloat16) to and from float32, rounding to nearest even.
// Uses the compiler's _Float16 where the target has it; elsewhere (clang before 15 on x86,
// which the fuzzing build uses) the conversion is done by hand, with the same results.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tessera {

#if defined(__FLT16_MAX__)
inline float HalfToFloat(uint16_t half) {
  _Float16 value;
  std::memcpy(&value, &half, sizeof(value));
  return static_cast<float>(value);
}

inline uint16_t FloatToHalf(float value) {
  const _Float16 half = static_cast<_Float16>(value);
  uint16_t bits;
  std::memcpy(&bits, &half, sizeof(bits));
  return bits;
}
#else
inline float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0) {  // zero and subnormals: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  const uint32_t bits = exponent == 31 ? sign | 0x7f800000u | (mantissa << 13)  // infinities, NaNs
                                       : sign | ((exponent + 112) << 23) | (mantissa << 13);
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline uint16_t FloatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and above round to infinity
  if (magnitude < 0x38800000u) {                          // below 2^-14: a subnormal half or zero
    return sign | static_cast<uint16_t>(std::nearbyint(std::fabs(value) * 16777216.0f));
  }
  uint32_t half = (magnitude >> 13) - (112u << 10);  // rebiased exponent and the top 10 mantissa bits
  const uint32_t rest = magnitude & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // a carry rolls into the exponent
  return sign | static_cast<uint16_t>(half);
}
#endif

}  // namespace tessera
