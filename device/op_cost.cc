#include "device/op_cost.h"

#include "device/dtype.h"

namespace tessera {
namespace {

constexpr uint64_t kFloat = sizeof(float);

double ConvFlops(const Conv2dShape& s) {
  return 2.0 * ConvOutputCount(s) * s.in_channels * s.kernel_height * s.kernel_width;
}

// Floating-point operations per element of each activation, the transcendental counted as a
// few: GELU's erf is the expensive one; tanh and sigmoid are an exp and a division or two.
double ActivationFlops(ActivationFunction function) {
  switch (function) {
    case ActivationFunction::kGelu: return 10;
    case ActivationFunction::kTanh:
    case ActivationFunction::kSigmoid: return 4;
  }
  return 4;
}

// Per element of the backward: GELU evaluates Phi and phi again from x; tanh and sigmoid need
// only a product or two of the saved output, and the multiply by dy.
double ActivationBackwardFlops(ActivationFunction function) {
  switch (function) {
    case ActivationFunction::kGelu: return 14;
    case ActivationFunction::kTanh:
    case ActivationFunction::kSigmoid: return 3;
  }
  return 3;
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

OpCost ActivationCost(ActivationFunction function, int64_t count) {
  return {ActivationFlops(function) * count, uint64_t(count) * kFloat, uint64_t(count) * kFloat};
}

// Reads one of x (GELU) or y (tanh, sigmoid), and dy.
OpCost ActivationBackwardCost(ActivationFunction function, int64_t count) {
  return {ActivationBackwardFlops(function) * count, 2 * uint64_t(count) * kFloat, uint64_t(count) * kFloat};
}

// window^2 - 1 additions and a division per output.
OpCost AvgPoolCost(const MaxPoolShape& s) {
  const uint64_t outputs = PoolOutputCount(s);
  return {double(outputs) * s.window * s.window, PoolInputCount(s) * kFloat, outputs * kFloat};
}

// A division per output and an addition per window element.
OpCost AvgPoolBackwardCost(const MaxPoolShape& s) {
  const uint64_t outputs = PoolOutputCount(s);
  return {double(outputs) * (1 + s.window * s.window), outputs * kFloat, PoolInputCount(s) * kFloat};
}

// Training: the mean (an addition per element) and the variance (a subtraction, a multiply and
// an addition), then the normalisation (a subtraction, two multiplies and an addition); x is
// counted once, as a kernel that keeps a channel on chip reads it. The running statistics are
// read and written, the saved ones written. Not training: only the normalisation.
OpCost BatchNormForwardCost(const BatchNormShape& s, bool training) {
  const uint64_t count = uint64_t(s.outer) * s.channels * uint64_t(s.inner);
  const uint64_t channels = uint64_t(s.channels);
  if (!training) return {4.0 * count, (count + 4 * channels) * kFloat, count * kFloat};
  return {8.0 * count, (count + 4 * channels) * kFloat, (count + 4 * channels) * kFloat};
}

// The two sums (xhat: a subtraction and a multiply; dy * xhat and the two additions), then dx
// (about five per element).
OpCost BatchNormBackwardCost(const BatchNormShape& s, bool with_input_gradient) {
  const uint64_t count = uint64_t(s.outer) * s.channels * uint64_t(s.inner);
  const uint64_t channels = uint64_t(s.channels);
  return {(with_input_gradient ? 10.0 : 5.0) * count, (2 * count + 3 * channels) * kFloat,
          ((with_input_gradient ? count : 0) + 2 * channels) * kFloat};
}

// As the batch norm's training forward, per row; no running statistics.
OpCost LayerNormForwardCost(int64_t rows, int columns) {
  const uint64_t count = uint64_t(rows) * uint64_t(columns);
  return {8.0 * count, (count + 2 * uint64_t(columns)) * kFloat, (count + 2 * uint64_t(rows)) * kFloat};
}

// dgamma and dbeta (five per element); dx adds g = dy gamma, its two row sums and the
// combination (nine more).
OpCost LayerNormBackwardCost(int64_t rows, int columns, bool with_input_gradient) {
  const uint64_t count = uint64_t(rows) * uint64_t(columns);
  return {(with_input_gradient ? 14.0 : 5.0) * count, (2 * count + uint64_t(columns) + 2 * uint64_t(rows)) * kFloat,
          ((with_input_gradient ? count : 0) + 2 * uint64_t(columns)) * kFloat};
}

// A comparison and a multiply per element (the hash is integer work); writes y and the mask.
OpCost DropoutCost(int64_t count) {
  return {2.0 * count, uint64_t(count) * kFloat, 2 * uint64_t(count) * kFloat};
}

OpCost DropoutBackwardCost(int64_t count) {
  return {double(count), 2 * uint64_t(count) * kFloat, uint64_t(count) * kFloat};
}

// alpha x + beta y: three per element; with beta 0, one multiply and y is not read.
OpCost AxpbyCost(int64_t count, bool reads_y) {
  return {(reads_y ? 3.0 : 1.0) * count, (reads_y ? 2 : 1) * uint64_t(count) * kFloat, uint64_t(count) * kFloat};
}

}  // namespace tessera
