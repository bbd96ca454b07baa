#include "device/cuda/cuda_device.h"

#include "device/cuda/cuda_kernels.h"

namespace tessera {
namespace {

// Each call's errors are taken off the thread's last-error slot here: one left there would be
// reported by the next kernel launch's check (CheckLaunch) as that launch's failure.
DriverAllocator CudaAllocator(int device_index) {
  return DriverAllocator{[device_index](size_t bytes) -> void* {
                           void* address = nullptr;
                           // A device that cannot be made current gives no memory; the pool
                           // reports the allocation as failed.
                           if (cudaSetDevice(device_index) != cudaSuccess ||
                               cudaMalloc(&address, bytes) != cudaSuccess) {
                             (void)cudaGetLastError();
                             return nullptr;
                           }
                           return address;
                         },
                         [device_index](void* address, size_t) {
                           // cudaFree finds the pointer's device itself (unified addressing); the
                           // current device only matters for its implicit synchronisation.
                           if (cudaSetDevice(device_index) != cudaSuccess) (void)cudaGetLastError();
                           if (cudaFree(address) != cudaSuccess) (void)cudaGetLastError();
                         }};
}

cublasOperation_t Operation(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

Result<std::unique_ptr<Device>> CudaDevice::Create(const CudaDeviceOptions& options) {
  const std::string which = "CUDA device #" + std::to_string(options.device_index);
  auto fail = [&](const char* call, cudaError_t error) {
    (void)cudaGetLastError();
    return UnavailableError(which + ": " + call + " failed: " + cudaGetErrorString(error));
  };
  cudaError_t error = cudaSetDevice(options.device_index);
  if (error != cudaSuccess) return fail("cudaSetDevice", error);
  cudaDeviceProp properties{};
  error = cudaGetDeviceProperties(&properties, options.device_index);
  if (error != cudaSuccess) return fail("cudaGetDeviceProperties", error);
  cudaStream_t stream = nullptr;
  error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (error != cudaSuccess) return fail("cudaStreamCreateWithFlags", error);
  cublasHandle_t blas = nullptr;
  auto blas_failed = [&](const char* call, cublasStatus_t status) {
    if (blas != nullptr) cublasDestroy(blas);
    cudaStreamDestroy(stream);
    return UnavailableError(which + ": " + call + " failed: " + cublasGetStatusString(status));
  };
  cublasStatus_t status = cublasCreate(&blas);
  if (status != CUBLAS_STATUS_SUCCESS) {
    blas = nullptr;
    return blas_failed("cublasCreate", status);
  }
  status = cublasSetStream(blas, stream);
  if (status != CUBLAS_STATUS_SUCCESS) return blas_failed("cublasSetStream", status);
  status = cublasSetMathMode(blas, options.allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
  if (status != CUBLAS_STATUS_SUCCESS) return blas_failed("cublasSetMathMode", status);
  return std::unique_ptr<Device>(new CudaDevice(options.device_index, stream, blas,
                                                CudaDeviceName(properties.name, options.device_index,
                                                               options.allow_tf32),
                                                properties.totalGlobalMem));
}

CudaDevice::CudaDevice(int device_index, cudaStream_t stream, cublasHandle_t blas, std::string name,
                       uint64_t memory_bytes)
    : device_index_(device_index), stream_(stream), blas_(blas), pool_(CudaAllocator(device_index)) {
  capabilities_.kind = "cuda";
  capabilities_.name = std::move(name);
  capabilities_.emulated = false;
  capabilities_.native_ops = AllOps();
  capabilities_.dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt8, DType::kInt32};
  capabilities_.memory_bytes = memory_bytes;
  capabilities_.device_index = device_index;
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(device_index_);
  cudaStreamSynchronize(stream_);
  columns_.Reset();
  filter_parts_.Reset();
  reduce_scratch_.Reset();
  cublasDestroy(blas_);
  cudaStreamDestroy(stream_);
}

bool CudaDevice::MakeCurrent(Op op) {
  const cudaError_t error = cudaSetDevice(device_index_);
  if (error == cudaSuccess) return true;
  (void)cudaGetLastError();
  Keep(InternalError(std::string(OpName(op)) + ": cudaSetDevice(" + std::to_string(device_index_) +
                     ") failed: " + cudaGetErrorString(error)));
  return false;
}

Status CudaDevice::Current(const char* where) {
  const cudaError_t error = cudaSetDevice(device_index_);
  if (error == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();
  return InternalError(capabilities_.name + ": " + where + ": cudaSetDevice(" + std::to_string(device_index_) +
                       ") failed: " + cudaGetErrorString(error));
}

void CudaDevice::Keep(Status failure) {
  if (pending_error_.ok()) pending_error_ = std::move(failure);
}

void CudaDevice::CheckLaunch(Op op) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    Keep(InternalError(std::string(OpName(op)) + ": kernel launch failed: " + cudaGetErrorString(error)));
  }
}

void CudaDevice::CheckBlas(Op op, cublasStatus_t status) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    Keep(InternalError(std::string(OpName(op)) + ": cuBLAS failed: " + cublasGetStatusString(status)));
  }
}

Status CudaDevice::TakeError(const char* where) {
  if (pending_error_.ok()) return Status::Ok();
  Status failure = pending_error_.WithContext(capabilities_.name + ": " + where);
  pending_error_ = Status::Ok();
  return failure;
}

void* CudaDevice::Scratch(Op op, DeviceBuffer& slot, size_t bytes) {
  if (slot.bytes() < bytes) {
    slot.Reset();
    Result<DeviceBuffer> grown = Allocate(MemoryPool::SizeClass(bytes));
    if (!grown.ok()) {
      Keep(grown.status().WithContext(std::string(OpName(op)) + ": scratch of " + std::to_string(bytes) +
                                      " bytes"));
      return nullptr;
    }
    slot = std::move(grown).value();
  }
  return slot.data();
}

Result<DeviceBuffer> CudaDevice::Allocate(size_t bytes) {
  size_t class_bytes = 0;
  Result<void*> address = pool_.Acquire(bytes, &class_bytes);
  if (!address.ok()) {
    return ResourceExhaustedError(capabilities_.name + ": out of device memory: cannot allocate " +
                                  std::to_string(bytes) + " bytes (size class " + std::to_string(class_bytes) +
                                  "); the pool holds " + std::to_string(pool_.stats().bytes_from_driver) +
                                  " bytes");
  }
  return DeviceBuffer(this, &pool_, *address, bytes, class_bytes);
}

Status CudaDevice::CopyHostToDevice(const void* host, DeviceBuffer& destination, size_t destination_offset,
                                    size_t bytes) {
  RETURN_IF_ERROR(CheckBufferRange(destination, destination_offset, bytes, "CopyHostToDevice destination"));
  RETURN_IF_ERROR(Current("CopyHostToDevice"));
  // From pageable memory the call returns once the source is staged, so `host` may be reused.
  const cudaError_t error = cudaMemcpyAsync(static_cast<char*>(destination.data()) + destination_offset, host,
                                            bytes, cudaMemcpyHostToDevice, stream_);
  if (error != cudaSuccess) {
    return InternalError(capabilities_.name + ": CopyHostToDevice of " + std::to_string(bytes) +
                         " bytes failed: " + cudaGetErrorString(error));
  }
  return TakeError("before CopyHostToDevice");
}

Status CudaDevice::CopyDeviceToHost(const DeviceBuffer& source, size_t source_offset, void* host, size_t bytes) {
  RETURN_IF_ERROR(CheckBufferRange(source, source_offset, bytes, "CopyDeviceToHost source"));
  RETURN_IF_ERROR(Current("CopyDeviceToHost"));
  cudaError_t error = cudaMemcpyAsync(host, static_cast<const char*>(source.data()) + source_offset, bytes,
                                      cudaMemcpyDeviceToHost, stream_);
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream_);
  if (error != cudaSuccess) {
    return InternalError(capabilities_.name + ": CopyDeviceToHost of " + std::to_string(bytes) +
                         " bytes failed: " + cudaGetErrorString(error));
  }
  return TakeError("before CopyDeviceToHost");
}

Status CudaDevice::CopyDeviceToDevice(const DeviceBuffer& source, size_t source_offset, DeviceBuffer& destination,
                                      size_t destination_offset, size_t bytes) {
  RETURN_IF_ERROR(CheckBufferRange(source, source_offset, bytes, "CopyDeviceToDevice source"));
  RETURN_IF_ERROR(CheckBufferRange(destination, destination_offset, bytes, "CopyDeviceToDevice destination"));
  RETURN_IF_ERROR(Current("CopyDeviceToDevice"));
  const cudaError_t error =
      cudaMemcpyAsync(static_cast<char*>(destination.data()) + destination_offset,
                      static_cast<const char*>(source.data()) + source_offset, bytes, cudaMemcpyDeviceToDevice, stream_);
  if (error != cudaSuccess) {
    return InternalError(capabilities_.name + ": CopyDeviceToDevice of " + std::to_string(bytes) +
                         " bytes failed: " + cudaGetErrorString(error));
  }
  return TakeError("before CopyDeviceToDevice");
}

Status CudaDevice::Synchronize() {
  RETURN_IF_ERROR(Current("Synchronize"));
  const cudaError_t error = cudaStreamSynchronize(stream_);
  if (error != cudaSuccess) {
    return InternalError(capabilities_.name + ": Synchronize: " + cudaGetErrorString(error));
  }
  return TakeError("Synchronize");
}

// cuBLAS is column-major: a row-major [r x c] matrix is its transpose in column-major, so
// C^T = op(B)^T op(A)^T is computed with the operands swapped and the same transpose flags.
void CudaDevice::Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
                      const float* b, float beta, float* c) {
  if (!MakeCurrent(Op::kGemm) || m <= 0 || n <= 0) return;
  if (k <= 0) {
    // No product to add: C = beta * C. cuBLAS would refuse the leading dimension 0 of an empty operand.
    cuda::Scale(stream_, static_cast<int64_t>(m) * n, beta, c);
    CheckLaunch(Op::kGemm);
    return;
  }
  const int lda = transpose_a ? m : k;
  const int ldb = transpose_b ? k : n;
  CheckBlas(Op::kGemm, cublasSgemm(blas_, Operation(transpose_b), Operation(transpose_a), n, m, k, &alpha, b, ldb,
                                   a, lda, &beta, c, n));
}

// Convolutions: im2col of the whole batch, then one strided-batched GEMM over the samples
// (the filter is shared: stride 0), so inputs and outputs stay NCHW with no transposes.
void CudaDevice::Conv2dForward(const Conv2dShape& shape, const float* x, const float* w, const float* bias,
                               float* y) {
  if (!MakeCurrent(Op::kConv2dForward)) return;
  const int positions = shape.out_height() * shape.out_width();
  const int kernel = shape.in_channels * shape.kernel_height * shape.kernel_width;
  const long long sample_columns = static_cast<long long>(kernel) * positions;
  const long long sample_outputs = static_cast<long long>(shape.out_channels) * positions;
  auto* col = static_cast<float*>(
      Scratch(Op::kConv2dForward, columns_, sizeof(float) * sample_columns * shape.batch));
  if (col == nullptr) return;
  cuda::Im2Col(stream_, shape, x, col);
  CheckLaunch(Op::kConv2dForward);
  const float one = 1.0f, zero = 0.0f;
  // y_n [out_channels x positions] = w [out_channels x kernel] * col_n [kernel x positions]
  CheckBlas(Op::kConv2dForward,
            cublasSgemmStridedBatched(blas_, CUBLAS_OP_N, CUBLAS_OP_N, positions, shape.out_channels, kernel, &one,
                                      col, positions, sample_columns, w, kernel, 0, &zero, y, positions,
                                      sample_outputs, shape.batch));
  if (bias != nullptr) {
    cuda::BiasAdd(stream_, shape.batch, shape.out_channels, positions, bias, y);
    CheckLaunch(Op::kConv2dForward);
  }
}

void CudaDevice::Conv2dBackwardData(const Conv2dShape& shape, const float* dy, const float* w, float* dx) {
  if (!MakeCurrent(Op::kConv2dBackwardData)) return;
  const int positions = shape.out_height() * shape.out_width();
  const int kernel = shape.in_channels * shape.kernel_height * shape.kernel_width;
  const long long sample_columns = static_cast<long long>(kernel) * positions;
  const long long sample_outputs = static_cast<long long>(shape.out_channels) * positions;
  auto* col = static_cast<float*>(
      Scratch(Op::kConv2dBackwardData, columns_, sizeof(float) * sample_columns * shape.batch));
  if (col == nullptr) return;
  const float one = 1.0f, zero = 0.0f;
  // col_n [kernel x positions] = w^T [kernel x out_channels] * dy_n [out_channels x positions]
  CheckBlas(Op::kConv2dBackwardData,
            cublasSgemmStridedBatched(blas_, CUBLAS_OP_N, CUBLAS_OP_T, positions, kernel, shape.out_channels, &one,
                                      dy, positions, sample_outputs, w, kernel, 0, &zero, col, positions,
                                      sample_columns, shape.batch));
  cuda::Col2Im(stream_, shape, col, dx);
  CheckLaunch(Op::kConv2dBackwardData);
}

void CudaDevice::Conv2dBackwardFilter(const Conv2dShape& shape, const float* x, const float* dy, float* dw,
                                      float* dbias) {
  if (!MakeCurrent(Op::kConv2dBackwardFilter)) return;
  const int positions = shape.out_height() * shape.out_width();
  const int kernel = shape.in_channels * shape.kernel_height * shape.kernel_width;
  const long long sample_columns = static_cast<long long>(kernel) * positions;
  const long long sample_outputs = static_cast<long long>(shape.out_channels) * positions;
  const long long weights = static_cast<long long>(shape.out_channels) * kernel;
  auto* col = static_cast<float*>(
      Scratch(Op::kConv2dBackwardFilter, columns_, sizeof(float) * sample_columns * shape.batch));
  if (col == nullptr) return;
  // parts_n [out_channels x kernel] = dy_n [out_channels x positions] * col_n^T [positions x kernel],
  // then dw = the sum of parts_n over the batch.
  float* parts = dw;
  if (shape.batch > 1) {
    parts = static_cast<float*>(
        Scratch(Op::kConv2dBackwardFilter, filter_parts_, sizeof(float) * weights * shape.batch));
    if (parts == nullptr) return;
  }
  cuda::Im2Col(stream_, shape, x, col);
  CheckLaunch(Op::kConv2dBackwardFilter);
  const float one = 1.0f, zero = 0.0f;
  CheckBlas(Op::kConv2dBackwardFilter,
            cublasSgemmStridedBatched(blas_, CUBLAS_OP_T, CUBLAS_OP_N, kernel, shape.out_channels, positions, &one,
                                      col, positions, sample_columns, dy, positions, sample_outputs, &zero, parts,
                                      kernel, weights, shape.batch));
  if (shape.batch > 1) cuda::SumOverBatches(stream_, shape.batch, weights, parts, dw);
  if (dbias != nullptr) cuda::BiasGrad(stream_, shape.batch, shape.out_channels, positions, dy, dbias);
  CheckLaunch(Op::kConv2dBackwardFilter);
}

void CudaDevice::BiasAdd(int64_t outer, int channels, int64_t inner, const float* bias, float* x) {
  if (!MakeCurrent(Op::kBiasAdd)) return;
  cuda::BiasAdd(stream_, outer, channels, inner, bias, x);
  CheckLaunch(Op::kBiasAdd);
}

void CudaDevice::BiasGrad(int64_t outer, int channels, int64_t inner, const float* dy, float* dbias) {
  if (!MakeCurrent(Op::kBiasGrad)) return;
  cuda::BiasGrad(stream_, outer, channels, inner, dy, dbias);
  CheckLaunch(Op::kBiasGrad);
}

void CudaDevice::Relu(int64_t count, const float* x, float* y) {
  if (!MakeCurrent(Op::kRelu)) return;
  cuda::Relu(stream_, count, x, y);
  CheckLaunch(Op::kRelu);
}

void CudaDevice::ReluBackward(int64_t count, const float* y, const float* dy, float* dx) {
  if (!MakeCurrent(Op::kReluBackward)) return;
  cuda::ReluBackward(stream_, count, y, dy, dx);
  CheckLaunch(Op::kReluBackward);
}

void CudaDevice::MaxPool(const MaxPoolShape& shape, const float* x, float* y, int32_t* argmax) {
  if (!MakeCurrent(Op::kMaxPool)) return;
  cuda::MaxPool(stream_, shape, x, y, argmax);
  CheckLaunch(Op::kMaxPool);
}

void CudaDevice::MaxPoolBackward(const MaxPoolShape& shape, const float* dy, const int32_t* argmax, float* dx) {
  if (!MakeCurrent(Op::kMaxPoolBackward)) return;
  cuda::MaxPoolBackward(stream_, shape, dy, argmax, dx);
  CheckLaunch(Op::kMaxPoolBackward);
}

void CudaDevice::SoftmaxCrossEntropy(int batch, int classes, const float* logits, const int32_t* labels,
                                     float* loss, float* dlogits) {
  if (!MakeCurrent(Op::kSoftmaxCrossEntropy)) return;
  auto* row_losses =
      static_cast<double*>(Scratch(Op::kSoftmaxCrossEntropy, reduce_scratch_, sizeof(double) * batch));
  if (row_losses == nullptr) return;
  cuda::SoftmaxCrossEntropy(stream_, batch, classes, logits, labels, row_losses, loss, dlogits);
  CheckLaunch(Op::kSoftmaxCrossEntropy);
}

void CudaDevice::SgdMomentumUpdate(int64_t count, float learning_rate, float momentum, float weight_decay,
                                   const float* gradients, float* velocity, float* weights) {
  if (!MakeCurrent(Op::kSgdMomentumUpdate)) return;
  cuda::SgdMomentumUpdate(stream_, count, learning_rate, momentum, weight_decay, gradients, velocity, weights);
  CheckLaunch(Op::kSgdMomentumUpdate);
}

void CudaDevice::AddScaledDifference(int64_t count, float alpha, const float* a, const float* b, float* y) {
  if (!MakeCurrent(Op::kAddScaledDifference)) return;
  cuda::AddScaledDifference(stream_, count, alpha, a, b, y);
  CheckLaunch(Op::kAddScaledDifference);
}

void CudaDevice::ReduceSum(int64_t count, const float* x, float* sum) {
  if (!MakeCurrent(Op::kReduceSum)) return;
  auto* partials = static_cast<double*>(
      Scratch(Op::kReduceSum, reduce_scratch_, sizeof(double) * cuda::ReduceSumPartials()));
  if (partials == nullptr) return;
  cuda::ReduceSum(stream_, count, x, partials, sum);
  CheckLaunch(Op::kReduceSum);
}

void CudaDevice::Cast(int64_t count, DType from, const void* x, DType to, void* y) {
  if (!MakeCurrent(Op::kCast)) return;
  cuda::Cast(stream_, count, from, x, to, y);
  CheckLaunch(Op::kCast);
}

void CudaDevice::Fill(int64_t count, float value, float* x) {
  if (!MakeCurrent(Op::kFill)) return;
  cuda::Fill(stream_, count, value, x);
  CheckLaunch(Op::kFill);
}

void CudaDevice::Activation(ActivationFunction function, int64_t count, const float* x, float* y) {
  if (!MakeCurrent(Op::kActivation)) return;
  cuda::Activation(stream_, function, count, x, y);
  CheckLaunch(Op::kActivation);
}

void CudaDevice::ActivationBackward(ActivationFunction function, int64_t count, const float* x, const float* y,
                                    const float* dy, float* dx) {
  if (!MakeCurrent(Op::kActivationBackward)) return;
  cuda::ActivationBackward(stream_, function, count, x, y, dy, dx);
  CheckLaunch(Op::kActivationBackward);
}

void CudaDevice::AvgPool(const MaxPoolShape& shape, const float* x, float* y) {
  if (!MakeCurrent(Op::kAvgPool)) return;
  cuda::AvgPool(stream_, shape, x, y);
  CheckLaunch(Op::kAvgPool);
}

void CudaDevice::AvgPoolBackward(const MaxPoolShape& shape, const float* dy, float* dx) {
  if (!MakeCurrent(Op::kAvgPoolBackward)) return;
  cuda::AvgPoolBackward(stream_, shape, dy, dx);
  CheckLaunch(Op::kAvgPoolBackward);
}

void CudaDevice::BatchNormForward(const BatchNormShape& shape, bool training, float momentum, float epsilon,
                                  const float* x, const float* gamma, const float* beta, float* running_mean,
                                  float* running_var, float* saved_mean, float* saved_invstd, float* y) {
  if (!MakeCurrent(Op::kBatchNormForward)) return;
  cuda::BatchNormForward(stream_, shape, training, momentum, epsilon, x, gamma, beta, running_mean, running_var,
                         saved_mean, saved_invstd, y);
  CheckLaunch(Op::kBatchNormForward);
}

void CudaDevice::BatchNormBackward(const BatchNormShape& shape, const float* x, const float* dy, const float* gamma,
                                   const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma,
                                   float* dbeta) {
  if (!MakeCurrent(Op::kBatchNormBackward)) return;
  cuda::BatchNormBackward(stream_, shape, x, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
  CheckLaunch(Op::kBatchNormBackward);
}

void CudaDevice::LayerNormForward(int64_t rows, int columns, float epsilon, const float* x, const float* gamma,
                                  const float* beta, float* saved_mean, float* saved_invstd, float* y) {
  if (!MakeCurrent(Op::kLayerNormForward)) return;
  cuda::LayerNormForward(stream_, rows, columns, epsilon, x, gamma, beta, saved_mean, saved_invstd, y);
  CheckLaunch(Op::kLayerNormForward);
}

void CudaDevice::LayerNormBackward(int64_t rows, int columns, const float* x, const float* dy, const float* gamma,
                                   const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma,
                                   float* dbeta) {
  if (!MakeCurrent(Op::kLayerNormBackward)) return;
  cuda::LayerNormBackward(stream_, rows, columns, x, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta);
  CheckLaunch(Op::kLayerNormBackward);
}

void CudaDevice::Dropout(int64_t count, float probability, uint64_t seed, const float* x, float* y, float* mask) {
  if (!MakeCurrent(Op::kDropout)) return;
  cuda::Dropout(stream_, count, probability, seed, x, y, mask);
  CheckLaunch(Op::kDropout);
}

void CudaDevice::DropoutBackward(int64_t count, const float* mask, const float* dy, float* dx) {
  if (!MakeCurrent(Op::kDropoutBackward)) return;
  cuda::DropoutBackward(stream_, count, mask, dy, dx);
  CheckLaunch(Op::kDropoutBackward);
}

void CudaDevice::Axpby(int64_t count, float alpha, const float* x, float beta, float* y) {
  if (!MakeCurrent(Op::kAxpby)) return;
  cuda::Axpby(stream_, count, alpha, x, beta, y);
  CheckLaunch(Op::kAxpby);
}

}  // namespace tessera
