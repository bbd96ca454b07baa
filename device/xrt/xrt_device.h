// The XRT device (see factory.h). Internal to device/xrt/.
#pragma once

#include <xrt/experimental/xrt_bo.h>
#include <xrt/experimental/xrt_device.h>
#include <xrt/experimental/xrt_kernel.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "device/device.h"
#include "device/memory_pool.h"
#include "device/placement.h"
#include "device/xrt/factory.h"

namespace tessera {

class XrtDevice final : public Device {
 public:
  // `emulated`: XRT runs on an emulation shim, not a card (capabilities().emulated).
  XrtDevice(xrt::device device, xrt::uuid xclbin, xrt::kernel kernel, std::string description,
            bool emulated, std::unique_ptr<Device> host);
  ~XrtDevice() override;

  const DeviceCapabilities& capabilities() const override { return capabilities_; }
  OpPlacement* placement() override { return &placement_; }
  uint64_t kernel_runs() const { return kernel_runs_; }
  std::optional<XrtGemmLaunch> last_gemm_launch() const { return last_gemm_launch_; }

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
  void ActivationBackward(ActivationFunction function, int64_t count, const float* x, const float* y, const float* dy,
                          float* dx) override;
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
  // The buffer object holding `address` and the address's byte offset in it.
  std::pair<xrt::bo*, size_t> Locate(const void* address);
  // Reads the arguments of a finished GEMM run back from its command packet.
  XrtGemmLaunch ReadBackLaunch(const xrt::run& run, const xrt::bo& a, const xrt::bo& b, const xrt::bo& c) const;
  template <typename Compute>
  void Fallback(Op op, const OpCost& cost, Compute&& compute);

  xrt::device device_;
  xrt::uuid xclbin_;
  xrt::kernel kernel_;
  std::unique_ptr<Device> host_;
  std::mutex buffers_mutex_;                  // the pool's driver runs on any thread
  std::map<const char*, xrt::bo> buffers_;    // by mapped base address
  MemoryPool pool_;
  DeviceCapabilities capabilities_;
  OpPlacement placement_;
  uint64_t kernel_runs_ = 0;
  std::optional<XrtGemmLaunch> last_gemm_launch_;
  Status deferred_fault_;
};

}  // namespace tessera
