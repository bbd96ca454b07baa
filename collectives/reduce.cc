#include "collectives/reduce.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace tessera::collectives {
namespace {

// Max and min give the same bits whichever operand comes first, as recursive doubling needs:
// each rank there computes op(own, peer), so op(a, b) and op(b, a) must agree on every rank.
// For floats std::max/std::min do not (they return the first operand when the comparison is
// false, as it is for any NaN and for +0 against -0), so: a NaN on either side gives the
// canonical quiet NaN, and +0 is larger than -0.
template <typename T>
T Max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
    if (a == b) return std::signbit(a) ? b : a;
  }
  return a < b ? b : a;
}

template <typename T>
T Min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
    if (a == b) return std::signbit(a) ? a : b;
  }
  return b < a ? b : a;
}

template <typename T>
void ReduceTyped(T* dst, const T* a, const T* b, size_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      if constexpr (std::is_integral_v<T>) {
        // Integers wrap modulo 2^bits (what NCCL and MPI give in practice), through their unsigned
        // type: a signed sum that overflowed would be undefined behaviour, not a wrap.
        using U = std::make_unsigned_t<T>;
        for (size_t i = 0; i < count; ++i) dst[i] = static_cast<T>(static_cast<U>(static_cast<U>(a[i]) + static_cast<U>(b[i])));
      } else {
        for (size_t i = 0; i < count; ++i) dst[i] = static_cast<T>(a[i] + b[i]);
      }
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < count; ++i) dst[i] = Max(a[i], b[i]);
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < count; ++i) dst[i] = Min(a[i], b[i]);
      break;
  }
}

void ReduceHalf(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t count,
                ReduceOp op) {
  for (size_t i = 0; i < count; ++i) {
    const float x = HalfToFloat(a[i]);
    const float y = HalfToFloat(b[i]);
    float r = 0;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: r = x + y; break;
      case ReduceOp::kMax: r = Max(x, y); break;
      case ReduceOp::kMin: r = Min(x, y); break;
    }
    dst[i] = FloatToHalf(r);
  }
}

// Integers divide as int64 (the divisor may not fit T: 256 ranks of uint8), floats in their
// own type (a rank count is exact in float and double).
template <typename T>
void DivideTyped(T* buffer, size_t count, int divisor) {
  if constexpr (std::is_floating_point_v<T>) {
    const T d = static_cast<T>(divisor);
    for (size_t i = 0; i < count; ++i) buffer[i] = buffer[i] / d;
  } else {
    const int64_t d = divisor;
    for (size_t i = 0; i < count; ++i) buffer[i] = static_cast<T>(static_cast<int64_t>(buffer[i]) / d);
  }
}

}  // namespace

void ReduceElements(void* dst, const void* a, const void* b, size_t count, DataType type,
                    ReduceOp op) {
  switch (type) {
    case DataType::kUint8:
      ReduceTyped(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a),
                  static_cast<const uint8_t*>(b), count, op);
      break;
    case DataType::kInt32:
      ReduceTyped(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a),
                  static_cast<const int32_t*>(b), count, op);
      break;
    case DataType::kInt64:
      ReduceTyped(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                  static_cast<const int64_t*>(b), count, op);
      break;
    case DataType::kFloat16:
      ReduceHalf(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                 static_cast<const uint16_t*>(b), count, op);
      break;
    case DataType::kFloat32:
      ReduceTyped(static_cast<float*>(dst), static_cast<const float*>(a),
                  static_cast<const float*>(b), count, op);
      break;
    case DataType::kFloat64:
      ReduceTyped(static_cast<double*>(dst), static_cast<const double*>(a),
                  static_cast<const double*>(b), count, op);
      break;
  }
}

void DivideElements(void* buffer, size_t count, DataType type, int divisor) {
  if (divisor <= 1) return;  // a rank count: 1 changes nothing, and there is no 0
  switch (type) {
    case DataType::kUint8: DivideTyped(static_cast<uint8_t*>(buffer), count, divisor); break;
    case DataType::kInt32: DivideTyped(static_cast<int32_t*>(buffer), count, divisor); break;
    case DataType::kInt64: DivideTyped(static_cast<int64_t*>(buffer), count, divisor); break;
    case DataType::kFloat32: DivideTyped(static_cast<float*>(buffer), count, divisor); break;
    case DataType::kFloat64: DivideTyped(static_cast<double*>(buffer), count, divisor); break;
    case DataType::kFloat16: {
      auto* half = static_cast<uint16_t*>(buffer);
      for (size_t i = 0; i < count; ++i) {
        half[i] = FloatToHalf(HalfToFloat(half[i]) / static_cast<float>(divisor));
      }
      break;
    }
  }
}

void HalfToFloatElements(const uint16_t* half, float* wide, size_t count) {
  for (size_t i = 0; i < count; ++i) wide[i] = HalfToFloat(half[i]);
}

void FloatToHalfElements(const float* wide, uint16_t* half, size_t count) {
  for (size_t i = 0; i < count; ++i) half[i] = FloatToHalf(wide[i]);
}

}  // namespace tessera::collectives
