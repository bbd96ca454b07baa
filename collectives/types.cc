#include "collectives/types.h"

#include <cstring>

namespace tessera::collectives {
namespace {

template <typename T, typename NameFn>
void AppendSet(std::string& out, std::string_view label, const std::set<T>& values,
               NameFn name) {
  out += label;
  out += "=[";
  bool first = true;
  for (T value : values) {
    if (!first) out += ",";
    out += name(value);
    first = false;
  }
  out += "]";
}

}  // namespace

std::string CommunicatorCapabilities::ToString() const {
  std::string out;
  AppendSet(out, "ops", native_ops, CollectiveOpName);
  AppendSet(out, " reduce", native_reduce_ops, ReduceOpName);
  AppendSet(out, " dtypes", dtypes, DataTypeName);
  AppendSet(out, " locations", locations, BufferLocationName);
  if (verifies_calls) out += " verifies_calls";
  if (max_tag < INT_MAX) out += " max_tag=" + std::to_string(max_tag);
  return out;
}

CommunicatorCapabilities ReserveTopTag(const CommunicatorCapabilities& base, int* reserved) {
  CommunicatorCapabilities offered = base;
  *reserved = base.max_tag;
  // A base without tags to spare offers none: every caller's tag is then refused by name.
  offered.max_tag = base.max_tag > 0 ? base.max_tag - 1 : -1;
  return offered;
}

size_t DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kUint8: return 1;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
  }
  return 0;
}

std::string_view DataTypeName(DataType type) {
  switch (type) {
    case DataType::kUint8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
  }
  return "unknown-dtype";
}

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "unknown-reduce-op";
}

std::string_view CollectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllreduce: return "allreduce";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kAllgather: return "allgather";
    case CollectiveOp::kReduceScatter: return "reduce_scatter";
    case CollectiveOp::kBarrier: return "barrier";
    case CollectiveOp::kSend: return "send";
    case CollectiveOp::kRecv: return "recv";
  }
  return "unknown-op";
}

std::string_view BufferLocationName(BufferLocation location) {
  return location == BufferLocation::kHost ? "host" : "device";
}

const std::set<DataType>& AllDataTypes() {
  static const std::set<DataType> kAll = {DataType::kUint8,   DataType::kInt32,
                                          DataType::kInt64,   DataType::kFloat16,
                                          DataType::kFloat32, DataType::kFloat64};
  return kAll;
}

const std::set<ReduceOp>& AllReduceOps() {
  static const std::set<ReduceOp> kAll = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax,
                                          ReduceOp::kMin};
  return kAll;
}

const std::set<CollectiveOp>& AllCollectiveOps() {
  static const std::set<CollectiveOp> kAll = {
      CollectiveOp::kAllreduce, CollectiveOp::kBroadcast, CollectiveOp::kAllgather,
      CollectiveOp::kReduceScatter, CollectiveOp::kBarrier, CollectiveOp::kSend,
      CollectiveOp::kRecv};
  return kAll;
}

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise.
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    mantissa &= 0x3ffu;
    bits = sign | (exponent << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

uint16_t FloatToHalf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t exponent = (bits >> 23) & 0xffu;
  uint32_t mantissa = bits & 0x7fffffu;
  if (exponent == 0xff) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u : 0u));
  }
  const int half_exponent = static_cast<int>(exponent) - 127 + 15;
  if (half_exponent >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow
  if (half_exponent <= 0) {
    if (half_exponent < -10) return sign;  // underflow to zero
    mantissa |= 0x800000u;
    const int shift = 14 - half_exponent;
    uint32_t half_mantissa = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half_mantissa & 1u))) ++half_mantissa;
    return static_cast<uint16_t>(sign | half_mantissa);
  }
  uint32_t half = (static_cast<uint32_t>(half_exponent) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into exponent
  return static_cast<uint16_t>(sign | half);
}

}  // namespace tessera::collectives
