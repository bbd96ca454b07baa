#include "device/cuda/cuda_kernels.h"

#include <cuda_fp16.h>

#include <cfloat>

namespace tessera::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kReduceBlocks = 256;

unsigned Blocks(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

// One block per channel or row, up to the same cap; the kernels stride over the rest.
unsigned GroupBlocks(int64_t groups) {
  return static_cast<unsigned>(groups < 1 ? 1 : (groups > 65535 * 8 ? 65535 * 8 : groups));
}

// Grid-stride loop over [0, count).
#define TESSERA_FOR_EACH(i, count)                                                           \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (count); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// Sum of `value` over the block (blockDim.x == kThreads); the result is valid in thread 0.
__device__ double BlockSum(double value) {
  __shared__ double shared[kThreads];
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  return shared[0];
}

// Shape methods are host code, so the launchers pass the output height and width.
__global__ void Im2ColKernel(Conv2dShape s, int out_h, int out_w, const float* x, float* col) {
  const int64_t positions = static_cast<int64_t>(out_h) * out_w;
  const int64_t kernel = static_cast<int64_t>(s.in_channels) * s.kernel_height * s.kernel_width;
  const int64_t total = s.batch * kernel * positions;
  TESSERA_FOR_EACH(i, total) {
    const int64_t p = i % positions;
    const int64_t row = (i / positions) % kernel;
    const int64_t n = i / (positions * kernel);
    const int kw = static_cast<int>(row % s.kernel_width);
    const int kh = static_cast<int>((row / s.kernel_width) % s.kernel_height);
    const int c = static_cast<int>(row / (s.kernel_width * s.kernel_height));
    const int ih = static_cast<int>(p / out_w) * s.stride - s.padding + kh;
    const int iw = static_cast<int>(p % out_w) * s.stride - s.padding + kw;
    float value = 0.0f;
    if (ih >= 0 && ih < s.in_height && iw >= 0 && iw < s.in_width) {
      value = x[((n * s.in_channels + c) * s.in_height + ih) * s.in_width + iw];
    }
    col[i] = value;
  }
}

// Gather form: each input element sums the column entries that read it, so no atomics.
__global__ void Col2ImKernel(Conv2dShape s, int out_h, int out_w, const float* col, float* dx) {
  const int64_t positions = static_cast<int64_t>(out_h) * out_w;
  const int64_t kernel = static_cast<int64_t>(s.in_channels) * s.kernel_height * s.kernel_width;
  const int64_t total = static_cast<int64_t>(s.batch) * s.in_channels * s.in_height * s.in_width;
  TESSERA_FOR_EACH(i, total) {
    const int iw = static_cast<int>(i % s.in_width);
    const int ih = static_cast<int>((i / s.in_width) % s.in_height);
    const int c = static_cast<int>((i / (static_cast<int64_t>(s.in_width) * s.in_height)) % s.in_channels);
    const int64_t n = i / (static_cast<int64_t>(s.in_width) * s.in_height * s.in_channels);
    const float* sample = col + n * kernel * positions;
    float sum = 0.0f;
    for (int kh = 0; kh < s.kernel_height; ++kh) {
      const int h = ih + s.padding - kh;
      if (h < 0 || h % s.stride != 0 || h / s.stride >= out_h) continue;
      for (int kw = 0; kw < s.kernel_width; ++kw) {
        const int w = iw + s.padding - kw;
        if (w < 0 || w % s.stride != 0 || w / s.stride >= out_w) continue;
        const int64_t row = (static_cast<int64_t>(c) * s.kernel_height + kh) * s.kernel_width + kw;
        sum += sample[row * positions + static_cast<int64_t>(h / s.stride) * out_w + w / s.stride];
      }
    }
    dx[i] = sum;
  }
}

__global__ void SumOverBatchesKernel(int64_t batches, int64_t count, const float* parts, float* sum) {
  TESSERA_FOR_EACH(i, count) {
    float total = 0.0f;
    for (int64_t b = 0; b < batches; ++b) total += parts[b * count + i];
    sum[i] = total;
  }
}

__global__ void BiasAddKernel(int64_t outer, int channels, int64_t inner, const float* bias, float* x) {
  TESSERA_FOR_EACH(i, outer * channels * inner) x[i] += bias[(i / inner) % channels];
}

// One block per channel.
__global__ void BiasGradKernel(int64_t outer, int channels, int64_t inner, const float* dy, float* dbias) {
  const int channel = blockIdx.x;
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < outer * inner; j += blockDim.x) {
    const int64_t o = j / inner, k = j % inner;
    sum += dy[(o * channels + channel) * inner + k];
  }
  sum = BlockSum(sum);
  if (threadIdx.x == 0) dbias[channel] = static_cast<float>(sum);
}

__global__ void ReluKernel(int64_t count, const float* x, float* y) {
  TESSERA_FOR_EACH(i, count) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void ReluBackwardKernel(int64_t count, const float* y, const float* dy, float* dx) {
  TESSERA_FOR_EACH(i, count) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

// The first maximum in row-major window order wins ties, as on the CPU.
__global__ void MaxPoolKernel(MaxPoolShape s, int out_h, int out_w, const float* x, float* y, int32_t* argmax) {
  const int64_t out_plane = static_cast<int64_t>(out_h) * out_w;
  const int64_t in_plane = static_cast<int64_t>(s.in_height) * s.in_width;
  TESSERA_FOR_EACH(i, static_cast<int64_t>(s.batch) * s.channels * out_plane) {
    const int64_t plane = i / out_plane;
    const int oh = static_cast<int>((i % out_plane) / out_w), ow = static_cast<int>(i % out_w);
    const float* in = x + plane * in_plane;
    int32_t best_index = (oh * s.stride) * s.in_width + ow * s.stride;
    float best = in[best_index];
    for (int kh = 0; kh < s.window; ++kh) {
      for (int kw = 0; kw < s.window; ++kw) {
        const int32_t index = (oh * s.stride + kh) * s.in_width + ow * s.stride + kw;
        if (in[index] > best) {
          best = in[index];
          best_index = index;
        }
      }
    }
    y[i] = best;
    argmax[i] = best_index;
  }
}

// Gather form, one thread per input element: it sums dy over the outputs whose window holds it
// and chose it, in ascending output order, as the CPU's scatter adds them. No atomics, so
// overlapping windows give the same bits on every run and on both backends.
__global__ void MaxPoolBackwardKernel(MaxPoolShape s, int out_h, int out_w, const int32_t* argmax, const float* dy,
                                      float* dx) {
  const int64_t in_plane = static_cast<int64_t>(s.in_height) * s.in_width;
  const int64_t out_plane = static_cast<int64_t>(out_h) * out_w;
  TESSERA_FOR_EACH(i, static_cast<int64_t>(s.batch) * s.channels * in_plane) {
    const int64_t plane = i / in_plane;
    const int32_t index = static_cast<int32_t>(i % in_plane);
    const int ih = index / s.in_width, iw = index % s.in_width;
    // Windows oh with oh * stride <= ih <= oh * stride + window - 1, likewise ow.
    const int oh_first = ih < s.window ? 0 : (ih - s.window) / s.stride + 1;
    const int ow_first = iw < s.window ? 0 : (iw - s.window) / s.stride + 1;
    const int oh_last = min(ih / s.stride, out_h - 1), ow_last = min(iw / s.stride, out_w - 1);
    const int32_t* chosen = argmax + plane * out_plane;
    const float* gradient = dy + plane * out_plane;
    float sum = 0.0f;
    for (int oh = oh_first; oh <= oh_last; ++oh) {
      for (int ow = ow_first; ow <= ow_last; ++ow) {
        const int64_t o = static_cast<int64_t>(oh) * out_w + ow;
        if (chosen[o] == index) sum += gradient[o];
      }
    }
    dx[i] = sum;
  }
}

// One thread per row: classes are few (10 for the built-in models).
__global__ void SoftmaxRowsKernel(int batch, int classes, const float* logits, const int32_t* labels,
                                  double* row_losses, float* dlogits) {
  TESSERA_FOR_EACH(n, batch) {
    const float* row = logits + n * classes;
    float max = -FLT_MAX;
    for (int c = 0; c < classes; ++c) max = fmaxf(max, row[c]);
    double sum = 0.0;
    for (int c = 0; c < classes; ++c) sum += exp(static_cast<double>(row[c] - max));
    const double log_sum = log(sum);
    const int label = labels[n];
    row_losses[n] = log_sum - (row[label] - max);
    if (dlogits != nullptr) {
      const float scale = 1.0f / static_cast<float>(batch);
      float* grad = dlogits + n * classes;
      for (int c = 0; c < classes; ++c) {
        grad[c] = static_cast<float>(exp(static_cast<double>(row[c] - max) - log_sum)) * scale;
      }
      grad[label] -= scale;
    }
  }
}

// One block: out = sum(values[0..count)) / divisor.
__global__ void SumDoublesKernel(int64_t count, const double* values, double divisor, float* out) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += values[i];
  sum = BlockSum(sum);
  if (threadIdx.x == 0) *out = static_cast<float>(sum / divisor);
}

__global__ void SgdMomentumKernel(int64_t count, float learning_rate, float momentum, float weight_decay,
                                  const float* gradients, float* velocity, float* weights) {
  TESSERA_FOR_EACH(i, count) {
    const float d = gradients[i] + weight_decay * weights[i];
    const float v = momentum * velocity[i] + d;
    velocity[i] = v;
    weights[i] -= learning_rate * v;
  }
}

__global__ void AddScaledDifferenceKernel(int64_t count, float alpha, const float* a, const float* b, float* y) {
  TESSERA_FOR_EACH(i, count) y[i] += alpha * (a[i] - b[i]);
}

__global__ void PartialSumsKernel(int64_t count, const float* x, double* partials) {
  double sum = 0.0;
  TESSERA_FOR_EACH(i, count) sum += x[i];
  sum = BlockSum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__device__ float LoadAsFloat(DType dtype, const void* x, int64_t i) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(x)[i];
    case DType::kFloat16: return __half2float(static_cast<const __half*>(x)[i]);
    case DType::kBFloat16:
      return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(x)[i]) << 16);
    case DType::kInt8: return static_cast<float>(static_cast<const int8_t*>(x)[i]);
    case DType::kInt32: return static_cast<float>(static_cast<const int32_t*>(x)[i]);
  }
  return 0.0f;
}

// Round to nearest even, then saturate; NaN becomes 0 (the CPU backend's rule).
__device__ double RoundAndClamp(float value, double low, double high) {
  if (isnan(value)) return 0.0;
  return fmin(fmax(rint(static_cast<double>(value)), low), high);
}

__device__ void StoreFromFloat(DType dtype, float value, void* y, int64_t i) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(y)[i] = value; return;
    case DType::kFloat16: static_cast<__half*>(y)[i] = __float2half_rn(value); return;
    case DType::kBFloat16: {
      const uint32_t bits = __float_as_uint(value);
      const uint16_t upper = isnan(value) ? static_cast<uint16_t>((bits >> 16) | 0x40)
                                          : static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
      static_cast<uint16_t*>(y)[i] = upper;
      return;
    }
    case DType::kInt8: static_cast<int8_t*>(y)[i] = static_cast<int8_t>(RoundAndClamp(value, -128.0, 127.0)); return;
    case DType::kInt32:
      static_cast<int32_t*>(y)[i] = static_cast<int32_t>(RoundAndClamp(value, -2147483648.0, 2147483647.0));
      return;
  }
}

__global__ void CastKernel(int64_t count, DType from, const void* x, DType to, void* y) {
  TESSERA_FOR_EACH(i, count) StoreFromFloat(to, LoadAsFloat(from, x, i), y, i);
}

__global__ void FillKernel(int64_t count, float value, float* x) {
  TESSERA_FOR_EACH(i, count) x[i] = value;
}

// BLAS's beta: 0 writes zeros without reading x (which may hold NaN).
__global__ void ScaleKernel(int64_t count, float factor, float* x) {
  TESSERA_FOR_EACH(i, count) x[i] = factor == 0.0f ? 0.0f : factor * x[i];
}

// BlockSum for use more than once in a kernel: every thread gets the sum, and the barrier
// keeps the next call from overwriting the shared array before all threads have read it.
__device__ double BlockSumAll(double value) {
  const double sum = BlockSum(value);
  __syncthreads();
  return sum;
}

// The exact GELU and its derivative Phi(x) + x phi(x), Phi the standard normal CDF.
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

__device__ float ActivationValue(ActivationFunction function, float x) {
  switch (function) {
    case ActivationFunction::kGelu: return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
    case ActivationFunction::kTanh: return tanhf(x);
    case ActivationFunction::kSigmoid: return 1.0f / (1.0f + expf(-x));
  }
  return 0.0f;
}

// Reads x only for GELU and y only for tanh and sigmoid: the caller may pass null for the other.
__device__ float ActivationSlope(ActivationFunction function, const float* x, const float* y, int64_t i) {
  switch (function) {
    case ActivationFunction::kGelu: {
      const float v = x[i];
      return 0.5f * (1.0f + erff(v * kInvSqrt2)) + v * expf(-0.5f * v * v) * kInvSqrt2Pi;
    }
    case ActivationFunction::kTanh: return 1.0f - y[i] * y[i];
    case ActivationFunction::kSigmoid: return y[i] * (1.0f - y[i]);
  }
  return 0.0f;
}

__global__ void ActivationKernel(ActivationFunction function, int64_t count, const float* x, float* y) {
  TESSERA_FOR_EACH(i, count) y[i] = ActivationValue(function, x[i]);
}

__global__ void ActivationBackwardKernel(ActivationFunction function, int64_t count, const float* x, const float* y,
                                         const float* dy, float* dx) {
  TESSERA_FOR_EACH(i, count) dx[i] = dy[i] * ActivationSlope(function, x, y, i);
}

// Sums in row-major window order, then divides, as the CPU does.
__global__ void AvgPoolKernel(MaxPoolShape s, int out_h, int out_w, const float* x, float* y) {
  const int64_t out_plane = static_cast<int64_t>(out_h) * out_w;
  const int64_t in_plane = static_cast<int64_t>(s.in_height) * s.in_width;
  const float area = static_cast<float>(s.window * s.window);
  TESSERA_FOR_EACH(i, static_cast<int64_t>(s.batch) * s.channels * out_plane) {
    const int64_t plane = i / out_plane;
    const int oh = static_cast<int>((i % out_plane) / out_w), ow = static_cast<int>(i % out_w);
    const float* in = x + plane * in_plane + static_cast<int64_t>(oh * s.stride) * s.in_width + ow * s.stride;
    float sum = 0.0f;
    for (int kh = 0; kh < s.window; ++kh) {
      for (int kw = 0; kw < s.window; ++kw) sum += in[kh * s.in_width + kw];
    }
    y[i] = sum / area;
  }
}

// Gather form as in MaxPoolBackwardKernel: each input adds dy / area of every window holding
// it, in ascending output order, so overlapping windows need no atomics.
__global__ void AvgPoolBackwardKernel(MaxPoolShape s, int out_h, int out_w, const float* dy, float* dx) {
  const int64_t in_plane = static_cast<int64_t>(s.in_height) * s.in_width;
  const int64_t out_plane = static_cast<int64_t>(out_h) * out_w;
  const float area = static_cast<float>(s.window * s.window);
  TESSERA_FOR_EACH(i, static_cast<int64_t>(s.batch) * s.channels * in_plane) {
    const int64_t plane = i / in_plane;
    const int index = static_cast<int>(i % in_plane);
    const int ih = index / s.in_width, iw = index % s.in_width;
    const int oh_first = ih < s.window ? 0 : (ih - s.window) / s.stride + 1;
    const int ow_first = iw < s.window ? 0 : (iw - s.window) / s.stride + 1;
    const int oh_last = min(ih / s.stride, out_h - 1), ow_last = min(iw / s.stride, out_w - 1);
    const float* gradient = dy + plane * out_plane;
    float sum = 0.0f;
    for (int oh = oh_first; oh <= oh_last; ++oh) {
      for (int ow = ow_first; ow <= ow_last; ++ow) sum += gradient[static_cast<int64_t>(oh) * out_w + ow] / area;
    }
    dx[i] = sum;
  }
}

// One block per channel (grid-strided over channels): the batch's mean and biased variance in
// double, two passes so that a large mean does not cancel the variance away.
__global__ void BatchNormStatisticsKernel(BatchNormShape s, float momentum, float epsilon, const float* x,
                                          float* running_mean, float* running_var, float* saved_mean,
                                          float* saved_invstd) {
  const int64_t n = s.outer * s.inner;
  for (int c = blockIdx.x; c < s.channels; c += gridDim.x) {
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      sum += x[((j / s.inner) * s.channels + c) * s.inner + j % s.inner];
    }
    const double mean = BlockSumAll(sum) / static_cast<double>(n);
    double squares = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const double d = x[((j / s.inner) * s.channels + c) * s.inner + j % s.inner] - mean;
      squares += d * d;
    }
    const double var = BlockSumAll(squares) / static_cast<double>(n);
    if (threadIdx.x == 0) {
      const double unbiased = n > 1 ? var * static_cast<double>(n) / static_cast<double>(n - 1) : var;
      saved_mean[c] = static_cast<float>(mean);
      saved_invstd[c] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(epsilon)));
      running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * static_cast<float>(mean);
      running_var[c] = (1.0f - momentum) * running_var[c] + momentum * static_cast<float>(unbiased);
    }
  }
}

// y = gamma (x - mean) invstd + beta per channel. invstd is given (training: the saved one) or,
// when `variance` is set, derived from it (inference: the running variance).
__global__ void BatchNormApplyKernel(BatchNormShape s, float epsilon, const float* mean, const float* invstd,
                                     const float* variance, const float* gamma, const float* beta, const float* x,
                                     float* y) {
  TESSERA_FOR_EACH(i, s.outer * s.channels * s.inner) {
    const int c = static_cast<int>((i / s.inner) % s.channels);
    const float scale = variance != nullptr ? 1.0f / sqrtf(variance[c] + epsilon) : invstd[c];
    y[i] = gamma[c] * (x[i] - mean[c]) * scale + beta[c];
  }
}

// One block per channel: sum dy and sum dy xhat in double, then (when dx is wanted) the same
// block writes its channel's dx from those sums. The writes follow the reductions' barriers, so
// dx may share memory with dy.
__global__ void BatchNormBackwardKernel(BatchNormShape s, const float* x, const float* dy, const float* gamma,
                                        const float* saved_mean, const float* saved_invstd, float* dx,
                                        float* dgamma, float* dbeta) {
  const int64_t n = s.outer * s.inner;
  for (int c = blockIdx.x; c < s.channels; c += gridDim.x) {
    const float mean = saved_mean[c], invstd = saved_invstd[c];
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const int64_t at = ((j / s.inner) * s.channels + c) * s.inner + j % s.inner;
      const float xhat = (x[at] - mean) * invstd;
      sum_dy += dy[at];
      sum_dy_xhat += static_cast<double>(dy[at]) * xhat;
    }
    sum_dy = BlockSumAll(sum_dy);
    sum_dy_xhat = BlockSumAll(sum_dy_xhat);
    if (threadIdx.x == 0) {
      dgamma[c] = static_cast<float>(sum_dy_xhat);
      dbeta[c] = static_cast<float>(sum_dy);
    }
    if (dx == nullptr) continue;
    const float count = static_cast<float>(n);
    const float scale = gamma[c] * invstd / count;
    const float total_dy = static_cast<float>(sum_dy), total_dy_xhat = static_cast<float>(sum_dy_xhat);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const int64_t at = ((j / s.inner) * s.channels + c) * s.inner + j % s.inner;
      const float xhat = (x[at] - mean) * invstd;
      dx[at] = scale * (count * dy[at] - total_dy - xhat * total_dy_xhat);
    }
  }
}

// One block per row (grid-strided over rows): mean and biased variance in double, two passes,
// then the block writes its row.
__global__ void LayerNormForwardKernel(int64_t rows, int columns, float epsilon, const float* x, const float* gamma,
                                       const float* beta, float* saved_mean, float* saved_invstd, float* y) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* in = x + r * columns;
    double sum = 0.0;
    for (int j = threadIdx.x; j < columns; j += blockDim.x) sum += in[j];
    const double mean = BlockSumAll(sum) / columns;
    double squares = 0.0;
    for (int j = threadIdx.x; j < columns; j += blockDim.x) {
      const double d = in[j] - mean;
      squares += d * d;
    }
    const double var = BlockSumAll(squares) / columns;
    const float row_mean = static_cast<float>(mean);
    const float invstd = static_cast<float>(1.0 / sqrt(var + static_cast<double>(epsilon)));
    if (threadIdx.x == 0) {
      saved_mean[r] = row_mean;
      saved_invstd[r] = invstd;
    }
    float* out = y + r * columns;
    for (int j = threadIdx.x; j < columns; j += blockDim.x) out[j] = gamma[j] * (in[j] - row_mean) * invstd + beta[j];
  }
}

// One thread per column, over the rows in order: the same sums on every run.
__global__ void LayerNormParameterGradKernel(int64_t rows, int columns, const float* x, const float* dy,
                                             const float* saved_mean, const float* saved_invstd, float* dgamma,
                                             float* dbeta) {
  TESSERA_FOR_EACH(j, columns) {
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t at = r * columns + j;
      const float xhat = (x[at] - saved_mean[r]) * saved_invstd[r];
      sum_dy += dy[at];
      sum_dy_xhat += static_cast<double>(dy[at]) * xhat;
    }
    dgamma[j] = static_cast<float>(sum_dy_xhat);
    dbeta[j] = static_cast<float>(sum_dy);
  }
}

// One block per row: sum g and sum g xhat (g = dy gamma) in double, then the row's dx. The
// writes follow the reductions' barriers, so dx may share memory with dy.
__global__ void LayerNormDataGradKernel(int64_t rows, int columns, const float* x, const float* dy,
                                        const float* gamma, const float* saved_mean, const float* saved_invstd,
                                        float* dx) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t row = r * columns;
    const float mean = saved_mean[r], invstd = saved_invstd[r];
    double sum_g = 0.0, sum_g_xhat = 0.0;
    for (int j = threadIdx.x; j < columns; j += blockDim.x) {
      const float g = dy[row + j] * gamma[j];
      sum_g += g;
      sum_g_xhat += static_cast<double>(g) * ((x[row + j] - mean) * invstd);
    }
    sum_g = BlockSumAll(sum_g);
    sum_g_xhat = BlockSumAll(sum_g_xhat);
    const float m = static_cast<float>(columns);
    const float total_g = static_cast<float>(sum_g), total_g_xhat = static_cast<float>(sum_g_xhat);
    for (int j = threadIdx.x; j < columns; j += blockDim.x) {
      const float g = dy[row + j] * gamma[j];
      const float xhat = (x[row + j] - mean) * invstd;
      dx[row + j] = invstd / m * (m * g - total_g - xhat * total_g_xhat);
    }
  }
}

// The draw is DropoutUniform, the same function the host backends call, so every backend drops
// the same elements.
__global__ void DropoutKernel(int64_t count, float probability, float scale, uint64_t seed, const float* x, float* y,
                              float* mask) {
  TESSERA_FOR_EACH(i, count) {
    const float keep = DropoutUniform(seed, static_cast<uint64_t>(i)) >= probability ? scale : 0.0f;
    mask[i] = keep;
    y[i] = x[i] * keep;
  }
}

__global__ void DropoutBackwardKernel(int64_t count, const float* mask, const float* dy, float* dx) {
  TESSERA_FOR_EACH(i, count) dx[i] = dy[i] * mask[i];
}

// BLAS's beta: 0 leaves y unread (it may hold NaN).
__global__ void AxpbyKernel(int64_t count, float alpha, const float* x, float beta, float* y) {
  TESSERA_FOR_EACH(i, count) y[i] = beta == 0.0f ? alpha * x[i] : alpha * x[i] + beta * y[i];
}

}  // namespace

void Im2Col(cudaStream_t stream, const Conv2dShape& shape, const float* x, float* col) {
  const int64_t total = int64_t(shape.batch) * shape.in_channels * shape.kernel_height * shape.kernel_width *
                        shape.out_height() * shape.out_width();
  Im2ColKernel<<<Blocks(total), kThreads, 0, stream>>>(shape, shape.out_height(), shape.out_width(), x, col);
}

void Col2Im(cudaStream_t stream, const Conv2dShape& shape, const float* col, float* dx) {
  const int64_t total = int64_t(shape.batch) * shape.in_channels * shape.in_height * shape.in_width;
  Col2ImKernel<<<Blocks(total), kThreads, 0, stream>>>(shape, shape.out_height(), shape.out_width(), col, dx);
}

void SumOverBatches(cudaStream_t stream, int64_t batches, int64_t count, const float* parts, float* sum) {
  SumOverBatchesKernel<<<Blocks(count), kThreads, 0, stream>>>(batches, count, parts, sum);
}

void BiasAdd(cudaStream_t stream, int64_t outer, int channels, int64_t inner, const float* bias, float* x) {
  BiasAddKernel<<<Blocks(outer * channels * inner), kThreads, 0, stream>>>(outer, channels, inner, bias, x);
}

void BiasGrad(cudaStream_t stream, int64_t outer, int channels, int64_t inner, const float* dy, float* dbias) {
  BiasGradKernel<<<channels, kThreads, 0, stream>>>(outer, channels, inner, dy, dbias);
}

void Relu(cudaStream_t stream, int64_t count, const float* x, float* y) {
  ReluKernel<<<Blocks(count), kThreads, 0, stream>>>(count, x, y);
}

void ReluBackward(cudaStream_t stream, int64_t count, const float* y, const float* dy, float* dx) {
  ReluBackwardKernel<<<Blocks(count), kThreads, 0, stream>>>(count, y, dy, dx);
}

void MaxPool(cudaStream_t stream, const MaxPoolShape& shape, const float* x, float* y, int32_t* argmax) {
  const int64_t outputs = int64_t(shape.batch) * shape.channels * shape.out_height() * shape.out_width();
  MaxPoolKernel<<<Blocks(outputs), kThreads, 0, stream>>>(shape, shape.out_height(), shape.out_width(), x, y, argmax);
}

void MaxPoolBackward(cudaStream_t stream, const MaxPoolShape& shape, const float* dy, const int32_t* argmax,
                     float* dx) {
  const int64_t inputs = int64_t(shape.batch) * shape.channels * shape.in_height * shape.in_width;
  MaxPoolBackwardKernel<<<Blocks(inputs), kThreads, 0, stream>>>(shape, shape.out_height(), shape.out_width(), argmax,
                                                                  dy, dx);
}

void SoftmaxCrossEntropy(cudaStream_t stream, int batch, int classes, const float* logits, const int32_t* labels,
                         double* row_losses, float* loss, float* dlogits) {
  SoftmaxRowsKernel<<<Blocks(batch), kThreads, 0, stream>>>(batch, classes, logits, labels, row_losses, dlogits);
  SumDoublesKernel<<<1, kThreads, 0, stream>>>(batch, row_losses, static_cast<double>(batch), loss);
}

void SgdMomentumUpdate(cudaStream_t stream, int64_t count, float learning_rate, float momentum, float weight_decay,
                       const float* gradients, float* velocity, float* weights) {
  SgdMomentumKernel<<<Blocks(count), kThreads, 0, stream>>>(count, learning_rate, momentum, weight_decay, gradients,
                                                            velocity, weights);
}

void AddScaledDifference(cudaStream_t stream, int64_t count, float alpha, const float* a, const float* b, float* y) {
  AddScaledDifferenceKernel<<<Blocks(count), kThreads, 0, stream>>>(count, alpha, a, b, y);
}

int ReduceSumPartials() { return kReduceBlocks; }

void ReduceSum(cudaStream_t stream, int64_t count, const float* x, double* partials, float* sum) {
  PartialSumsKernel<<<kReduceBlocks, kThreads, 0, stream>>>(count, x, partials);
  SumDoublesKernel<<<1, kThreads, 0, stream>>>(kReduceBlocks, partials, 1.0, sum);
}

void Cast(cudaStream_t stream, int64_t count, DType from, const void* x, DType to, void* y) {
  CastKernel<<<Blocks(count), kThreads, 0, stream>>>(count, from, x, to, y);
}

void Fill(cudaStream_t stream, int64_t count, float value, float* x) {
  FillKernel<<<Blocks(count), kThreads, 0, stream>>>(count, value, x);
}

void Scale(cudaStream_t stream, int64_t count, float factor, float* x) {
  ScaleKernel<<<Blocks(count), kThreads, 0, stream>>>(count, factor, x);
}

void Activation(cudaStream_t stream, ActivationFunction function, int64_t count, const float* x, float* y) {
  ActivationKernel<<<Blocks(count), kThreads, 0, stream>>>(function, count, x, y);
}

void ActivationBackward(cudaStream_t stream, ActivationFunction function, int64_t count, const float* x,
                        const float* y, const float* dy, float* dx) {
  ActivationBackwardKernel<<<Blocks(count), kThreads, 0, stream>>>(function, count, x, y, dy, dx);
}

void AvgPool(cudaStream_t stream, const MaxPoolShape& shape, const float* x, float* y) {
  const int64_t outputs = int64_t(shape.batch) * shape.channels * shape.out_height() * shape.out_width();
  AvgPoolKernel<<<Blocks(outputs), kThreads, 0, stream>>>(shape, shape.out_height(), shape.out_width(), x, y);
}

void AvgPoolBackward(cudaStream_t stream, const MaxPoolShape& shape, const float* dy, float* dx) {
  const int64_t inputs = int64_t(shape.batch) * shape.channels * shape.in_height * shape.in_width;
  AvgPoolBackwardKernel<<<Blocks(inputs), kThreads, 0, stream>>>(shape, shape.out_height(), shape.out_width(), dy,
                                                                  dx);
}

void BatchNormForward(cudaStream_t stream, const BatchNormShape& shape, bool training, float momentum, float epsilon,
                      const float* x, const float* gamma, const float* beta, float* running_mean, float* running_var,
                      float* saved_mean, float* saved_invstd, float* y) {
  // An empty batch has no statistics (and no y); a grid of 0 blocks would be a launch error.
  if (shape.channels <= 0 || shape.outer * shape.inner <= 0) return;
  if (training) {
    BatchNormStatisticsKernel<<<GroupBlocks(shape.channels), kThreads, 0, stream>>>(
        shape, momentum, epsilon, x, running_mean, running_var, saved_mean, saved_invstd);
  }
  const int64_t count = shape.outer * shape.channels * shape.inner;
  BatchNormApplyKernel<<<Blocks(count), kThreads, 0, stream>>>(
      shape, epsilon, training ? saved_mean : running_mean, training ? saved_invstd : nullptr,
      training ? nullptr : running_var, gamma, beta, x, y);
}

void BatchNormBackward(cudaStream_t stream, const BatchNormShape& shape, const float* x, const float* dy,
                       const float* gamma, const float* saved_mean, const float* saved_invstd, float* dx,
                       float* dgamma, float* dbeta) {
  if (shape.channels <= 0) return;
  BatchNormBackwardKernel<<<GroupBlocks(shape.channels), kThreads, 0, stream>>>(shape, x, dy, gamma, saved_mean,
                                                                                saved_invstd, dx, dgamma, dbeta);
}

void LayerNormForward(cudaStream_t stream, int64_t rows, int columns, float epsilon, const float* x,
                      const float* gamma, const float* beta, float* saved_mean, float* saved_invstd, float* y) {
  if (rows <= 0 || columns <= 0) return;
  LayerNormForwardKernel<<<GroupBlocks(rows), kThreads, 0, stream>>>(rows, columns, epsilon, x, gamma, beta,
                                                                     saved_mean, saved_invstd, y);
}

void LayerNormBackward(cudaStream_t stream, int64_t rows, int columns, const float* x, const float* dy,
                       const float* gamma, const float* saved_mean, const float* saved_invstd, float* dx,
                       float* dgamma, float* dbeta) {
  if (columns <= 0) return;
  // The parameter gradients first: they read dy, which dx may overwrite.
  LayerNormParameterGradKernel<<<Blocks(columns), kThreads, 0, stream>>>(rows, columns, x, dy, saved_mean,
                                                                         saved_invstd, dgamma, dbeta);
  if (dx == nullptr || rows <= 0) return;
  LayerNormDataGradKernel<<<GroupBlocks(rows), kThreads, 0, stream>>>(rows, columns, x, dy, gamma, saved_mean,
                                                                      saved_invstd, dx);
}

void Dropout(cudaStream_t stream, int64_t count, float probability, uint64_t seed, const float* x, float* y,
             float* mask) {
  // The scale in float, as the host backends compute it, so kept elements match bit for bit.
  const float scale = 1.0f / (1.0f - probability);
  DropoutKernel<<<Blocks(count), kThreads, 0, stream>>>(count, probability, scale, seed, x, y, mask);
}

void DropoutBackward(cudaStream_t stream, int64_t count, const float* mask, const float* dy, float* dx) {
  DropoutBackwardKernel<<<Blocks(count), kThreads, 0, stream>>>(count, mask, dy, dx);
}

void Axpby(cudaStream_t stream, int64_t count, float alpha, const float* x, float beta, float* y) {
  AxpbyKernel<<<Blocks(count), kThreads, 0, stream>>>(count, alpha, x, beta, y);
}

}  // namespace tessera::cuda
