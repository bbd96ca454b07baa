#include "device/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/target_clones.h"
#include "device/float16.h"

// Hot loops are built twice, for AVX2+FMA and for baseline x86-64, and picked at load time
// (base/target_clones.h says where they are not).
#define TESSERA_VECTORIZED TESSERA_CLONES_AVX2_FMA

namespace tessera::cpu {
namespace {

// A float sum in eight independent lanes, so the compiler can vectorise it without
// reassociation flags.
TESSERA_VECTORIZED
float LaneSum(const float* __restrict x, int64_t count) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    for (int lane = 0; lane < 8; ++lane) lanes[lane] += x[i + lane];
  }
  float sum = 0.0f;
  for (; i < count; ++i) sum += x[i];
  for (float lane : lanes) sum += lane;
  return sum;
}

}  // namespace

TESSERA_VECTORIZED
void Im2Col(const Conv2dShape& s, const float* __restrict x, float* __restrict col) {
  const int out_h = s.out_height(), out_w = s.out_width();
  const int64_t positions = static_cast<int64_t>(out_h) * out_w;
  const int64_t row_length = positions;
  const int64_t sample_length = static_cast<int64_t>(s.in_channels) * s.kernel_height * s.kernel_width * positions;
  const int64_t plane = static_cast<int64_t>(s.in_height) * s.in_width;
  for (int c = 0; c < s.in_channels; ++c) {
    for (int kh = 0; kh < s.kernel_height; ++kh) {
      for (int kw = 0; kw < s.kernel_width; ++kw) {
        float* row = col + ((static_cast<int64_t>(c) * s.kernel_height + kh) * s.kernel_width + kw) * row_length;
        for (int n = 0; n < s.batch; ++n) {
          const float* image = x + (static_cast<int64_t>(n) * s.in_channels + c) * plane;
          float* out = row + n * sample_length;
          for (int oh = 0; oh < out_h; ++oh) {
            const int ih = oh * s.stride - s.padding + kh;
            float* out_row = out + static_cast<int64_t>(oh) * out_w;
            if (ih < 0 || ih >= s.in_height) {
              std::fill(out_row, out_row + out_w, 0.0f);
              continue;
            }
            const float* in_row = image + static_cast<int64_t>(ih) * s.in_width;
            if (s.stride == 1 && s.padding == 0) {
              const float* source = in_row + kw;
              for (int ow = 0; ow < out_w; ++ow) out_row[ow] = source[ow];  // short rows: no memcpy call
              continue;
            }
            for (int ow = 0; ow < out_w; ++ow) {
              const int iw = ow * s.stride - s.padding + kw;
              out_row[ow] = (iw >= 0 && iw < s.in_width) ? in_row[iw] : 0.0f;
            }
          }
        }
      }
    }
  }
}

TESSERA_VECTORIZED
void Col2Im(const Conv2dShape& s, const float* __restrict col, float* __restrict dx) {
  const int out_h = s.out_height(), out_w = s.out_width();
  const int64_t positions = static_cast<int64_t>(out_h) * out_w;
  const int64_t row_length = positions;
  const int64_t sample_length = static_cast<int64_t>(s.in_channels) * s.kernel_height * s.kernel_width * positions;
  const int64_t plane = static_cast<int64_t>(s.in_height) * s.in_width;
  std::fill(dx, dx + s.batch * s.in_channels * plane, 0.0f);
  for (int c = 0; c < s.in_channels; ++c) {
    for (int kh = 0; kh < s.kernel_height; ++kh) {
      for (int kw = 0; kw < s.kernel_width; ++kw) {
        const float* row =
            col + ((static_cast<int64_t>(c) * s.kernel_height + kh) * s.kernel_width + kw) * row_length;
        for (int n = 0; n < s.batch; ++n) {
          float* image = dx + (static_cast<int64_t>(n) * s.in_channels + c) * plane;
          const float* in = row + n * sample_length;
          for (int oh = 0; oh < out_h; ++oh) {
            const int ih = oh * s.stride - s.padding + kh;
            if (ih < 0 || ih >= s.in_height) continue;
            float* image_row = image + static_cast<int64_t>(ih) * s.in_width;
            const float* in_row = in + static_cast<int64_t>(oh) * out_w;
            if (s.stride == 1 && s.padding == 0) {
              float* target = image_row + kw;
              for (int ow = 0; ow < out_w; ++ow) target[ow] += in_row[ow];
              continue;
            }
            for (int ow = 0; ow < out_w; ++ow) {
              const int iw = ow * s.stride - s.padding + kw;
              if (iw >= 0 && iw < s.in_width) image_row[iw] += in_row[ow];
            }
          }
        }
      }
    }
  }
}

TESSERA_VECTORIZED
void BiasAdd(int64_t outer, int channels, int64_t inner, const float* __restrict bias, float* __restrict x) {
  for (int64_t o = 0; o < outer; ++o) {
    float* block = x + o * channels * inner;
    if (inner == 1) {
      for (int c = 0; c < channels; ++c) block[c] += bias[c];
      continue;
    }
    for (int c = 0; c < channels; ++c) {
      float* row = block + c * inner;
      const float b = bias[c];
      for (int64_t i = 0; i < inner; ++i) row[i] += b;
    }
  }
}

TESSERA_VECTORIZED
void BiasGrad(int64_t outer, int channels, int64_t inner, const float* __restrict dy, float* __restrict dbias) {
  std::fill(dbias, dbias + channels, 0.0f);
  for (int64_t o = 0; o < outer; ++o) {
    const float* block = dy + o * channels * inner;
    if (inner == 1) {
      for (int c = 0; c < channels; ++c) dbias[c] += block[c];
      continue;
    }
    for (int c = 0; c < channels; ++c) dbias[c] += LaneSum(block + c * inner, inner);
  }
}

TESSERA_VECTORIZED
void Relu(int64_t count, const float* x, float* y) {
  for (int64_t i = 0; i < count; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

TESSERA_VECTORIZED
void ReluBackward(int64_t count, const float* y, const float* dy, float* dx) {
  for (int64_t i = 0; i < count; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

TESSERA_VECTORIZED
void MaxPool(const MaxPoolShape& s, const float* __restrict x, float* __restrict y, int32_t* __restrict argmax) {
  const int out_h = s.out_height(), out_w = s.out_width();
  const int64_t in_plane = static_cast<int64_t>(s.in_height) * s.in_width;
  const int64_t out_plane = static_cast<int64_t>(out_h) * out_w;
  const int64_t planes = static_cast<int64_t>(s.batch) * s.channels;
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float* in = x + plane * in_plane;
    float* out = y + plane * out_plane;
    int32_t* index = argmax + plane * out_plane;
    if (s.window == 2 && s.stride == 2) {  // the common case, branch-free
      for (int oh = 0; oh < out_h; ++oh) {
        const float* upper = in + 2 * oh * s.in_width;
        const float* lower = upper + s.in_width;
        const int32_t base = 2 * oh * s.in_width;
        for (int ow = 0; ow < out_w; ++ow) {
          const float a = upper[2 * ow], b = upper[2 * ow + 1], c = lower[2 * ow], d = lower[2 * ow + 1];
          const int32_t top = b > a ? base + 2 * ow + 1 : base + 2 * ow;
          const float top_value = b > a ? b : a;
          const int32_t bottom = d > c ? base + s.in_width + 2 * ow + 1 : base + s.in_width + 2 * ow;
          const float bottom_value = d > c ? d : c;
          out[oh * out_w + ow] = bottom_value > top_value ? bottom_value : top_value;
          index[oh * out_w + ow] = bottom_value > top_value ? bottom : top;
        }
      }
      continue;
    }
    for (int oh = 0; oh < out_h; ++oh) {
      for (int ow = 0; ow < out_w; ++ow) {
        const int top = oh * s.stride, left = ow * s.stride;
        int32_t best_index = top * s.in_width + left;
        float best = in[best_index];
        for (int kh = 0; kh < s.window; ++kh) {
          for (int kw = 0; kw < s.window; ++kw) {
            const int32_t at = (top + kh) * s.in_width + left + kw;
            if (in[at] > best) {
              best = in[at];
              best_index = at;
            }
          }
        }
        out[oh * out_w + ow] = best;
        index[oh * out_w + ow] = best_index;
      }
    }
  }
}

void MaxPoolBackward(const MaxPoolShape& s, const float* __restrict dy, const int32_t* __restrict argmax,
                     float* __restrict dx) {
  const int64_t in_plane = static_cast<int64_t>(s.in_height) * s.in_width;
  const int64_t out_plane = static_cast<int64_t>(s.out_height()) * s.out_width();
  const int64_t planes = static_cast<int64_t>(s.batch) * s.channels;
  std::fill(dx, dx + planes * in_plane, 0.0f);
  for (int64_t plane = 0; plane < planes; ++plane) {
    float* target = dx + plane * in_plane;
    const float* source = dy + plane * out_plane;
    const int32_t* index = argmax + plane * out_plane;
    for (int64_t i = 0; i < out_plane; ++i) target[index[i]] += source[i];
  }
}

float SoftmaxCrossEntropy(int batch, int classes, const float* logits, const int32_t* labels, float* dlogits) {
  double total = 0.0;
  const float scale = 1.0f / static_cast<float>(batch);
  for (int n = 0; n < batch; ++n) {
    const float* row = logits + static_cast<int64_t>(n) * classes;
    const float max = *std::max_element(row, row + classes);
    double sum = 0.0;
    for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(row[c] - max));
    const double log_sum = std::log(sum);
    total += log_sum - (row[labels[n]] - max);
    if (dlogits != nullptr) {
      float* grad = dlogits + static_cast<int64_t>(n) * classes;
      for (int c = 0; c < classes; ++c) {
        const double probability = std::exp(static_cast<double>(row[c] - max) - log_sum);
        grad[c] = static_cast<float>(probability) * scale;
      }
      grad[labels[n]] -= scale;
    }
  }
  return static_cast<float>(total / batch);
}

TESSERA_VECTORIZED
void SgdMomentumUpdate(int64_t count, float learning_rate, float momentum, float weight_decay,
                       const float* __restrict gradients, float* __restrict velocity, float* __restrict weights) {
  for (int64_t i = 0; i < count; ++i) {
    const float d = gradients[i] + weight_decay * weights[i];
    const float v = momentum * velocity[i] + d;
    velocity[i] = v;
    weights[i] -= learning_rate * v;
  }
}

TESSERA_VECTORIZED
void AddScaledDifference(int64_t count, float alpha, const float* a, const float* b, float* y) {
  for (int64_t i = 0; i < count; ++i) y[i] += alpha * (a[i] - b[i]);
}

double Sum(int64_t count, const float* x) {
  double total = 0.0;
  for (int64_t i = 0; i < count; ++i) total += x[i];
  return total;
}

namespace {

float LoadAsFloat(DType dtype, const void* x, int64_t i) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(x)[i];
    case DType::kFloat16: return HalfToFloat(static_cast<const uint16_t*>(x)[i]);
    case DType::kBFloat16: {
      const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(x)[i]) << 16;
      float value;
      std::memcpy(&value, &bits, sizeof(value));
      return value;
    }
    case DType::kInt8: return static_cast<const int8_t*>(x)[i];
    case DType::kInt32: return static_cast<float>(static_cast<const int32_t*>(x)[i]);
  }
  return 0.0f;
}

template <typename Int>
Int RoundAndSaturate(float value) {
  if (std::isnan(value)) return 0;
  const double rounded = std::nearbyint(static_cast<double>(value));
  const double low = static_cast<double>(std::numeric_limits<Int>::min());
  const double high = static_cast<double>(std::numeric_limits<Int>::max());
  return static_cast<Int>(std::clamp(rounded, low, high));
}

void StoreFromFloat(DType dtype, float value, void* y, int64_t i) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(y)[i] = value; return;
    case DType::kFloat16: static_cast<uint16_t*>(y)[i] = FloatToHalf(value); return;
    case DType::kBFloat16: {
      uint32_t bits;
      std::memcpy(&bits, &value, sizeof(bits));
      uint16_t upper;
      if (std::isnan(value)) {
        upper = static_cast<uint16_t>((bits >> 16) | 0x40);  // stay a (quiet) NaN
      } else {
        const uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);  // to nearest, ties to even
        upper = static_cast<uint16_t>((bits + rounding) >> 16);
      }
      static_cast<uint16_t*>(y)[i] = upper;
      return;
    }
    case DType::kInt8: static_cast<int8_t*>(y)[i] = RoundAndSaturate<int8_t>(value); return;
    case DType::kInt32: static_cast<int32_t*>(y)[i] = RoundAndSaturate<int32_t>(value); return;
  }
}

}  // namespace

void Cast(int64_t count, DType from, const void* x, DType to, void* y) {
  for (int64_t i = 0; i < count; ++i) StoreFromFloat(to, LoadAsFloat(from, x, i), y, i);
}

// ---- The ops of declared layer graphs ----
//
// The transcendental functions run in double and round once: this is the reference other
// backends are compared against, so it should be the correctly rounded value wherever that is
// cheap. libm's scalar calls do not vectorise, so the loops that make them are not cloned.

namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;    // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)

}  // namespace

void Activation(ActivationFunction function, int64_t count, const float* x, float* y) {
  switch (function) {
    case ActivationFunction::kGelu:
      for (int64_t i = 0; i < count; ++i) {
        const double v = x[i];
        y[i] = static_cast<float>(0.5 * v * (1.0 + std::erf(v * kInvSqrt2)));
      }
      return;
    case ActivationFunction::kTanh:
      for (int64_t i = 0; i < count; ++i) y[i] = static_cast<float>(std::tanh(static_cast<double>(x[i])));
      return;
    case ActivationFunction::kSigmoid:
      // exp(-x) overflows to infinity for x below about -709, and 1 / (1 + inf) is the right 0.
      for (int64_t i = 0; i < count; ++i) {
        y[i] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x[i]))));
      }
      return;
  }
}

namespace {

// tanh and sigmoid from the saved output, in float as documented: the few ulps a double
// evaluation would save are below what the saved (rounded) y already carries.
TESSERA_VECTORIZED
void TanhBackward(int64_t count, const float* y, const float* dy, float* dx) {
  for (int64_t i = 0; i < count; ++i) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

TESSERA_VECTORIZED
void SigmoidBackward(int64_t count, const float* y, const float* dy, float* dx) {
  for (int64_t i = 0; i < count; ++i) dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

}  // namespace

void ActivationBackward(ActivationFunction function, int64_t count, const float* x, const float* y, const float* dy,
                        float* dx) {
  switch (function) {
    case ActivationFunction::kGelu:
      // d/dx x Phi(x) = Phi(x) + x phi(x), from x alone (y is not read).
      for (int64_t i = 0; i < count; ++i) {
        const double v = x[i];
        const double cdf = 0.5 * (1.0 + std::erf(v * kInvSqrt2));
        const double pdf = kInvSqrt2Pi * std::exp(-0.5 * v * v);
        dx[i] = static_cast<float>(static_cast<double>(dy[i]) * (cdf + v * pdf));
      }
      return;
    case ActivationFunction::kTanh: TanhBackward(count, y, dy, dx); return;
    case ActivationFunction::kSigmoid: SigmoidBackward(count, y, dy, dx); return;
  }
}

void AvgPool(const MaxPoolShape& s, const float* __restrict x, float* __restrict y) {
  const int out_h = s.out_height(), out_w = s.out_width();
  const int64_t in_plane = static_cast<int64_t>(s.in_height) * s.in_width;
  const int64_t out_plane = static_cast<int64_t>(out_h) * out_w;
  const int64_t planes = static_cast<int64_t>(s.batch) * s.channels;
  const double area = static_cast<double>(s.window) * s.window;
  for (int64_t plane = 0; plane < planes; ++plane) {
    const float* in = x + plane * in_plane;
    float* out = y + plane * out_plane;
    for (int oh = 0; oh < out_h; ++oh) {
      for (int ow = 0; ow < out_w; ++ow) {
        const float* corner = in + static_cast<int64_t>(oh) * s.stride * s.in_width + ow * s.stride;
        double sum = 0.0;  // row by row, left to right
        for (int kh = 0; kh < s.window; ++kh) {
          for (int kw = 0; kw < s.window; ++kw) sum += corner[static_cast<int64_t>(kh) * s.in_width + kw];
        }
        out[static_cast<int64_t>(oh) * out_w + ow] = static_cast<float>(sum / area);
      }
    }
  }
}

void AvgPoolBackward(const MaxPoolShape& s, const float* __restrict dy, float* __restrict dx) {
  const int out_h = s.out_height(), out_w = s.out_width();
  const int64_t in_plane = static_cast<int64_t>(s.in_height) * s.in_width;
  const int64_t out_plane = static_cast<int64_t>(out_h) * out_w;
  const int64_t planes = static_cast<int64_t>(s.batch) * s.channels;
  const float area = static_cast<float>(s.window * s.window);
  std::fill(dx, dx + planes * in_plane, 0.0f);
  // Scatter in output order: where windows overlap, an input's share is summed in the order of
  // the outputs that cover it (the device.h contract), the same order a gather over them gives.
  for (int64_t plane = 0; plane < planes; ++plane) {
    float* target = dx + plane * in_plane;
    const float* source = dy + plane * out_plane;
    for (int oh = 0; oh < out_h; ++oh) {
      for (int ow = 0; ow < out_w; ++ow) {
        const float share = source[static_cast<int64_t>(oh) * out_w + ow] / area;
        float* corner = target + static_cast<int64_t>(oh) * s.stride * s.in_width + ow * s.stride;
        for (int kh = 0; kh < s.window; ++kh) {
          for (int kw = 0; kw < s.window; ++kw) corner[static_cast<int64_t>(kh) * s.in_width + kw] += share;
        }
      }
    }
  }
}

// Statistics per channel in double, two passes (mean, then squared deviations: no cancellation
// when the mean is large against the spread), in the fixed order outer, then inner.
void BatchNormForward(const BatchNormShape& s, bool training, float momentum, float epsilon, const float* x,
                      const float* gamma, const float* beta, float* running_mean, float* running_var,
                      float* saved_mean, float* saved_invstd, float* y) {
  const int64_t n = s.outer * s.inner;
  if (n == 0) return;  // no positions: no statistics, nothing to normalise
  const int64_t stride = static_cast<int64_t>(s.channels) * s.inner;  // from one outer block to the next
  for (int c = 0; c < s.channels; ++c) {
    const float* channel = x + static_cast<int64_t>(c) * s.inner;
    double mean = 0.0, invstd = 0.0;
    if (training) {
      double sum = 0.0;
      for (int64_t o = 0; o < s.outer; ++o) {
        const float* row = channel + o * stride;
        for (int64_t i = 0; i < s.inner; ++i) sum += row[i];
      }
      mean = sum / static_cast<double>(n);
      double squares = 0.0;
      for (int64_t o = 0; o < s.outer; ++o) {
        const float* row = channel + o * stride;
        for (int64_t i = 0; i < s.inner; ++i) {
          const double deviation = row[i] - mean;
          squares += deviation * deviation;
        }
      }
      const double variance = squares / static_cast<double>(n);
      invstd = 1.0 / std::sqrt(variance + static_cast<double>(epsilon));
      saved_mean[c] = static_cast<float>(mean);
      saved_invstd[c] = static_cast<float>(invstd);
      // PyTorch's running variance is the unbiased one; a single position has none, so the
      // biased (zero) one is used, as device.h says.
      const double unbiased = n > 1 ? variance * static_cast<double>(n) / static_cast<double>(n - 1) : variance;
      const double keep = 1.0 - static_cast<double>(momentum);
      running_mean[c] = static_cast<float>(keep * running_mean[c] + static_cast<double>(momentum) * mean);
      running_var[c] = static_cast<float>(keep * running_var[c] + static_cast<double>(momentum) * unbiased);
    } else {
      mean = running_mean[c];
      invstd = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + static_cast<double>(epsilon));
    }
    const double g = gamma[c], b = beta[c];
    for (int64_t o = 0; o < s.outer; ++o) {
      const float* row = channel + o * stride;
      float* out = y + static_cast<int64_t>(c) * s.inner + o * stride;
      for (int64_t i = 0; i < s.inner; ++i) out[i] = static_cast<float>(g * ((row[i] - mean) * invstd) + b);
    }
  }
}

void BatchNormBackward(const BatchNormShape& s, const float* x, const float* dy, const float* gamma,
                       const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma, float* dbeta) {
  const int64_t n = s.outer * s.inner;
  const int64_t stride = static_cast<int64_t>(s.channels) * s.inner;
  for (int c = 0; c < s.channels; ++c) {
    const int64_t first = static_cast<int64_t>(c) * s.inner;
    const double mean = saved_mean[c], invstd = saved_invstd[c];
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int64_t o = 0; o < s.outer; ++o) {
      const float* x_row = x + first + o * stride;
      const float* dy_row = dy + first + o * stride;
      for (int64_t i = 0; i < s.inner; ++i) {
        const double xhat = (x_row[i] - mean) * invstd;
        sum_dy += dy_row[i];
        sum_dy_xhat += dy_row[i] * xhat;
      }
    }
    dgamma[c] = static_cast<float>(sum_dy_xhat);
    dbeta[c] = static_cast<float>(sum_dy);
    if (dx == nullptr || n == 0) continue;
    const double scale = gamma[c] * invstd / static_cast<double>(n);
    for (int64_t o = 0; o < s.outer; ++o) {
      const float* x_row = x + first + o * stride;
      const float* dy_row = dy + first + o * stride;
      float* dx_row = dx + first + o * stride;
      for (int64_t i = 0; i < s.inner; ++i) {
        const double xhat = (x_row[i] - mean) * invstd;
        dx_row[i] = static_cast<float>(scale * (static_cast<double>(n) * dy_row[i] - sum_dy - xhat * sum_dy_xhat));
      }
    }
  }
}

void LayerNormForward(int64_t rows, int columns, float epsilon, const float* x, const float* gamma, const float* beta,
                      float* saved_mean, float* saved_invstd, float* y) {
  if (columns <= 0) return;  // an empty row has no statistics
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * columns;
    float* out = y + r * columns;
    double sum = 0.0;
    for (int j = 0; j < columns; ++j) sum += row[j];
    const double mean = sum / columns;
    double squares = 0.0;
    for (int j = 0; j < columns; ++j) {
      const double deviation = row[j] - mean;
      squares += deviation * deviation;
    }
    const double invstd = 1.0 / std::sqrt(squares / columns + static_cast<double>(epsilon));
    saved_mean[r] = static_cast<float>(mean);
    saved_invstd[r] = static_cast<float>(invstd);
    for (int j = 0; j < columns; ++j) {
      out[j] = static_cast<float>(static_cast<double>(gamma[j]) * ((row[j] - mean) * invstd) + beta[j]);
    }
  }
}

void LayerNormBackward(int64_t rows, int columns, const float* x, const float* dy, const float* gamma,
                       const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma, float* dbeta) {
  // dgamma and dbeta sum down the columns. A block of columns at a time keeps their double
  // accumulators on the stack and reads each row contiguously; every column is still summed
  // over rows 0, 1, ... in order, whatever the block width. Done before dx, which may be dy.
  constexpr int kBlock = 64;
  for (int first = 0; first < columns; first += kBlock) {
    const int width = std::min(kBlock, columns - first);
    double gamma_sums[kBlock] = {}, beta_sums[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const double mean = saved_mean[r], invstd = saved_invstd[r];
      const float* x_row = x + r * columns + first;
      const float* dy_row = dy + r * columns + first;
      for (int j = 0; j < width; ++j) {
        gamma_sums[j] += dy_row[j] * ((x_row[j] - mean) * invstd);
        beta_sums[j] += dy_row[j];
      }
    }
    for (int j = 0; j < width; ++j) {
      dgamma[first + j] = static_cast<float>(gamma_sums[j]);
      dbeta[first + j] = static_cast<float>(beta_sums[j]);
    }
  }
  if (dx == nullptr || columns <= 0) return;
  const double m = columns;
  for (int64_t r = 0; r < rows; ++r) {
    const double mean = saved_mean[r], invstd = saved_invstd[r];
    const float* x_row = x + r * columns;
    const float* dy_row = dy + r * columns;
    float* dx_row = dx + r * columns;
    double sum_g = 0.0, sum_g_xhat = 0.0;
    for (int j = 0; j < columns; ++j) {
      const double g = static_cast<double>(dy_row[j]) * gamma[j];
      sum_g += g;
      sum_g_xhat += g * ((x_row[j] - mean) * invstd);
    }
    const double scale = invstd / m;
    for (int j = 0; j < columns; ++j) {
      const double g = static_cast<double>(dy_row[j]) * gamma[j];
      const double xhat = (x_row[j] - mean) * invstd;
      dx_row[j] = static_cast<float>(scale * (m * g - sum_g - xhat * sum_g_xhat));
    }
  }
}

// The scale is computed in float, 1.0f / (1.0f - p), so that every backend writes the same
// mask bits; y = x * mask is one float multiply.
void Dropout(int64_t count, float probability, uint64_t seed, const float* x, float* y, float* mask) {
  const float scale = 1.0f / (1.0f - probability);
  for (int64_t i = 0; i < count; ++i) {
    const float kept = DropoutUniform(seed, static_cast<uint64_t>(i)) >= probability ? scale : 0.0f;
    mask[i] = kept;
    y[i] = x[i] * kept;
  }
}

TESSERA_VECTORIZED
void DropoutBackward(int64_t count, const float* mask, const float* dy, float* dx) {
  for (int64_t i = 0; i < count; ++i) dx[i] = dy[i] * mask[i];
}

TESSERA_VECTORIZED
void Axpby(int64_t count, float alpha, const float* x, float beta, float* y) {
  if (beta == 0.0f) {
    for (int64_t i = 0; i < count; ++i) y[i] = alpha * x[i];  // NaN or garbage in y must not survive
    return;
  }
  for (int64_t i = 0; i < count; ++i) y[i] = alpha * x[i] + beta * y[i];
}

}  // namespace tessera::cpu
