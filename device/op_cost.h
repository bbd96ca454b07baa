// The work of each Device op as an OpCost (device/placement.h): floating-point operations and
// the float32 bytes it reads and writes, from the op's shape alone. Backends that account
// placements (emulated, xrt) and the roofline reports use the same figures.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "device/device.h"
#include "device/placement.h"

namespace tessera {

OpCost GemmCost(int m, int n, int k, bool reads_c);
OpCost Conv2dForwardCost(const Conv2dShape& shape, bool with_bias);
OpCost Conv2dBackwardDataCost(const Conv2dShape& shape);
OpCost Conv2dBackwardFilterCost(const Conv2dShape& shape, bool with_bias);
OpCost BiasAddCost(int64_t outer, int channels, int64_t inner);
OpCost BiasGradCost(int64_t outer, int channels, int64_t inner);
OpCost ReluCost(int64_t count);
OpCost ReluBackwardCost(int64_t count);
OpCost MaxPoolCost(const MaxPoolShape& shape);
OpCost MaxPoolBackwardCost(const MaxPoolShape& shape);
OpCost SoftmaxCrossEntropyCost(int batch, int classes, bool with_gradient);
OpCost SgdMomentumUpdateCost(int64_t count);
OpCost AddScaledDifferenceCost(int64_t count);
OpCost ReduceSumCost(int64_t count);
OpCost CastCost(int64_t count, DType from, DType to);
OpCost FillCost(int64_t count);
OpCost ActivationCost(ActivationFunction function, int64_t count);
OpCost ActivationBackwardCost(ActivationFunction function, int64_t count);
OpCost AvgPoolCost(const MaxPoolShape& shape);
OpCost AvgPoolBackwardCost(const MaxPoolShape& shape);
OpCost BatchNormForwardCost(const BatchNormShape& shape, bool training);
OpCost BatchNormBackwardCost(const BatchNormShape& shape, bool with_input_gradient);
OpCost LayerNormForwardCost(int64_t rows, int columns);
OpCost LayerNormBackwardCost(int64_t rows, int columns, bool with_input_gradient);
OpCost DropoutCost(int64_t count);
OpCost DropoutBackwardCost(int64_t count);
OpCost AxpbyCost(int64_t count, bool reads_y);

// Element counts of the tensors an op touches.
uint64_t ConvInputCount(const Conv2dShape& shape);
uint64_t ConvWeightCount(const Conv2dShape& shape);
uint64_t ConvOutputCount(const Conv2dShape& shape);
uint64_t PoolInputCount(const MaxPoolShape& shape);
uint64_t PoolOutputCount(const MaxPoolShape& shape);

}  // namespace tessera
