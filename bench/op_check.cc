#include "bench/op_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "device/op_cost.h"

namespace tessera::op_check {
namespace {

constexpr size_t kGuardBytes = 256;
// After an input or scratch: NaN in every float type, so reading it poisons the outputs.
constexpr unsigned char kReadGuard = 0xFF;
// After an output: a finite float (0.747...), so that even an in-place update past the end
// (NaN + x is the same NaN) changes its bits.
constexpr unsigned char kWriteGuard = 0x3F;

std::string Shape(const Conv2dShape& s) {
  return "batch " + std::to_string(s.batch) + ", " + std::to_string(s.in_channels) + "x" +
         std::to_string(s.in_height) + "x" + std::to_string(s.in_width) + " -> " + std::to_string(s.out_channels) +
         ", kernel " + std::to_string(s.kernel_height) + "x" + std::to_string(s.kernel_width) + ", stride " +
         std::to_string(s.stride) + ", padding " + std::to_string(s.padding);
}

std::string Shape(const MaxPoolShape& s) {
  return "batch " + std::to_string(s.batch) + ", " + std::to_string(s.channels) + "x" + std::to_string(s.in_height) +
         "x" + std::to_string(s.in_width) + ", window " + std::to_string(s.window) + ", stride " +
         std::to_string(s.stride);
}

std::string Shape(const BatchNormShape& s) {
  return std::to_string(s.outer) + "x" + std::to_string(s.channels) + "x" + std::to_string(s.inner);
}

std::string Number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", value);
  return text;
}

}  // namespace

std::vector<float> Pattern(size_t count, uint32_t seed, float low, float high) {
  std::vector<float> values(count);
  const float step = (high - low) / 16777216.0f;
  for (size_t i = 0; i < count; ++i) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B9u ^ (seed + 1) * 0x85EBCA6Bu ^ static_cast<uint32_t>(i >> 32);
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    values[i] = low + step * static_cast<float>(x >> 8);
  }
  return values;
}

void* OpRun::Add(const void* host, size_t bytes, bool output, const char* kind, bool ints) {
  Result<DeviceBuffer> buffer = device_.Allocate(bytes + kGuardBytes);
  if (!buffer.ok()) {
    // An op cannot be issued on a buffer that does not exist; nothing sensible follows.
    std::fprintf(stderr, "op_check: cannot allocate %zu bytes on %s: %s\n", bytes + kGuardBytes,
                 device_.capabilities().name.c_str(), buffer.status().ToString().c_str());
    std::abort();
  }
  const unsigned char guard = output ? kWriteGuard : kReadGuard;
  std::vector<unsigned char> staged(bytes + kGuardBytes, guard);
  if (host != nullptr && bytes > 0) std::memcpy(staged.data(), host, bytes);
  Status copied = device_.CopyHostToDevice(staged.data(), *buffer, 0, staged.size());
  if (!copied.ok() && setup_.ok()) setup_ = copied;
  Slot slot;
  slot.buffer = std::move(buffer).value();
  slot.bytes = bytes;
  slot.output = output;
  slot.ints = ints;
  slot.guard = guard;
  slot.what = std::string(kind) + " #" + std::to_string(output ? ++outputs_ : ++inputs_);
  slots_.push_back(std::move(slot));
  return slots_.back().buffer.data();
}

float* OpRun::In(const std::vector<float>& host) {
  return static_cast<float*>(Add(host.data(), host.size() * sizeof(float), false, "input"));
}

int32_t* OpRun::Ints(const std::vector<int32_t>& host) {
  return static_cast<int32_t*>(Add(host.data(), host.size() * sizeof(int32_t), false, "input"));
}

float* OpRun::Out(size_t count) { return Out(std::vector<float>(count, 0.0f)); }

float* OpRun::Out(const std::vector<float>& initial) {
  return static_cast<float*>(Add(initial.data(), initial.size() * sizeof(float), true, "output"));
}

int32_t* OpRun::IntsOut(size_t count) {
  const std::vector<int32_t> zeros(count, 0);
  return static_cast<int32_t*>(Add(zeros.data(), count * sizeof(int32_t), true, "output", /*ints=*/true));
}

void* OpRun::Raw(size_t bytes) { return Add(nullptr, bytes, false, "scratch"); }

Result<std::vector<float>> OpRun::Results() {
  RETURN_IF_ERROR(setup_);
  RETURN_IF_ERROR(device_.Synchronize());
  std::vector<float> all;
  for (const Slot& slot : slots_) {
    std::vector<unsigned char> host(slot.bytes + kGuardBytes);
    RETURN_IF_ERROR(device_.CopyDeviceToHost(slot.buffer, 0, host.data(), host.size()));
    for (size_t i = slot.bytes; i < host.size(); ++i) {
      if (host[i] != slot.guard) {
        return FailedPreconditionError("the op wrote past the end of its " + slot.what + " (" +
                                       std::to_string(slot.bytes) + " bytes): byte " + std::to_string(i) +
                                       " of the guard that follows it changed");
      }
    }
    if (!slot.output) continue;
    const size_t count = slot.bytes / sizeof(float);
    const size_t first = all.size();
    all.resize(first + count);
    for (size_t i = 0; i < count; ++i) {
      if (slot.ints) {
        int32_t value;
        std::memcpy(&value, host.data() + i * sizeof(value), sizeof(value));
        all[first + i] = static_cast<float>(value);
      } else {
        std::memcpy(&all[first + i], host.data() + i * sizeof(float), sizeof(float));
      }
    }
  }
  return all;
}

OpComparison Compare(const OpCheck& check, Device& device, Device& reference) {
  OpComparison result;
  OpRun expected_run(reference), got_run(device);
  check.issue(expected_run);
  Result<std::vector<float>> expected = expected_run.Results();
  if (!expected.ok()) {
    result.failure = "on the reference " + reference.capabilities().name + ": " + expected.status().ToString();
    return result;
  }
  check.issue(got_run);
  Result<std::vector<float>> got = got_run.Results();
  if (!got.ok()) {
    result.failure = "on " + device.capabilities().name + ": " + got.status().ToString();
    return result;
  }
  if (got->size() != expected->size()) {
    result.failure = std::to_string(got->size()) + " outputs, the reference has " + std::to_string(expected->size());
    return result;
  }
  result.outputs = got->size();
  for (size_t i = 0; i < got->size(); ++i) {
    const float e = (*expected)[i], g = (*got)[i];
    if (!std::isfinite(e) || !std::isfinite(g)) {
      result.failure = "output " + std::to_string(i) + " is not finite (" + Number(g) + ", reference " + Number(e) +
                       "): the op read past the end of an input, or overflowed";
      return result;
    }
    result.scale = std::max(result.scale, std::fabs(double(e)));
  }
  result.allowed = check.tolerance * std::max(1.0, result.scale);
  for (size_t i = 0; i < got->size(); ++i) {
    const float e = (*expected)[i], g = (*got)[i];
    const double error = std::fabs(double(g) - double(e));
    result.max_error = std::max(result.max_error, error);
    const bool differs = check.tolerance == 0 ? std::memcmp(&e, &g, sizeof(float)) != 0 : error > result.allowed;
    if (differs && result.failure.empty()) {
      result.failure = "output " + std::to_string(i) + " is " + Number(g) + ", the reference " + Number(e) +
                       (check.tolerance == 0 ? " (the same bits expected)"
                                             : " (error " + Number(error) + " > allowed " + Number(result.allowed) + ")");
    }
  }
  return result;
}

namespace {

OpCheck GemmCheck(bool ta, bool tb, int m, int n, int k, float alpha, float beta, bool nan_c = false) {
  OpCheck check;
  check.op = Op::kGemm;
  check.name = std::string("gemm ") + (ta ? "a^T " : "a ") + (tb ? "b^T " : "b ") + std::to_string(m) + "x" +
               std::to_string(n) + "x" + std::to_string(k) + " alpha " + Number(alpha) + " beta " + Number(beta) +
               (nan_c ? " over a NaN c" : "");
  check.large = double(m) * n * k > 1e8;
  check.issue = [=](OpRun& r) {
    std::vector<float> c = nan_c ? std::vector<float>(size_t(m) * n, std::numeric_limits<float>::quiet_NaN())
                                 : Pattern(size_t(m) * n, 3);
    float* out = r.Out(c);
    r.device().Gemm(ta, tb, m, n, k, alpha, r.In(Pattern(size_t(m) * k, 1)), r.In(Pattern(size_t(k) * n, 2)), beta,
                    out);
  };
  return check;
}

void AddConvChecks(const Conv2dShape& s, std::vector<OpCheck>& checks) {
  const size_t x = ConvInputCount(s), w = ConvWeightCount(s), y = ConvOutputCount(s);
  const int channels = s.out_channels;
  for (bool bias : {true, false}) {
    checks.push_back({"conv2d_forward " + Shape(s) + (bias ? " + bias" : ""), Op::kConv2dForward, false, 1e-4,
                      [=](OpRun& r) {
                        float* out = r.Out(y);
                        r.device().Conv2dForward(s, r.In(Pattern(x, 11)), r.In(Pattern(w, 12)),
                                                 bias ? r.In(Pattern(channels, 13)) : nullptr, out);
                      }});
    checks.push_back({"conv2d_backward_filter " + Shape(s) + (bias ? " + bias gradient" : ""),
                      Op::kConv2dBackwardFilter, false, 1e-4, [=](OpRun& r) {
                        float* dw = r.Out(w);
                        float* dbias = bias ? r.Out(channels) : nullptr;
                        r.device().Conv2dBackwardFilter(s, r.In(Pattern(x, 14)), r.In(Pattern(y, 15)), dw, dbias);
                      }});
  }
  checks.push_back({"conv2d_backward_data " + Shape(s), Op::kConv2dBackwardData, false, 1e-4, [=](OpRun& r) {
                      float* dx = r.Out(x);
                      r.device().Conv2dBackwardData(s, r.In(Pattern(y, 16)), r.In(Pattern(w, 17)), dx);
                    }});
}

// Max pool forward (outputs and argmax, as floats) and backward through the device's own
// argmax; `ties` draws inputs from {-1, 0, 1} so that windows hold equal maxima.
void AddPoolChecks(const MaxPoolShape& s, bool ties, std::vector<OpCheck>& checks) {
  const size_t x = PoolInputCount(s), y = PoolOutputCount(s);
  auto input = [=] {
    std::vector<float> values = Pattern(x, 21);
    if (ties) {
      for (float& value : values) value = std::round(value);
    }
    return values;
  };
  checks.push_back({"max_pool " + Shape(s) + (ties ? " with ties" : ""), Op::kMaxPool, false, 0, [=](OpRun& r) {
                      float* out = r.Out(y);
                      int32_t* argmax = r.IntsOut(y);
                      r.device().MaxPool(s, r.In(input()), out, argmax);
                    }});
  checks.push_back({"max_pool_backward " + Shape(s) + (ties ? " with ties" : ""), Op::kMaxPoolBackward, false, 0,
                    [=](OpRun& r) {
                      float* pooled = r.Out(y);
                      int32_t* argmax = r.IntsOut(y);
                      float* dx = r.Out(x);
                      r.device().MaxPool(s, r.In(input()), pooled, argmax);
                      r.device().MaxPoolBackward(s, r.In(Pattern(y, 22)), argmax, dx);
                    }});
}

OpCheck ReduceSumCheck(size_t count) {
  return {"reduce_sum " + std::to_string(count), Op::kReduceSum, count > (size_t(1) << 24), 1e-6, [=](OpRun& r) {
            float* sum = r.Out(1);
            r.device().ReduceSum(int64_t(count), r.In(Pattern(count, 31)), sum);
          }};
}

OpCheck BiasAddCheck(int64_t outer, int channels, int64_t inner) {
  const size_t count = size_t(outer) * channels * inner;
  return {"bias_add " + std::to_string(outer) + "x" + std::to_string(channels) + "x" + std::to_string(inner),
          Op::kBiasAdd, false, 1e-6, [=](OpRun& r) {
            float* x = r.Out(Pattern(count, 32));
            r.device().BiasAdd(outer, channels, inner, r.In(Pattern(channels, 33)), x);
          }};
}

OpCheck BiasGradCheck(int64_t outer, int channels, int64_t inner) {
  const size_t count = size_t(outer) * channels * inner;
  return {"bias_grad " + std::to_string(outer) + "x" + std::to_string(channels) + "x" + std::to_string(inner),
          Op::kBiasGrad, false, 1e-5, [=](OpRun& r) {
            float* dbias = r.Out(channels);
            r.device().BiasGrad(outer, channels, inner, r.In(Pattern(count, 34)), dbias);
          }};
}

OpCheck SoftmaxCheck(int batch, int classes) {
  return {"softmax_cross_entropy " + std::to_string(batch) + "x" + std::to_string(classes),
          Op::kSoftmaxCrossEntropy, false, 1e-5, [=](OpRun& r) {
            std::vector<int32_t> labels(batch);
            for (int i = 0; i < batch; ++i) labels[i] = (i * 7) % classes;
            float* loss = r.Out(1);
            float* dlogits = r.Out(size_t(batch) * classes);
            r.device().SoftmaxCrossEntropy(batch, classes, r.In(Pattern(size_t(batch) * classes, 35, -4, 4)),
                                           r.Ints(labels), loss, dlogits);
          }};
}

OpCheck SgdCheck(size_t count) {
  return {"sgd_momentum_update " + std::to_string(count), Op::kSgdMomentumUpdate, false, 1e-6, [=](OpRun& r) {
            float* velocity = r.Out(Pattern(count, 36));
            float* weights = r.Out(Pattern(count, 37));
            r.device().SgdMomentumUpdate(int64_t(count), 0.1f, 0.9f, 1e-4f, r.In(Pattern(count, 38)), velocity,
                                         weights);
          }};
}

OpCheck AddScaledDifferenceCheck(size_t count) {
  return {"add_scaled_difference " + std::to_string(count), Op::kAddScaledDifference, false, 1e-6, [=](OpRun& r) {
            float* y = r.Out(Pattern(count, 43));
            r.device().AddScaledDifference(int64_t(count), 0.01f, r.In(Pattern(count, 44)), r.In(Pattern(count, 45)), y);
          }};
}

OpCheck CastCheck(DType through, size_t count) {
  return {"cast float32 -> " + std::string(DTypeName(through)) + " -> float32 " + std::to_string(count), Op::kCast,
          false, 0, [=](OpRun& r) {
            float* back = r.Out(count);
            void* middle = r.Raw(count * DTypeSize(through));
            r.device().Cast(int64_t(count), DType::kFloat32, r.In(Pattern(count, 39, -300, 300)), through, middle);
            r.device().Cast(int64_t(count), through, middle, DType::kFloat32, back);
          }};
}

OpCheck ReluCheck(size_t count) {
  return {"relu " + std::to_string(count), Op::kRelu, false, 0, [=](OpRun& r) {
            float* y = r.Out(count);
            r.device().Relu(int64_t(count), r.In(Pattern(count, 40)), y);
          }};
}

OpCheck ReluBackwardCheck(size_t count) {
  return {"relu_backward " + std::to_string(count), Op::kReluBackward, false, 0, [=](OpRun& r) {
            float* dx = r.Out(count);
            r.device().ReluBackward(int64_t(count), r.In(Pattern(count, 41)), r.In(Pattern(count, 42)), dx);
          }};
}

OpCheck FillCheck(size_t count) {
  return {"fill " + std::to_string(count), Op::kFill, false, 0, [=](OpRun& r) {
            r.device().Fill(int64_t(count), -2.5f, r.Out(count));
          }};
}


// ---- The ops of declared layer graphs ----

// Activations over [low, high): [-4, 4) crosses every function's curved middle; a wide range
// reaches saturation, where exp overflows in a naive sigmoid and erf rounds to +-1.
OpCheck ActivationCheck(ActivationFunction function, size_t count, float low = -4, float high = 4) {
  return {std::string("activation ") + std::string(ActivationName(function)) + " " + std::to_string(count) +
              " over [" + Number(low) + ", " + Number(high) + ")",
          Op::kActivation, false, 1e-5, [=](OpRun& r) {
            float* y = r.Out(count);
            r.device().Activation(function, int64_t(count), r.In(Pattern(count, 51, low, high)), y);
          }};
}

// The backward from the device's own forward output, as a layer graph runs it; dx in place of
// a copy of dy when `in_place`.
OpCheck ActivationBackwardCheck(ActivationFunction function, size_t count, bool in_place = false) {
  return {std::string("activation_backward ") + std::string(ActivationName(function)) + " " + std::to_string(count) +
              (in_place ? " in place" : ""),
          Op::kActivationBackward, false, 1e-5, [=](OpRun& r) {
            const float* x = r.In(Pattern(count, 52, -4, 4));
            float* y = r.Out(count);
            r.device().Activation(function, int64_t(count), x, y);
            if (in_place) {
              float* gradient = r.Out(Pattern(count, 53));
              r.device().ActivationBackward(function, int64_t(count), x, y, gradient, gradient);
            } else {
              float* dx = r.Out(count);
              r.device().ActivationBackward(function, int64_t(count), x, y, r.In(Pattern(count, 53)), dx);
            }
          }};
}

// A mean of window^2 values: the order of the sum may move the last bit.
void AddAvgPoolChecks(const MaxPoolShape& s, std::vector<OpCheck>& checks) {
  const size_t x = PoolInputCount(s), y = PoolOutputCount(s);
  checks.push_back({"avg_pool " + Shape(s), Op::kAvgPool, false, 1e-6, [=](OpRun& r) {
                      float* out = r.Out(y);
                      r.device().AvgPool(s, r.In(Pattern(x, 54)), out);
                    }});
  // dx starts as garbage (the pattern): the op overwrites it, uncovered positions included.
  checks.push_back({"avg_pool_backward " + Shape(s), Op::kAvgPoolBackward, false, 1e-6, [=](OpRun& r) {
                      float* dx = r.Out(Pattern(x, 55));
                      r.device().AvgPoolBackward(s, r.In(Pattern(y, 56)), dx);
                    }});
}

// x in [2, 4): a mean far from zero against the spread, so a one-pass variance would lose
// digits. Training writes the running and saved statistics; not training, only y (the saved
// pointers are null, which device.h allows).
OpCheck BatchNormForwardCheck(const BatchNormShape& s, bool training) {
  const size_t count = size_t(s.outer) * s.channels * size_t(s.inner), channels = size_t(s.channels);
  return {"batch_norm_forward " + Shape(s) + (training ? " training" : " inference"), Op::kBatchNormForward, false,
          1e-4, [=](OpRun& r) {
            float* running_mean = r.Out(Pattern(channels, 57));
            float* running_var = r.Out(Pattern(channels, 58, 0.5f, 1.5f));
            float* saved_mean = training ? r.Out(channels) : nullptr;
            float* saved_invstd = training ? r.Out(channels) : nullptr;
            float* y = r.Out(count);
            r.device().BatchNormForward(s, training, 0.1f, 1e-5f, r.In(Pattern(count, 59, 2, 4)),
                                        r.In(Pattern(channels, 60, 0.5f, 1.5f)), r.In(Pattern(channels, 61)),
                                        running_mean, running_var, saved_mean, saved_invstd, y);
          }};
}

// The backward from the device's own training forward (its saved statistics); dgamma and
// dbeta alone when not `with_dx`.
OpCheck BatchNormBackwardCheck(const BatchNormShape& s, bool with_dx) {
  const size_t count = size_t(s.outer) * s.channels * size_t(s.inner), channels = size_t(s.channels);
  return {"batch_norm_backward " + Shape(s) + (with_dx ? "" : " without dx"), Op::kBatchNormBackward, false, 1e-4,
          [=](OpRun& r) {
            const float* x = r.In(Pattern(count, 62, -3, 1));
            const float* gamma = r.In(Pattern(channels, 63, 0.5f, 1.5f));
            float* running_mean = r.Out(channels);
            float* running_var = r.Out(std::vector<float>(channels, 1.0f));
            float* saved_mean = r.Out(channels);
            float* saved_invstd = r.Out(channels);
            float* y = r.Out(count);
            float* dx = with_dx ? r.Out(count) : nullptr;
            float* dgamma = r.Out(channels);
            float* dbeta = r.Out(channels);
            r.device().BatchNormForward(s, true, 0.1f, 1e-5f, x, gamma, r.In(Pattern(channels, 64)), running_mean,
                                        running_var, saved_mean, saved_invstd, y);
            r.device().BatchNormBackward(s, x, r.In(Pattern(count, 65)), gamma, saved_mean, saved_invstd, dx, dgamma,
                                         dbeta);
          }};
}

OpCheck LayerNormForwardCheck(int64_t rows, int columns) {
  const size_t count = size_t(rows) * columns;
  return {"layer_norm_forward " + std::to_string(rows) + "x" + std::to_string(columns), Op::kLayerNormForward, false,
          1e-4, [=](OpRun& r) {
            float* saved_mean = r.Out(size_t(rows));
            float* saved_invstd = r.Out(size_t(rows));
            float* y = r.Out(count);
            r.device().LayerNormForward(rows, columns, 1e-5f, r.In(Pattern(count, 66, 2, 4)),
                                        r.In(Pattern(columns, 67, 0.5f, 1.5f)), r.In(Pattern(columns, 68)),
                                        saved_mean, saved_invstd, y);
          }};
}

OpCheck LayerNormBackwardCheck(int64_t rows, int columns, bool with_dx) {
  const size_t count = size_t(rows) * columns;
  return {"layer_norm_backward " + std::to_string(rows) + "x" + std::to_string(columns) +
              (with_dx ? "" : " without dx"),
          Op::kLayerNormBackward, false, 1e-4, [=](OpRun& r) {
            const float* x = r.In(Pattern(count, 69, -3, 1));
            const float* gamma = r.In(Pattern(columns, 70, 0.5f, 1.5f));
            float* saved_mean = r.Out(size_t(rows));
            float* saved_invstd = r.Out(size_t(rows));
            float* y = r.Out(count);
            float* dx = with_dx ? r.Out(count) : nullptr;
            float* dgamma = r.Out(size_t(columns));
            float* dbeta = r.Out(size_t(columns));
            r.device().LayerNormForward(rows, columns, 1e-5f, x, gamma, r.In(Pattern(columns, 71)), saved_mean,
                                        saved_invstd, y);
            r.device().LayerNormBackward(rows, columns, x, r.In(Pattern(count, 72)), gamma, saved_mean, saved_invstd,
                                         dx, dgamma, dbeta);
          }};
}

// The draw depends only on (seed, index) and the mask is 1.0f / (1.0f - p) in float, so every
// backend must produce the same bits; a seed above 2^32 catches a draw truncated to 32 bits.
OpCheck DropoutCheck(size_t count, float probability, uint64_t seed) {
  return {"dropout " + std::to_string(count) + " p " + Number(probability) + " seed " + std::to_string(seed),
          Op::kDropout, false, 0, [=](OpRun& r) {
            float* y = r.Out(count);
            float* mask = r.Out(count);
            r.device().Dropout(int64_t(count), probability, seed, r.In(Pattern(count, 73)), y, mask);
          }};
}

OpCheck DropoutBackwardCheck(size_t count, float probability) {
  return {"dropout_backward " + std::to_string(count) + " p " + Number(probability), Op::kDropoutBackward, false, 0,
          [=](OpRun& r) {
            float* y = r.Out(count);
            float* mask = r.Out(count);
            float* dx = r.Out(count);
            const uint64_t seed = 0x243F6A8885A308D3ull;
            r.device().Dropout(int64_t(count), probability, seed, r.In(Pattern(count, 74)), y, mask);
            r.device().DropoutBackward(int64_t(count), mask, r.In(Pattern(count, 75)), dx);
          }};
}

// beta 0 over a NaN y: y must be overwritten, not multiplied. A device may fuse alpha x + beta y
// into one rounding, so the last bit is allowed to differ.
OpCheck AxpbyCheck(size_t count, float alpha, float beta, bool nan_y = false) {
  return {"axpby " + std::to_string(count) + " alpha " + Number(alpha) + " beta " + Number(beta) +
              (nan_y ? " over a NaN y" : ""),
          Op::kAxpby, false, 1e-6, [=](OpRun& r) {
            float* y = r.Out(nan_y ? std::vector<float>(count, std::numeric_limits<float>::quiet_NaN())
                                   : Pattern(count, 76));
            r.device().Axpby(int64_t(count), alpha, r.In(Pattern(count, 77)), beta, y);
          }};
}

}  // namespace

std::vector<OpCheck> BenchChecks() {
  std::vector<OpCheck> checks;
  checks.push_back(GemmCheck(false, false, 129, 65, 77, 0.5f, 0.25f));
  checks.push_back(GemmCheck(true, true, 129, 65, 77, 1.0f, 0.0f));
  // A strided, padded convolution whose output is 8x8: its bias ops see 64 positions.
  const Conv2dShape conv{4, 3, 17, 17, 8, 5, 5, 2, 1};
  AddConvChecks(conv, checks);
  const int64_t positions = int64_t(conv.out_height()) * conv.out_width();
  checks.push_back(BiasAddCheck(conv.batch, conv.out_channels, positions));
  checks.push_back(BiasGradCheck(conv.batch, conv.out_channels, positions));
  checks.push_back(ReluCheck(ConvInputCount(conv)));
  checks.push_back(ReluBackwardCheck(ConvInputCount(conv)));
  AddPoolChecks(MaxPoolShape{4, 6, 12, 12, 3, 2}, false, checks);
  checks.push_back(SoftmaxCheck(37, 10));
  checks.push_back(SgdCheck(ConvInputCount(conv)));
  checks.push_back(AddScaledDifferenceCheck(ConvInputCount(conv)));
  checks.push_back(ReduceSumCheck(size_t(1) << 20));
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kInt8}) checks.push_back(CastCheck(dtype, 1 << 20));
  checks.push_back(FillCheck(1000));
  // The layer-graph ops at the same sizes: the conv output normalised and activated, a
  // transformer-ish row width, the CNN's pool geometry.
  const size_t activations = ConvOutputCount(conv);
  for (ActivationFunction function :
       {ActivationFunction::kGelu, ActivationFunction::kTanh, ActivationFunction::kSigmoid}) {
    checks.push_back(ActivationCheck(function, activations));
    checks.push_back(ActivationBackwardCheck(function, activations));
  }
  AddAvgPoolChecks(MaxPoolShape{4, 6, 12, 12, 2, 2}, checks);
  const BatchNormShape norm{conv.batch, conv.out_channels, positions};
  checks.push_back(BatchNormForwardCheck(norm, true));
  checks.push_back(BatchNormForwardCheck(norm, false));
  checks.push_back(BatchNormBackwardCheck(norm, true));
  checks.push_back(LayerNormForwardCheck(37, 384));
  checks.push_back(LayerNormBackwardCheck(37, 384, true));
  checks.push_back(DropoutCheck(activations, 0.25f, 1234));
  checks.push_back(DropoutBackwardCheck(activations, 0.25f));
  checks.push_back(AxpbyCheck(activations, 1.0f, 1.0f));
  return checks;
}

std::vector<OpCheck> OddShapeChecks() {
  std::vector<OpCheck> checks;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (int size : {1, 3, 255, 257, 1025}) checks.push_back(GemmCheck(ta, tb, size, size, size, 0.5f, 0.25f));
      checks.push_back(GemmCheck(ta, tb, 1, 257, 3, 1.0f, 0.0f));
      checks.push_back(GemmCheck(ta, tb, 257, 1, 255, 1.0f, 1.0f));
      checks.push_back(GemmCheck(ta, tb, 3, 1025, 257, 0.5f, 0.25f));
      checks.push_back(GemmCheck(ta, tb, 255, 3, 1, 1.0f, 0.0f, /*nan_c=*/true));
      checks.push_back(GemmCheck(ta, tb, 1025, 257, 3, 2.0f, -1.0f));
      // k = 0: c = beta * c, and with beta 0 the NaNs in c are overwritten, not multiplied.
      checks.push_back(GemmCheck(ta, tb, 5, 7, 0, 1.0f, 0.5f));
      checks.push_back(GemmCheck(ta, tb, 5, 7, 0, 1.0f, 0.0f, /*nan_c=*/true));
      // Nothing to compute: the guards catch any write.
      checks.push_back(GemmCheck(ta, tb, 0, 7, 5, 1.0f, 0.5f));
      checks.push_back(GemmCheck(ta, tb, 5, 0, 5, 1.0f, 0.5f));
    }
  }
  for (const Conv2dShape& shape : {
           Conv2dShape{1, 3, 11, 7, 5, 3, 2, 2, 0},     // batch 1, non-square kernel, stride 2
           Conv2dShape{1, 2, 9, 13, 4, 1, 5, 3, 2},     // a 1x5 kernel, stride 3, padding 2
           Conv2dShape{3, 4, 17, 10, 6, 5, 3, 2, 1},
           Conv2dShape{2, 1, 7, 7, 3, 7, 7, 3, 2},      // a kernel as large as the input
           Conv2dShape{1, 3, 28, 28, 8, 3, 2, 1, 2},    // padding 2 on every side
           Conv2dShape{5, 2, 6, 9, 3, 2, 4, 3, 0},      // stride 3 leaves rows and columns unread
           Conv2dShape{1, 1, 1, 1, 2, 1, 1, 2, 0},      // one pixel
           Conv2dShape{1, 2, 5, 5, 3, 3, 3, 2, 2},      // windows of padding only at the corners
       }) {
    AddConvChecks(shape, checks);
  }
  for (const MaxPoolShape& shape : {
           MaxPoolShape{1, 1, 5, 5, 3, 2},    // overlapping windows
           MaxPoolShape{2, 3, 13, 11, 2, 2},  // a row and a column left over
           MaxPoolShape{1, 2, 7, 9, 3, 1},    // every input in up to nine windows
           MaxPoolShape{3, 2, 4, 4, 4, 4},    // one window per plane
           MaxPoolShape{1, 1, 1, 1, 1, 1},
       }) {
    AddPoolChecks(shape, false, checks);
    AddPoolChecks(shape, true, checks);
  }
  for (size_t count : {size_t{1}, size_t{257}, (size_t{1} << 27) + 3}) checks.push_back(ReduceSumCheck(count));
  for (const auto& [outer, channels, inner] :
       std::vector<std::tuple<int64_t, int, int64_t>>{{1, 1, 1}, {1, 3, 257}, {257, 2, 1}, {3, 5, 4097}, {64, 32, 784}}) {
    checks.push_back(BiasAddCheck(outer, channels, inner));
    checks.push_back(BiasGradCheck(outer, channels, inner));
  }
  for (const auto& [batch, classes] : std::vector<std::pair<int, int>>{{1, 10}, {257, 10}, {3, 1000}, {4099, 7}, {5, 1}}) {
    checks.push_back(SoftmaxCheck(batch, classes));
  }
  for (size_t count : {size_t{1}, size_t{257}, (size_t{1} << 20) + 7}) {
    checks.push_back(ReluCheck(count));
    checks.push_back(ReluBackwardCheck(count));
    checks.push_back(FillCheck(count));
    checks.push_back(SgdCheck(count));
    checks.push_back(AddScaledDifferenceCheck(count));
    for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kInt8, DType::kInt32}) {
      checks.push_back(CastCheck(dtype, count));
    }
  }
  // The layer-graph ops. Element-wise ones at the same odd counts; activations also far into
  // saturation; backwards also in place (dx = dy).
  for (size_t count : {size_t{1}, size_t{257}, (size_t{1} << 20) + 7}) {
    for (ActivationFunction function :
         {ActivationFunction::kGelu, ActivationFunction::kTanh, ActivationFunction::kSigmoid}) {
      checks.push_back(ActivationCheck(function, count));
      checks.push_back(ActivationBackwardCheck(function, count));
    }
    checks.push_back(DropoutCheck(count, 0.5f, 7));
    checks.push_back(DropoutBackwardCheck(count, 0.5f));
    checks.push_back(AxpbyCheck(count, 1.0f, 1.0f));
    checks.push_back(AxpbyCheck(count, -0.5f, 2.0f));
    checks.push_back(AxpbyCheck(count, 0.75f, 0.0f, /*nan_y=*/true));
  }
  for (ActivationFunction function :
       {ActivationFunction::kGelu, ActivationFunction::kTanh, ActivationFunction::kSigmoid}) {
    checks.push_back(ActivationCheck(function, 4099, -100, 100));
    checks.push_back(ActivationBackwardCheck(function, 4099, /*in_place=*/true));
  }
  // p = 0 keeps everything (mask 1); p = 0.9 keeps a tenth, with a mask just under 10 (0.9f is
  // not 0.9); seeds above 2^32.
  checks.push_back(DropoutCheck(4099, 0.0f, 1));
  checks.push_back(DropoutCheck(4099, 0.9f, 0xDEADBEEFCAFEF00Dull));
  checks.push_back(DropoutCheck((size_t{1} << 20) + 7, 0.1f, uint64_t{1} << 40));
  for (const MaxPoolShape& shape : {
           MaxPoolShape{1, 1, 5, 5, 3, 2},    // overlapping windows
           MaxPoolShape{2, 3, 13, 11, 2, 2},  // a row and a column left over (their dx is 0)
           MaxPoolShape{1, 2, 7, 9, 3, 1},    // every input in up to nine windows
           MaxPoolShape{3, 2, 4, 4, 4, 4},    // one window per plane
           MaxPoolShape{1, 1, 1, 1, 1, 1},
           MaxPoolShape{2, 2, 10, 10, 3, 3},  // stride = window, the last column unread
       }) {
    AddAvgPoolChecks(shape, checks);
  }
  // Batch norm: one position per channel (variance 0, the biased running variance), a fully
  // connected layer (inner 1), positions that end mid-block, and a channel of 2^18 + 5
  // positions (a reduction over many blocks).
  for (const BatchNormShape& shape : {
           BatchNormShape{1, 1, 1},
           BatchNormShape{257, 3, 1},
           BatchNormShape{2, 5, 257},
           BatchNormShape{3, 64, 49},
           BatchNormShape{1, 7, 4097},
           BatchNormShape{2, 3, (int64_t{1} << 18) + 5},
       }) {
    checks.push_back(BatchNormForwardCheck(shape, true));
    checks.push_back(BatchNormForwardCheck(shape, false));
    checks.push_back(BatchNormBackwardCheck(shape, true));
    checks.push_back(BatchNormBackwardCheck(shape, false));
  }
  // Layer norm: one column (variance 0), one row, rows shorter and longer than a warp or block,
  // and many short rows.
  for (const auto& [rows, columns] :
       std::vector<std::pair<int64_t, int>>{{1, 1}, {1, 257}, {257, 3}, {33, 1025}, {4099, 7}, {5, 8193}}) {
    checks.push_back(LayerNormForwardCheck(rows, columns));
    checks.push_back(LayerNormBackwardCheck(rows, columns, true));
    checks.push_back(LayerNormBackwardCheck(rows, columns, false));
  }
  return checks;
}

}  // namespace tessera::op_check
