// The CUDA backend (see factory.h for what it does). Internal to device/cuda/; create it
// through factory.h. Compiled only when TESSERA_HAVE_CUDA, into the module libtessera_cuda.so
// (module.h).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "device/cuda/factory.h"
#include "device/device.h"
#include "device/memory_pool.h"

namespace tessera {

class CudaDevice final : public Device {
 public:
  // Opens device options.device_index, its stream and cuBLAS handle.
  static Result<std::unique_ptr<Device>> Create(const CudaDeviceOptions& options);
  ~CudaDevice() override;

  const DeviceCapabilities& capabilities() const override { return capabilities_; }

  Result<DeviceBuffer> Allocate(size_t bytes) override;
  MemoryPoolStats pool_stats() const override { return pool_.stats(); }
  void ReleaseCachedMemory() override { pool_.Trim(); }
  Status CopyHostToDevice(const void* host, DeviceBuffer& destination, size_t destination_offset,
                          size_t bytes) override;
  Status CopyDeviceToHost(const DeviceBuffer& source, size_t source_offset, void* host, size_t bytes) override;
  Status CopyDeviceToDevice(const DeviceBuffer& source, size_t source_offset, DeviceBuffer& destination,
                            size_t destination_offset, size_t bytes) override;
  Status Synchronize() override;

  void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a, const float* b,
            float beta, float* c) override;
  void Conv2dForward(const Conv2dShape& shape, const float* x, const float* w, const float* bias,
                     float* y) override;
  void Conv2dBackwardData(const Conv2dShape& shape, const float* dy, const float* w, float* dx) override;
  void Conv2dBackwardFilter(const Conv2dShape& shape, const float* x, const float* dy, float* dw,
                            float* dbias) override;
  void BiasAdd(int64_t outer, int channels, int64_t inner, const float* bias, float* x) override;
  void BiasGrad(int64_t outer, int channels, int64_t inner, const float* dy, float* dbias) override;
  void Relu(int64_t count, const float* x, float* y) override;
  void ReluBackward(int64_t count, const float* y, const float* dy, float* dx) override;
  void MaxPool(const MaxPoolShape& shape, const float* x, float* y, int32_t* argmax) override;
  void MaxPoolBackward(const MaxPoolShape& shape, const float* dy, const int32_t* argmax, float* dx) override;
  void SoftmaxCrossEntropy(int batch, int classes, const float* logits, const int32_t* labels, float* loss,
                           float* dlogits) override;
  void SgdMomentumUpdate(int64_t count, float learning_rate, float momentum, float weight_decay,
                         const float* gradients, float* velocity, float* weights) override;
  void AddScaledDifference(int64_t count, float alpha, const float* a, const float* b, float* y) override;
  void ReduceSum(int64_t count, const float* x, float* sum) override;
  void Cast(int64_t count, DType from, const void* x, DType to, void* y) override;
  void Fill(int64_t count, float value, float* x) override;
  void Activation(ActivationFunction function, int64_t count, const float* x, float* y) override;
  void ActivationBackward(ActivationFunction function, int64_t count, const float* x, const float* y,
                          const float* dy, float* dx) override;
  void AvgPool(const MaxPoolShape& shape, const float* x, float* y) override;
  void AvgPoolBackward(const MaxPoolShape& shape, const float* dy, float* dx) override;
  void BatchNormForward(const BatchNormShape& shape, bool training, float momentum, float epsilon, const float* x,
                        const float* gamma, const float* beta, float* running_mean, float* running_var,
                        float* saved_mean, float* saved_invstd, float* y) override;
  void BatchNormBackward(const BatchNormShape& shape, const float* x, const float* dy, const float* gamma,
                         const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma,
                         float* dbeta) override;
  void LayerNormForward(int64_t rows, int columns, float epsilon, const float* x, const float* gamma,
                        const float* beta, float* saved_mean, float* saved_invstd, float* y) override;
  void LayerNormBackward(int64_t rows, int columns, const float* x, const float* dy, const float* gamma,
                         const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma,
                         float* dbeta) override;
  void Dropout(int64_t count, float probability, uint64_t seed, const float* x, float* y, float* mask) override;
  void DropoutBackward(int64_t count, const float* mask, const float* dy, float* dx) override;
  void Axpby(int64_t count, float alpha, const float* x, float beta, float* y) override;

 private:
  CudaDevice(int device_index, cudaStream_t stream, cublasHandle_t blas, std::string name, uint64_t memory_bytes);

  // Makes this device current on the calling thread: the stream, the cuBLAS handle and the
  // pool's memory belong to it, and a Device may be used from any thread (one at a time).
  // False (with the failure kept) when the runtime refuses.
  bool MakeCurrent(Op op);
  // The same for copies and Synchronize, which report at once.
  Status Current(const char* where);
  // Keeps the first failure (launch error, cuBLAS status, scratch exhaustion) of `op` for the
  // next copy or Synchronize.
  void CheckLaunch(Op op);
  void CheckBlas(Op op, cublasStatus_t status);
  void Keep(Status failure);
  // A pooled scratch block of at least `bytes`, kept and grown as needed; nullptr (with a
  // ResourceExhausted failure kept for `op`) when the device has no memory left.
  void* Scratch(Op op, DeviceBuffer& slot, size_t bytes);
  // The kept failure, if any, prefixed with the device and `where`; clears it.
  Status TakeError(const char* where);

  int device_index_;
  cudaStream_t stream_;
  cublasHandle_t blas_;
  MemoryPool pool_;
  DeviceCapabilities capabilities_;
  Status pending_error_;        // the first failure since the last report
  DeviceBuffer columns_;        // im2col matrices, [batch][kernel][positions]
  DeviceBuffer filter_parts_;   // per-sample filter gradients before the sum over the batch
  DeviceBuffer reduce_scratch_; // doubles: per-row losses, per-block partial sums
};

}  // namespace tessera
