#include "device/emulated/emulated_device.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "device/float16.h"
#include "device/op_cost.h"

namespace tessera {
namespace {

constexpr size_t kAlignment = 64;
constexpr uint64_t kFloat = sizeof(float);
// Pacing sleeps in slices of this length, asking the pacing stop between them; and never
// aims further than kMaxPacedMs past the clock's origin (about 35 years), so that the target
// stays within the steady clock's range whatever the modelled time.
constexpr auto kPacingSlice = std::chrono::milliseconds(20);
constexpr double kMaxPacedMs = double(int64_t{1} << 40);

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

float RoundToHalf(float value) {
  return HalfToFloat(FloatToHalf(value));
}

float RoundToBFloat16(float value) {
  if (std::isnan(value)) return value;
  uint32_t bits = std::bit_cast<uint32_t>(value);
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest even on the upper 16 bits
  return std::bit_cast<float>(bits & 0xFFFF0000u);
}

// Rounding every native op's output is the emulation's hot loop, so it runs eight lanes at a
// time where the CPU allows (F16C for float16, AVX2 for bfloat16 and int8); the scalar loops
// are the reference and handle the tails. Both give bit-identical results.
#if defined(__x86_64__)
#define TESSERA_X86_SIMD 1

bool HasF16c() {
  // F16C is CPUID leaf 1, ECX bit 29, read directly: clang before 15 has no "f16c" for
  // __builtin_cpu_supports. "avx" there also checks that the OS saves the AVX registers.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0 && __builtin_cpu_supports("avx");
  }();
  return has;
}
bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

__attribute__((target("avx,f16c"))) int64_t RoundToHalfWide(float* values, int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 x = _mm256_loadu_ps(values + i);
    const __m128i half = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(values + i, _mm256_cvtph_ps(half));
  }
  return i;
}

__attribute__((target("avx2"))) int64_t RoundToBFloat16Wide(float* values, int64_t count) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i infinity = _mm256_set1_epi32(0x7F800000);
  const __m256i bias = _mm256_set1_epi32(0x7FFF);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i upper = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(values + i));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
    const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(bits, _mm256_add_epi32(bias, odd)), upper);
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), infinity);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(values + i), _mm256_blendv_epi8(rounded, bits, is_nan));
  }
  return i;
}

__attribute__((target("avx2"))) float LargestMagnitudeWide(const float* values, int64_t count, int64_t* done) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 largest = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    // max(x, largest) returns `largest` when x is NaN: NaNs are skipped, as in the scalar loop.
    largest = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(values + i), abs_mask), largest);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, largest);
  *done = i;
  return *std::max_element(lanes, lanes + 8);
}

__attribute__((target("avx2"))) int64_t QuantiseWide(float* values, int64_t count, float scale) {
  const __m256 step = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 steps = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(values + i), step),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(values + i, _mm256_mul_ps(steps, step));
  }
  return i;
}
#else
#define TESSERA_X86_SIMD 0
#endif

// Rounds in place to `precision`; int8 is per-tensor symmetric quantisation (scale max|x|/127).
void RoundTo(DType precision, float* values, int64_t count) {
  int64_t done = 0;
  switch (precision) {
    case DType::kFloat16:
#if TESSERA_X86_SIMD
      if (HasF16c()) done = RoundToHalfWide(values, count);
#endif
      for (int64_t i = done; i < count; ++i) values[i] = RoundToHalf(values[i]);
      break;
    case DType::kBFloat16:
#if TESSERA_X86_SIMD
      if (HasAvx2()) done = RoundToBFloat16Wide(values, count);
#endif
      for (int64_t i = done; i < count; ++i) values[i] = RoundToBFloat16(values[i]);
      break;
    case DType::kInt8: {
      float largest = 0;
#if TESSERA_X86_SIMD
      if (HasAvx2()) largest = LargestMagnitudeWide(values, count, &done);
#endif
      for (int64_t i = done; i < count; ++i) largest = std::max(largest, std::fabs(values[i]));
      if (largest == 0 || !std::isfinite(largest)) break;
      const float scale = largest / 127.0f;
      done = 0;
#if TESSERA_X86_SIMD
      if (HasAvx2()) done = QuantiseWide(values, count, scale);
#endif
      for (int64_t i = done; i < count; ++i) values[i] = std::nearbyint(values[i] / scale) * scale;
      break;
    }
    case DType::kFloat32:
    case DType::kInt32: break;
  }
}

}  // namespace

EmulatedDevice::EmulatedDevice(DeviceProfile profile, const EmulatedDeviceOptions& options, std::string kind,
                               std::unique_ptr<Device> host)
    : profile_(std::move(profile)),
      options_(options),
      host_(std::move(host)),
      pool_(DriverAllocator{
          [this](size_t bytes) -> void* {
            if (driver_bytes_ + bytes > profile_.memory_bytes) return nullptr;
            void* address = std::aligned_alloc(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
            if (address != nullptr) driver_bytes_ += bytes;
            return address;
          },
          [this](void* address, size_t bytes) {
            driver_bytes_ -= bytes;
            std::free(address);
          }}),
      placement_(profile_.native_ops),
      clock_origin_(std::chrono::steady_clock::now()) {
  capabilities_.kind = std::move(kind);
  capabilities_.name = capabilities_.kind + " (emulated)";
  capabilities_.emulated = true;
  capabilities_.native_ops = profile_.native_ops;
  capabilities_.dtypes = profile_.dtypes;
  capabilities_.memory_bytes = profile_.memory_bytes;
  capabilities_.compute_precision = options_.round_to_precision ? profile_.precision : DType::kFloat32;
}

EmulatedDevice::~EmulatedDevice() = default;

void EmulatedDevice::ResetClock() {
  clock_origin_ = std::chrono::steady_clock::now();
  modelled_ms_ = 0;
  placement_.Reset();
}

Result<DeviceBuffer> EmulatedDevice::Allocate(size_t bytes) {
  size_t class_bytes = 0;
  Result<void*> address = pool_.Acquire(bytes, &class_bytes);
  if (!address.ok()) {
    // A request past the largest size class has no class: the pool's message says so.
    const std::string size_class = class_bytes == 0 ? address.status().message()
                                                    : "size class " + std::to_string(class_bytes);
    return ResourceExhaustedError(capabilities_.name + ": out of device memory: cannot allocate " +
                                  std::to_string(bytes) + " bytes (" + size_class + "); " +
                                  std::to_string(driver_bytes_.load()) + " of " +
                                  std::to_string(profile_.memory_bytes) + " bytes are held");
  }
  return DeviceBuffer(this, &pool_, *address, bytes, class_bytes);
}

Status EmulatedDevice::CopyHostToDevice(const void* host, DeviceBuffer& destination, size_t destination_offset,
                                        size_t bytes) {
  RETURN_IF_ERROR(CheckBufferRange(destination, destination_offset, bytes, "CopyHostToDevice destination"));
  std::memcpy(static_cast<char*>(destination.data()) + destination_offset, host, bytes);
  AddModelledTime(LinkMs(bytes));
  return Status::Ok();
}

Status EmulatedDevice::CopyDeviceToHost(const DeviceBuffer& source, size_t source_offset, void* host,
                                        size_t bytes) {
  RETURN_IF_ERROR(CheckBufferRange(source, source_offset, bytes, "CopyDeviceToHost source"));
  std::memcpy(host, static_cast<const char*>(source.data()) + source_offset, bytes);
  AddModelledTime(LinkMs(bytes));
  return Status::Ok();
}

Status EmulatedDevice::CopyDeviceToDevice(const DeviceBuffer& source, size_t source_offset,
                                          DeviceBuffer& destination, size_t destination_offset, size_t bytes) {
  RETURN_IF_ERROR(CheckBufferRange(source, source_offset, bytes, "CopyDeviceToDevice source"));
  RETURN_IF_ERROR(CheckBufferRange(destination, destination_offset, bytes, "CopyDeviceToDevice destination"));
  std::memmove(static_cast<char*>(destination.data()) + destination_offset,
               static_cast<const char*>(source.data()) + source_offset, bytes);
  AddModelledTime(2.0 * bytes / (profile_.memory_bandwidth_gbps * 1e9) * 1e3);
  return Status::Ok();
}

double EmulatedDevice::NativeMs(const OpCost& cost) const {
  const double peak = profile_.PeakFlops(capabilities_.compute_precision);
  const double element_scale = static_cast<double>(DTypeSize(capabilities_.compute_precision)) / kFloat;
  const double bytes = static_cast<double>(cost.bytes_read + cost.bytes_written) * element_scale;
  const double compute_s = peak > 0 ? cost.flops / peak : 0;
  const double memory_s = bytes / (profile_.memory_bandwidth_gbps * 1e9);
  return std::max(compute_s, memory_s) * 1e3;
}

double EmulatedDevice::LinkMs(uint64_t bytes) const {
  return static_cast<double>(bytes) / (profile_.host_link_gbps * 1e9) * 1e3;
}

void EmulatedDevice::AddModelledTime(double milliseconds) {
  modelled_ms_ += milliseconds;
  if (!options_.pace_real_time) return;
  const auto target = clock_origin_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                          std::chrono::duration<double, std::milli>(
                                              std::min(modelled_ms_, kMaxPacedMs)));
  for (auto now = std::chrono::steady_clock::now(); now < target; now = std::chrono::steady_clock::now()) {
    if (pacing_stop_ && pacing_stop_()) return;
    std::this_thread::sleep_until(std::min(target, now + kPacingSlice));
  }
}

template <typename Compute>
void EmulatedDevice::Run(Op op, const OpCost& cost, Outputs rounded, Compute&& compute) {
  const auto start = std::chrono::steady_clock::now();
  compute();
  const bool native = placement_.Place(op) == Placement::kNative;
  if (native && capabilities_.compute_precision != DType::kFloat32) {
    for (const auto& [values, count] : rounded) {
      if (values != nullptr) RoundTo(capabilities_.compute_precision, values, count);
    }
  }
  const double measured_ms = MillisecondsSince(start);
  double modelled_ms = 0;
  if (native) {
    modelled_ms = NativeMs(cost);
    placement_.RecordNative(op, cost, measured_ms, modelled_ms);
  } else {
    modelled_ms = LinkMs(cost.bytes_read) + measured_ms + LinkMs(cost.bytes_written);
    placement_.RecordFallback(op, cost, measured_ms, modelled_ms);
  }
  AddModelledTime(modelled_ms);
}

void EmulatedDevice::Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
                          const float* b, float beta, float* c) {
  Run(Op::kGemm, GemmCost(m, n, k, beta != 0), {{c, int64_t(m) * n}},
      [&] { host_->Gemm(transpose_a, transpose_b, m, n, k, alpha, a, b, beta, c); });
}

void EmulatedDevice::Conv2dForward(const Conv2dShape& shape, const float* x, const float* w, const float* bias,
                                   float* y) {
  Run(Op::kConv2dForward, Conv2dForwardCost(shape, bias != nullptr), {{y, int64_t(ConvOutputCount(shape))}}, [&] { host_->Conv2dForward(shape, x, w, bias, y); });
}

void EmulatedDevice::Conv2dBackwardData(const Conv2dShape& shape, const float* dy, const float* w, float* dx) {
  Run(Op::kConv2dBackwardData, Conv2dBackwardDataCost(shape), {{dx, int64_t(ConvInputCount(shape))}},
      [&] { host_->Conv2dBackwardData(shape, dy, w, dx); });
}

void EmulatedDevice::Conv2dBackwardFilter(const Conv2dShape& shape, const float* x, const float* dy, float* dw,
                                          float* dbias) {
  const int64_t bias_count = dbias ? shape.out_channels : 0;
  Run(Op::kConv2dBackwardFilter, Conv2dBackwardFilterCost(shape, dbias != nullptr),
      {{dw, int64_t(ConvWeightCount(shape))}, {dbias, bias_count}},
      [&] { host_->Conv2dBackwardFilter(shape, x, dy, dw, dbias); });
}

void EmulatedDevice::BiasAdd(int64_t outer, int channels, int64_t inner, const float* bias, float* x) {
  Run(Op::kBiasAdd, BiasAddCost(outer, channels, inner), {{x, outer * channels * inner}}, [&] { host_->BiasAdd(outer, channels, inner, bias, x); });
}

void EmulatedDevice::BiasGrad(int64_t outer, int channels, int64_t inner, const float* dy, float* dbias) {
  Run(Op::kBiasGrad, BiasGradCost(outer, channels, inner), {{dbias, channels}}, [&] { host_->BiasGrad(outer, channels, inner, dy, dbias); });
}

void EmulatedDevice::Relu(int64_t count, const float* x, float* y) {
  Run(Op::kRelu, ReluCost(count), {{y, count}}, [&] { host_->Relu(count, x, y); });
}

void EmulatedDevice::ReluBackward(int64_t count, const float* y, const float* dy, float* dx) {
  Run(Op::kReluBackward, ReluBackwardCost(count), {{dx, count}}, [&] { host_->ReluBackward(count, y, dy, dx); });
}

void EmulatedDevice::MaxPool(const MaxPoolShape& shape, const float* x, float* y, int32_t* argmax) {
  Run(Op::kMaxPool, MaxPoolCost(shape), {{y, int64_t(PoolOutputCount(shape))}}, [&] { host_->MaxPool(shape, x, y, argmax); });
}

void EmulatedDevice::MaxPoolBackward(const MaxPoolShape& shape, const float* dy, const int32_t* argmax, float* dx) {
  Run(Op::kMaxPoolBackward, MaxPoolBackwardCost(shape), {{dx, int64_t(PoolInputCount(shape))}},
      [&] { host_->MaxPoolBackward(shape, dy, argmax, dx); });
}

void EmulatedDevice::SoftmaxCrossEntropy(int batch, int classes, const float* logits, const int32_t* labels,
                                         float* loss, float* dlogits) {
  Run(Op::kSoftmaxCrossEntropy, SoftmaxCrossEntropyCost(batch, classes, dlogits != nullptr),
      {{loss, 1}, {dlogits, dlogits ? int64_t(batch) * classes : 0}},
      [&] { host_->SoftmaxCrossEntropy(batch, classes, logits, labels, loss, dlogits); });
}

void EmulatedDevice::SgdMomentumUpdate(int64_t count, float learning_rate, float momentum, float weight_decay,
                                       const float* gradients, float* velocity, float* weights) {
  Run(Op::kSgdMomentumUpdate, SgdMomentumUpdateCost(count), {}, [&] {
    host_->SgdMomentumUpdate(count, learning_rate, momentum, weight_decay, gradients, velocity, weights);
  });
}

// Part of the optimiser step (fp32 master weights and gradient terms): not rounded.
void EmulatedDevice::AddScaledDifference(int64_t count, float alpha, const float* a, const float* b, float* y) {
  Run(Op::kAddScaledDifference, AddScaledDifferenceCost(count), {},
      [&] { host_->AddScaledDifference(count, alpha, a, b, y); });
}

void EmulatedDevice::ReduceSum(int64_t count, const float* x, float* sum) {
  Run(Op::kReduceSum, ReduceSumCost(count), {{sum, 1}}, [&] { host_->ReduceSum(count, x, sum); });
}

void EmulatedDevice::Cast(int64_t count, DType from, const void* x, DType to, void* y) {
  Run(Op::kCast, CastCost(count, from, to), {}, [&] { host_->Cast(count, from, x, to, y); });
}

void EmulatedDevice::Fill(int64_t count, float value, float* x) {
  Run(Op::kFill, FillCost(count), {}, [&] { host_->Fill(count, value, x); });
}

// The ops of declared layer graphs follow the rule of the ops above: what a layer passes on
// (activations, pooled and normalised outputs, a residual sum) and the gradients (dx, and
// dgamma / dbeta like BiasGrad's dbias) are rounded to the compute precision. Not rounded:
// batch norm's running statistics and the saved mean and 1/std, which mixed-precision
// hardware keeps in float32 (a rounded 1/std would skew every gradient of the backward), and
// dropout's mask, whose exact values every backend shares (device.h).

void EmulatedDevice::Activation(ActivationFunction function, int64_t count, const float* x, float* y) {
  Run(Op::kActivation, ActivationCost(function, count), {{y, count}},
      [&] { host_->Activation(function, count, x, y); });
}

void EmulatedDevice::ActivationBackward(ActivationFunction function, int64_t count, const float* x, const float* y,
                                        const float* dy, float* dx) {
  Run(Op::kActivationBackward, ActivationBackwardCost(function, count), {{dx, count}},
      [&] { host_->ActivationBackward(function, count, x, y, dy, dx); });
}

void EmulatedDevice::AvgPool(const MaxPoolShape& shape, const float* x, float* y) {
  Run(Op::kAvgPool, AvgPoolCost(shape), {{y, int64_t(PoolOutputCount(shape))}},
      [&] { host_->AvgPool(shape, x, y); });
}

void EmulatedDevice::AvgPoolBackward(const MaxPoolShape& shape, const float* dy, float* dx) {
  Run(Op::kAvgPoolBackward, AvgPoolBackwardCost(shape), {{dx, int64_t(PoolInputCount(shape))}},
      [&] { host_->AvgPoolBackward(shape, dy, dx); });
}

void EmulatedDevice::BatchNormForward(const BatchNormShape& shape, bool training, float momentum, float epsilon,
                                      const float* x, const float* gamma, const float* beta, float* running_mean,
                                      float* running_var, float* saved_mean, float* saved_invstd, float* y) {
  Run(Op::kBatchNormForward, BatchNormForwardCost(shape, training), {{y, shape.outer * shape.channels * shape.inner}},
      [&] {
        host_->BatchNormForward(shape, training, momentum, epsilon, x, gamma, beta, running_mean, running_var,
                                saved_mean, saved_invstd, y);
      });
}

void EmulatedDevice::BatchNormBackward(const BatchNormShape& shape, const float* x, const float* dy,
                                       const float* gamma, const float* saved_mean, const float* saved_invstd,
                                       float* dx, float* dgamma, float* dbeta) {
  const int64_t dx_count = dx ? shape.outer * shape.channels * shape.inner : 0;
  Run(Op::kBatchNormBackward, BatchNormBackwardCost(shape, dx != nullptr),
      {{dx, dx_count}, {dgamma, shape.channels}, {dbeta, shape.channels}},
      [&] { host_->BatchNormBackward(shape, x, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta); });
}

void EmulatedDevice::LayerNormForward(int64_t rows, int columns, float epsilon, const float* x, const float* gamma,
                                      const float* beta, float* saved_mean, float* saved_invstd, float* y) {
  Run(Op::kLayerNormForward, LayerNormForwardCost(rows, columns), {{y, rows * columns}},
      [&] { host_->LayerNormForward(rows, columns, epsilon, x, gamma, beta, saved_mean, saved_invstd, y); });
}

void EmulatedDevice::LayerNormBackward(int64_t rows, int columns, const float* x, const float* dy,
                                       const float* gamma, const float* saved_mean, const float* saved_invstd,
                                       float* dx, float* dgamma, float* dbeta) {
  const int64_t dx_count = dx ? rows * columns : 0;
  Run(Op::kLayerNormBackward, LayerNormBackwardCost(rows, columns, dx != nullptr),
      {{dx, dx_count}, {dgamma, columns}, {dbeta, columns}},
      [&] { host_->LayerNormBackward(rows, columns, x, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta); });
}

void EmulatedDevice::Dropout(int64_t count, float probability, uint64_t seed, const float* x, float* y,
                             float* mask) {
  Run(Op::kDropout, DropoutCost(count), {{y, count}}, [&] { host_->Dropout(count, probability, seed, x, y, mask); });
}

void EmulatedDevice::DropoutBackward(int64_t count, const float* mask, const float* dy, float* dx) {
  Run(Op::kDropoutBackward, DropoutBackwardCost(count), {{dx, count}},
      [&] { host_->DropoutBackward(count, mask, dy, dx); });
}

void EmulatedDevice::Axpby(int64_t count, float alpha, const float* x, float beta, float* y) {
  Run(Op::kAxpby, AxpbyCost(count, beta != 0), {{y, count}}, [&] { host_->Axpby(count, alpha, x, beta, y); });
}

}  // namespace tessera
