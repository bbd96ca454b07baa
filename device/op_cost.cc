#include "device/op_cost.h"

#include "device/dtype.h"

namespace tessera {
namespace {

constexpr uint64_t kFloat = sizeof(float);

double ConvFlops(const Conv2dShape& s) {
  return 2.0 * ConvOutputCount(s) * s.in_channels * s.kernel_height * s.kernel_width;
}

}  // namespace

uint64_t ConvInputCount(const Conv2dShape& s) { return uint64_t(s.batch) * s.in_channels * s.in_height * s.in_width; }
uint64_t ConvWeightCount(const Conv2dShape& s) {
  return uint64_t(s.out_channels) * s.in_channels * s.kernel_height * s.kernel_width;
}
uint64_t ConvOutputCount(const Conv2dShape& s) {
  return uint64_t(s.batch) * s.out_channels * s.out_height() * s.out_width();
}
uint64_t PoolInputCount(const MaxPoolShape& s) { return uint64_t(s.batch) * s.channels * s.in_height * s.in_width; }
uint64_t PoolOutputCount(const MaxPoolShape& s) {
  return uint64_t(s.batch) * s.channels * s.out_height() * s.out_width();
}

OpCost GemmCost(int m, int n, int k, bool reads_c) {
  const uint64_t mn = uint64_t(m) * n;
  return {2.0 * m * n * k, (uint64_t(m) * k + uint64_t(k) * n + (reads_c ? mn : 0)) * kFloat, mn * kFloat};
}

OpCost Conv2dForwardCost(const Conv2dShape& s, bool with_bias) {
  const uint64_t outputs = ConvOutputCount(s);
  return {ConvFlops(s) + (with_bias ? outputs : 0),
          (ConvInputCount(s) + ConvWeightCount(s) + (with_bias ? s.out_channels : 0)) * kFloat, outputs * kFloat};
}

OpCost Conv2dBackwardDataCost(const Conv2dShape& s) {
  return {ConvFlops(s), (ConvOutputCount(s) + ConvWeightCount(s)) * kFloat, ConvInputCount(s) * kFloat};
}

OpCost Conv2dBackwardFilterCost(const Conv2dShape& s, bool with_bias) {
  return {ConvFlops(s) + (with_bias ? ConvOutputCount(s) : 0), (ConvInputCount(s) + ConvOutputCount(s)) * kFloat,
          (ConvWeightCount(s) + (with_bias ? s.out_channels : 0)) * kFloat};
}

OpCost BiasAddCost(int64_t outer, int channels, int64_t inner) {
  const uint64_t count = uint64_t(outer) * channels * inner;
  return {double(count), (count + channels) * kFloat, count * kFloat};
}

OpCost BiasGradCost(int64_t outer, int channels, int64_t inner) {
  const uint64_t count = uint64_t(outer) * channels * inner;
  return {double(count), count * kFloat, uint64_t(channels) * kFloat};
}

OpCost ReluCost(int64_t count) { return {double(count), uint64_t(count) * kFloat, uint64_t(count) * kFloat}; }

OpCost ReluBackwardCost(int64_t count) {
  return {double(count), 2 * uint64_t(count) * kFloat, uint64_t(count) * kFloat};
}

OpCost MaxPoolCost(const MaxPoolShape& s) {
  const uint64_t outputs = PoolOutputCount(s);
  return {double(outputs) * s.window * s.window, PoolInputCount(s) * kFloat, 2 * outputs * kFloat};
}

OpCost MaxPoolBackwardCost(const MaxPoolShape& s) {
  return {double(PoolOutputCount(s)), 2 * PoolOutputCount(s) * kFloat, PoolInputCount(s) * kFloat};
}

OpCost SoftmaxCrossEntropyCost(int batch, int classes, bool with_gradient) {
  const uint64_t count = uint64_t(batch) * classes;
  return {5.0 * count, (count + batch) * kFloat, (1 + (with_gradient ? count : 0)) * kFloat};
}

OpCost SgdMomentumUpdateCost(int64_t count) {
  return {5.0 * count, 3 * uint64_t(count) * kFloat, 2 * uint64_t(count) * kFloat};
}

OpCost AddScaledDifferenceCost(int64_t count) {
  return {3.0 * count, 3 * uint64_t(count) * kFloat, uint64_t(count) * kFloat};
}

OpCost ReduceSumCost(int64_t count) { return {double(count), uint64_t(count) * kFloat, kFloat}; }

OpCost CastCost(int64_t count, DType from, DType to) {
  return {double(count), uint64_t(count) * DTypeSize(from), uint64_t(count) * DTypeSize(to)};
}

OpCost FillCost(int64_t count) { return {0, 0, uint64_t(count) * kFloat}; }

}  // namespace tessera
