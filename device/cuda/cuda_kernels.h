// The CUDA backend's kernels: launchers that enqueue one kernel each on `stream` and return at
// once. Pointers are device addresses; counts are elements. Shapes, argmax layout and rounding
// follow device/device.h exactly, as the CPU kernels do. Internal to device/cuda/; compiled by
// nvcc (cuda_kernels.cu) and called from cuda_device.cc. Launch errors surface through
// cudaGetLastError, which the device checks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "device/device.h"

namespace tessera::cuda {

// col[n][k][p]: per sample, one row per (channel, kernel row, kernel column), one column per
// output position; zero where the window reads padding.
void Im2Col(cudaStream_t stream, const Conv2dShape& shape, const float* x, float* col);
// dx = the sum of every column entry into the input element it was read from (overwrites).
void Col2Im(cudaStream_t stream, const Conv2dShape& shape, const float* col, float* dx);
// sum[i] = sum over b < batches of parts[b * count + i].
void SumOverBatches(cudaStream_t stream, int64_t batches, int64_t count, const float* parts, float* sum);

void BiasAdd(cudaStream_t stream, int64_t outer, int channels, int64_t inner, const float* bias, float* x);
void BiasGrad(cudaStream_t stream, int64_t outer, int channels, int64_t inner, const float* dy, float* dbias);
void Relu(cudaStream_t stream, int64_t count, const float* x, float* y);
void ReluBackward(cudaStream_t stream, int64_t count, const float* y, const float* dy, float* dx);
void MaxPool(cudaStream_t stream, const MaxPoolShape& shape, const float* x, float* y, int32_t* argmax);
// Deterministic: a gather over each input's windows, no atomics (see device.h).
void MaxPoolBackward(cudaStream_t stream, const MaxPoolShape& shape, const float* dy, const int32_t* argmax,
                     float* dx);
// row_losses needs `batch` doubles of scratch.
void SoftmaxCrossEntropy(cudaStream_t stream, int batch, int classes, const float* logits, const int32_t* labels,
                         double* row_losses, float* loss, float* dlogits);
void SgdMomentumUpdate(cudaStream_t stream, int64_t count, float learning_rate, float momentum, float weight_decay,
                       const float* gradients, float* velocity, float* weights);
// y += alpha * (a - b); y may alias a or b.
void AddScaledDifference(cudaStream_t stream, int64_t count, float alpha, const float* a, const float* b, float* y);
// partials needs ReduceSumPartials() doubles of scratch.
int ReduceSumPartials();
void ReduceSum(cudaStream_t stream, int64_t count, const float* x, double* partials, float* sum);
void Cast(cudaStream_t stream, int64_t count, DType from, const void* x, DType to, void* y);
void Fill(cudaStream_t stream, int64_t count, float value, float* x);
// x[i] *= factor; a factor of 0 writes zeros (NaN and infinity included), as BLAS's beta.
void Scale(cudaStream_t stream, int64_t count, float factor, float* x);

}  // namespace tessera::cuda
