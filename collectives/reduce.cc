#include "collectives/reduce.h"

#include <algorithm>
#include <cstdint>

namespace tessera::collectives {
namespace {

template <typename T>
void ReduceTyped(T* dst, const T* a, const T* b, size_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < count; ++i) dst[i] = static_cast<T>(a[i] + b[i]);
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < count; ++i) dst[i] = std::max(a[i], b[i]);
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < count; ++i) dst[i] = std::min(a[i], b[i]);
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
      case ReduceOp::kMax: r = std::max(x, y); break;
      case ReduceOp::kMin: r = std::min(x, y); break;
    }
    dst[i] = FloatToHalf(r);
  }
}

template <typename T>
void DivideTyped(T* buffer, size_t count, int divisor) {
  const T d = static_cast<T>(divisor);
  for (size_t i = 0; i < count; ++i) buffer[i] = static_cast<T>(buffer[i] / d);
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

}  // namespace tessera::collectives
