#include "device/cpu/cpu_device.h"

#include <cblas.h>

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <cstring>

#include "base/huge_pages.h"
#include "device/cpu/cpu_kernels.h"

namespace tessera {
namespace {

constexpr size_t kAlignment = 64;

// A large block (a model's parameters, its optimiser state) is mapped for itself, on a 2 MiB
// boundary, so that all of it but its last partial page can be huge pages (Allocate). The pool
// hands back a block with the size it was taken with, which decides how it is freed.
DriverAllocator HostAllocator() {
  return DriverAllocator{
      [](size_t bytes) -> void* {
        if (bytes >= kHugePageAdviceMinBytes) return MapHugeAligned(bytes);
        return std::aligned_alloc(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
      },
      [](void* address, size_t bytes) {
        if (bytes >= kHugePageAdviceMinBytes) {
          UnmapHugeAligned(address, bytes);
        } else {
          std::free(address);
        }
      }};
}

}  // namespace

CpuDevice::CpuDevice(const CpuDeviceOptions& options) : pool_(HostAllocator()) {
  if (options.num_threads > 0) openblas_set_num_threads(options.num_threads);
  capabilities_.kind = "cpu";
  capabilities_.name = "cpu (OpenBLAS, " + std::to_string(openblas_get_num_threads()) + " threads)";
  capabilities_.emulated = false;
  capabilities_.native_ops = AllOps();
  capabilities_.dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt8, DType::kInt32};
}

CpuDevice::~CpuDevice() {
  columns_.Reset();
}

Result<DeviceBuffer> CpuDevice::Allocate(size_t bytes) {
  ASSIGN_OR_RETURN(DeviceBuffer buffer, AllocateFromPool(bytes));
  // The bytes asked for, not the block's size class: a huge page is resident whole once any
  // of it is touched, so only pages the buffer fills are advised.
  AdviseHugePages(buffer.data(), bytes);
  return buffer;
}

Result<DeviceBuffer> CpuDevice::AllocateFromPool(size_t bytes) {
  size_t class_bytes = 0;
  ASSIGN_OR_RETURN(void* address, pool_.Acquire(bytes, &class_bytes));
  return DeviceBuffer(this, &pool_, address, bytes, class_bytes);
}

Status CpuDevice::CopyHostToDevice(const void* host, DeviceBuffer& destination, size_t destination_offset,
                                   size_t bytes) {
  RETURN_IF_ERROR(CheckBufferRange(destination, destination_offset, bytes, "CopyHostToDevice destination"));
  std::memcpy(static_cast<char*>(destination.data()) + destination_offset, host, bytes);
  return Status::Ok();
}

Status CpuDevice::CopyDeviceToHost(const DeviceBuffer& source, size_t source_offset, void* host, size_t bytes) {
  RETURN_IF_ERROR(CheckBufferRange(source, source_offset, bytes, "CopyDeviceToHost source"));
  std::memcpy(host, static_cast<const char*>(source.data()) + source_offset, bytes);
  return Status::Ok();
}

Status CpuDevice::CopyDeviceToDevice(const DeviceBuffer& source, size_t source_offset, DeviceBuffer& destination,
                                     size_t destination_offset, size_t bytes) {
  RETURN_IF_ERROR(CheckBufferRange(source, source_offset, bytes, "CopyDeviceToDevice source"));
  RETURN_IF_ERROR(CheckBufferRange(destination, destination_offset, bytes, "CopyDeviceToDevice destination"));
  std::memmove(static_cast<char*>(destination.data()) + destination_offset,
               static_cast<const char*>(source.data()) + source_offset, bytes);
  return Status::Ok();
}

float* CpuDevice::Scratch(DeviceBuffer& slot, int64_t floats) {
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (slot.bytes() < bytes) {
    slot.Reset();
    // Not advised: a scratch is taken a size class at a time and may fill only part of it.
    Result<DeviceBuffer> grown = AllocateFromPool(MemoryPool::SizeClass(bytes));
    // Host memory exhaustion inside an op is not recoverable here.
    if (!grown.ok()) std::abort();
    slot = std::move(grown).value();
  }
  return slot.f32();
}

void CpuDevice::Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
                     const float* b, float beta, float* c) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    // No product to add: c = beta * c. OpenBLAS refuses the leading dimension 0 of an empty
    // operand (it prints an error and leaves c alone).
    const int64_t count = static_cast<int64_t>(m) * n;
    if (beta == 0.0f) {
      std::fill(c, c + count, 0.0f);
    } else {
      for (int64_t i = 0; i < count; ++i) c[i] *= beta;
    }
    return;
  }
  const int lda = transpose_a ? m : k;
  const int ldb = transpose_b ? k : n;
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, m,
              n, k, alpha, a, lda, b, ldb, beta, c, n);
}

// Convolutions run one GEMM per sample over that sample's im2col matrix, so inputs and outputs
// stay NCHW with no transposes; the filter gradient accumulates over samples (beta = 1). Each
// sample's matrix is built just before its GEMM and reused for the next, so it stays in cache
// (a whole batch's matrices are tens of megabytes, written and read back through memory).
namespace {

Conv2dShape OneSample(const Conv2dShape& shape) {
  Conv2dShape one = shape;
  one.batch = 1;
  return one;
}

}  // namespace

void CpuDevice::Conv2dForward(const Conv2dShape& shape, const float* x, const float* w, const float* bias,
                              float* y) {
  const int positions = shape.out_height() * shape.out_width();
  const int kernel = shape.in_channels * shape.kernel_height * shape.kernel_width;
  const int64_t sample_inputs = static_cast<int64_t>(shape.in_channels) * shape.in_height * shape.in_width;
  const int64_t sample_outputs = static_cast<int64_t>(shape.out_channels) * positions;
  const Conv2dShape one = OneSample(shape);
  float* col = Scratch(columns_, static_cast<int64_t>(kernel) * positions);
  const float beta = bias != nullptr ? 1.0f : 0.0f;
  for (int n = 0; n < shape.batch; ++n) {
    float* out = y + n * sample_outputs;
    if (bias != nullptr) {
      for (int c = 0; c < shape.out_channels; ++c) std::fill(out + c * positions, out + (c + 1) * positions, bias[c]);
    }
    cpu::Im2Col(one, x + n * sample_inputs, col);
    Gemm(false, false, shape.out_channels, positions, kernel, 1.0f, w, col, beta, out);
  }
}

void CpuDevice::Conv2dBackwardData(const Conv2dShape& shape, const float* dy, const float* w, float* dx) {
  const int positions = shape.out_height() * shape.out_width();
  const int kernel = shape.in_channels * shape.kernel_height * shape.kernel_width;
  const int64_t sample_inputs = static_cast<int64_t>(shape.in_channels) * shape.in_height * shape.in_width;
  const int64_t sample_outputs = static_cast<int64_t>(shape.out_channels) * positions;
  const Conv2dShape one = OneSample(shape);
  float* col = Scratch(columns_, static_cast<int64_t>(kernel) * positions);
  for (int n = 0; n < shape.batch; ++n) {
    Gemm(true, false, kernel, positions, shape.out_channels, 1.0f, w, dy + n * sample_outputs, 0.0f, col);
    cpu::Col2Im(one, col, dx + n * sample_inputs);
  }
}

void CpuDevice::Conv2dBackwardFilter(const Conv2dShape& shape, const float* x, const float* dy, float* dw,
                                     float* dbias) {
  const int positions = shape.out_height() * shape.out_width();
  const int kernel = shape.in_channels * shape.kernel_height * shape.kernel_width;
  const int64_t sample_inputs = static_cast<int64_t>(shape.in_channels) * shape.in_height * shape.in_width;
  const int64_t sample_outputs = static_cast<int64_t>(shape.out_channels) * positions;
  const Conv2dShape one = OneSample(shape);
  float* col = Scratch(columns_, static_cast<int64_t>(kernel) * positions);
  if (shape.batch == 0) std::fill(dw, dw + static_cast<int64_t>(shape.out_channels) * kernel, 0.0f);
  for (int n = 0; n < shape.batch; ++n) {
    cpu::Im2Col(one, x + n * sample_inputs, col);
    Gemm(false, true, shape.out_channels, kernel, positions, 1.0f, dy + n * sample_outputs, col, n == 0 ? 0.0f : 1.0f,
         dw);
  }
  if (dbias != nullptr) cpu::BiasGrad(shape.batch, shape.out_channels, positions, dy, dbias);
}

void CpuDevice::BiasAdd(int64_t outer, int channels, int64_t inner, const float* bias, float* x) {
  cpu::BiasAdd(outer, channels, inner, bias, x);
}

void CpuDevice::BiasGrad(int64_t outer, int channels, int64_t inner, const float* dy, float* dbias) {
  cpu::BiasGrad(outer, channels, inner, dy, dbias);
}

void CpuDevice::Relu(int64_t count, const float* x, float* y) { cpu::Relu(count, x, y); }

void CpuDevice::ReluBackward(int64_t count, const float* y, const float* dy, float* dx) {
  cpu::ReluBackward(count, y, dy, dx);
}

void CpuDevice::MaxPool(const MaxPoolShape& shape, const float* x, float* y, int32_t* argmax) {
  cpu::MaxPool(shape, x, y, argmax);
}

void CpuDevice::MaxPoolBackward(const MaxPoolShape& shape, const float* dy, const int32_t* argmax, float* dx) {
  cpu::MaxPoolBackward(shape, dy, argmax, dx);
}

void CpuDevice::SoftmaxCrossEntropy(int batch, int classes, const float* logits, const int32_t* labels,
                                    float* loss, float* dlogits) {
  *loss = cpu::SoftmaxCrossEntropy(batch, classes, logits, labels, dlogits);
}

void CpuDevice::SgdMomentumUpdate(int64_t count, float learning_rate, float momentum, float weight_decay,
                                  const float* gradients, float* velocity, float* weights) {
  cpu::SgdMomentumUpdate(count, learning_rate, momentum, weight_decay, gradients, velocity, weights);
}

void CpuDevice::AddScaledDifference(int64_t count, float alpha, const float* a, const float* b, float* y) {
  cpu::AddScaledDifference(count, alpha, a, b, y);
}

void CpuDevice::ReduceSum(int64_t count, const float* x, float* sum) {
  *sum = static_cast<float>(cpu::Sum(count, x));
}

void CpuDevice::Cast(int64_t count, DType from, const void* x, DType to, void* y) {
  cpu::Cast(count, from, x, to, y);
}

void CpuDevice::Fill(int64_t count, float value, float* x) {
  for (int64_t i = 0; i < count; ++i) x[i] = value;
}

void CpuDevice::Activation(ActivationFunction function, int64_t count, const float* x, float* y) {
  cpu::Activation(function, count, x, y);
}

void CpuDevice::ActivationBackward(ActivationFunction function, int64_t count, const float* x, const float* y,
                                   const float* dy, float* dx) {
  cpu::ActivationBackward(function, count, x, y, dy, dx);
}

void CpuDevice::AvgPool(const MaxPoolShape& shape, const float* x, float* y) { cpu::AvgPool(shape, x, y); }

void CpuDevice::AvgPoolBackward(const MaxPoolShape& shape, const float* dy, float* dx) {
  cpu::AvgPoolBackward(shape, dy, dx);
}

void CpuDevice::BatchNormForward(const BatchNormShape& shape, bool training, float momentum, float epsilon,
                                 const float* x, const float* gamma, const float* beta, float* running_mean,
                                 float* running_var, float* saved_mean, float* saved_invstd, float* y) {
  cpu::BatchNormForward(shape, training, momentum, epsilon, x, gamma, beta, running_mean, running_var, saved_mean,
                        saved_invstd, y);
}

void CpuDevice::BatchNormBackward(const BatchNormShape& shape, const float* x, const float* dy, const float* gamma,
                                  const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma,
                                  float* dbeta) {
  cpu::BatchNormBackward(shape, x, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
}

void CpuDevice::LayerNormForward(int64_t rows, int columns, float epsilon, const float* x, const float* gamma,
                                 const float* beta, float* saved_mean, float* saved_invstd, float* y) {
  cpu::LayerNormForward(rows, columns, epsilon, x, gamma, beta, saved_mean, saved_invstd, y);
}

void CpuDevice::LayerNormBackward(int64_t rows, int columns, const float* x, const float* dy, const float* gamma,
                                  const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma,
                                  float* dbeta) {
  cpu::LayerNormBackward(rows, columns, x, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
}

void CpuDevice::Dropout(int64_t count, float probability, uint64_t seed, const float* x, float* y, float* mask) {
  cpu::Dropout(count, probability, seed, x, y, mask);
}

void CpuDevice::DropoutBackward(int64_t count, const float* mask, const float* dy, float* dx) {
  cpu::DropoutBackward(count, mask, dy, dx);
}

void CpuDevice::Axpby(int64_t count, float alpha, const float* x, float beta, float* y) {
  cpu::Axpby(count, alpha, x, beta, y);
}

}  // namespace tessera
