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

// The ops of declared layer graphs (device.h). Activation's backward reads x for GELU and y for
// tanh and sigmoid; the pooling backward is a gather with no atomics, like MaxPoolBackward.
void Activation(cudaStream_t stream, ActivationFunction function, int64_t count, const float* x, float* y);
void ActivationBackward(cudaStream_t stream, ActivationFunction function, int64_t count, const float* x,
                        const float* y, const float* dy, float* dx);
void AvgPool(cudaStream_t stream, const MaxPoolShape& shape, const float* x, float* y);
void AvgPoolBackward(cudaStream_t stream, const MaxPoolShape& shape, const float* dy, float* dx);
// Statistics by one block per channel (or row) reducing in double in a fixed order: deterministic.
void BatchNormForward(cudaStream_t stream, const BatchNormShape& shape, bool training, float momentum, float epsilon,
                      const float* x, const float* gamma, const float* beta, float* running_mean, float* running_var,
                      float* saved_mean, float* saved_invstd, float* y);
void BatchNormBackward(cudaStream_t stream, const BatchNormShape& shape, const float* x, const float* dy,
                       const float* gamma, const float* saved_mean, const float* saved_invstd, float* dx,
                       float* dgamma, float* dbeta);
void LayerNormForward(cudaStream_t stream, int64_t rows, int columns, float epsilon, const float* x,
                      const float* gamma, const float* beta, float* saved_mean, float* saved_invstd, float* y);
void LayerNormBackward(cudaStream_t stream, int64_t rows, int columns, const float* x, const float* dy,
                       const float* gamma, const float* saved_mean, const float* saved_invstd, float* dx,
                       float* dgamma, float* dbeta);
void Dropout(cudaStream_t stream, int64_t count, float probability, uint64_t seed, const float* x, float* y,
             float* mask);
void DropoutBackward(cudaStream_t stream, int64_t count, const float* mask, const float* dy, float* dx);
// y = alpha * x + beta * y; y is not read when beta is 0.
void Axpby(cudaStream_t stream, int64_t count, float alpha, const float* x, float beta, float* y);

}  // namespace tessera::cuda
