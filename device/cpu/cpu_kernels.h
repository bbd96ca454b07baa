// Host loops behind the CPU backend's ops. Internal to device/cpu/: pointers are host memory,
// shapes as documented on Device. Each function is single-threaded and allocation-free;
// scratch space is passed in by the caller.
#pragma once

#include <cstdint>

#include "device/device.h"

namespace tessera::cpu {

// col[n][k][p] for k = (channel, kernel row, kernel column), p = output position: one
// [in_channels * kernel_height * kernel_width, out_height * out_width] matrix per sample, so
// each sample's GEMM reads and writes NCHW directly.
void Im2Col(const Conv2dShape& shape, const float* x, float* col);
// The adjoint of Im2Col: dx = 0, then dx += every col entry at the input position it came from.
void Col2Im(const Conv2dShape& shape, const float* col, float* dx);


void BiasAdd(int64_t outer, int channels, int64_t inner, const float* bias, float* x);
void BiasGrad(int64_t outer, int channels, int64_t inner, const float* dy, float* dbias);
void Relu(int64_t count, const float* x, float* y);
void ReluBackward(int64_t count, const float* y, const float* dy, float* dx);
void MaxPool(const MaxPoolShape& shape, const float* x, float* y, int32_t* argmax);
void MaxPoolBackward(const MaxPoolShape& shape, const float* dy, const int32_t* argmax, float* dx);
// Returns the mean loss.
float SoftmaxCrossEntropy(int batch, int classes, const float* logits, const int32_t* labels, float* dlogits);
void SgdMomentumUpdate(int64_t count, float learning_rate, float momentum, float weight_decay,
                       const float* gradients, float* velocity, float* weights);
// y += alpha * (a - b); y may alias a or b.
void AddScaledDifference(int64_t count, float alpha, const float* a, const float* b, float* y);
double Sum(int64_t count, const float* x);
void Cast(int64_t count, DType from, const void* x, DType to, void* y);

// The ops of declared layer graphs, as documented on Device. These are the reference every
// other backend is checked against: transcendental functions and per-channel or per-row
// statistics are evaluated in double and rounded once, and every sum runs in a fixed order.
void Activation(ActivationFunction function, int64_t count, const float* x, float* y);
void ActivationBackward(ActivationFunction function, int64_t count, const float* x, const float* y, const float* dy,
                        float* dx);
void AvgPool(const MaxPoolShape& shape, const float* x, float* y);
void AvgPoolBackward(const MaxPoolShape& shape, const float* dy, float* dx);
void BatchNormForward(const BatchNormShape& shape, bool training, float momentum, float epsilon, const float* x,
                      const float* gamma, const float* beta, float* running_mean, float* running_var,
                      float* saved_mean, float* saved_invstd, float* y);
void BatchNormBackward(const BatchNormShape& shape, const float* x, const float* dy, const float* gamma,
                       const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma, float* dbeta);
void LayerNormForward(int64_t rows, int columns, float epsilon, const float* x, const float* gamma, const float* beta,
                      float* saved_mean, float* saved_invstd, float* y);
void LayerNormBackward(int64_t rows, int columns, const float* x, const float* dy, const float* gamma,
                       const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma, float* dbeta);
void Dropout(int64_t count, float probability, uint64_t seed, const float* x, float* y, float* mask);
void DropoutBackward(int64_t count, const float* mask, const float* dy, float* dx);
// y = alpha x + beta y; y is not read when beta is 0.
void Axpby(int64_t count, float alpha, const float* x, float beta, float* y);

}  // namespace tessera::cpu
