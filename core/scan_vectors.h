// The vector pieces of the update scans (core/value_scan.cc, server/jobs/update_checks.cc):
// sixteen lanes of double held in four vectors of four (lane k of vector q sums the elements
// 16 i + 4 q + k), so that the additions do not wait on each other. Written with GCC's vector
// types: left to the loop vectoriser, the float-to-double conversions kept the scan at four
// times the fold's time. For files that define their loops under TESSERA_CLONES_AVX2.
#pragma once

#include <cstdint>
#include <cstring>

namespace tessera::scan {

using Floats8 = float __attribute__((vector_size(32)));
using Doubles4 = double __attribute__((vector_size(32)));
using Doubles8 = double __attribute__((vector_size(64)));
using Bits8 = uint32_t __attribute__((vector_size(32)));

// True for an infinite or NaN float: its exponent bits all set. Written on the bits so that
// the loops vectorize.
inline uint32_t NonFiniteBit(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
}

// Vectors pass by reference here, never by value: these are inlined into the AVX2 clone and
// the default one alike, and a vector argument's ABI differs between the two.
// `flags` gains the eight lanes' non-finite flags: all exponent bits set.
[[gnu::always_inline]] inline void OrNonFinite(const Floats8& x, Bits8* flags) {
  constexpr uint32_t e = 0x7f800000u;
  const Bits8 exponent = {e, e, e, e, e, e, e, e};
  Bits8 bits;
  std::memcpy(&bits, &x, sizeof(bits));
  *flags |= reinterpret_cast<Bits8>((bits & exponent) == exponent);
}
// `low` and `high` gain the squares of x's lanes 0-3 and 4-7, in double. All eight lanes are
// widened in one conversion: GCC 12 turns it into two AVX2 conversions of four, where widening
// each half on its own (four floats picked from x) went through the stack two lanes at a
// time and made the scan about 40% slower.
[[gnu::always_inline]] inline void AddSquares(const Floats8& x, Doubles4* low, Doubles4* high) {
  const Doubles8 wide = __builtin_convertvector(x, Doubles8);
  Doubles4 a, b;
  std::memcpy(&a, &wide, sizeof(a));
  std::memcpy(&b, reinterpret_cast<const char*>(&wide) + sizeof(a), sizeof(b));
  *low += a * a;
  *high += b * b;
}
// `m` becomes the lane-wise largest of itself and x's magnitudes.
[[gnu::always_inline]] inline void MaxMagnitude(const Floats8& x, Floats8* m) {
  constexpr uint32_t k = 0x7fffffffu;
  const Bits8 magnitude = {k, k, k, k, k, k, k, k};
  Bits8 bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits &= magnitude;
  Floats8 a;
  std::memcpy(&a, &bits, sizeof(a));
  *m = *m > a ? *m : a;
}

}  // namespace tessera::scan
