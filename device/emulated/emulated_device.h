// The emulated device (see factory.h for what it models). Internal to device/emulated/.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "device/device.h"
#include "device/emulated/factory.h"
#include "device/emulated/profile.h"
#include "device/memory_pool.h"
#include "device/placement.h"

namespace tessera {

class EmulatedDevice final : public Device {
 public:
  EmulatedDevice(DeviceProfile profile, const EmulatedDeviceOptions& options, std::string kind,
                 std::unique_ptr<Device> host);
  ~EmulatedDevice() override;

  const DeviceCapabilities& capabilities() const override { return capabilities_; }
  OpPlacement* placement() override { return &placement_; }
  const DeviceProfile& profile() const { return profile_; }
  void ResetClock();
  double modelled_ms() const { return modelled_ms_; }
  bool paces_real_time() const { return options_.pace_real_time; }
  void set_pacing_stop(std::function<bool()> stop) { pacing_stop_ = std::move(stop); }

  Result<DeviceBuffer> Allocate(size_t bytes) override;
  MemoryPoolStats pool_stats() const override { return pool_.stats(); }
  void ReleaseCachedMemory() override { pool_.Trim(); }
  Status CopyHostToDevice(const void* host, DeviceBuffer& destination, size_t destination_offset,
                          size_t bytes) override;
  Status CopyDeviceToHost(const DeviceBuffer& source, size_t source_offset, void* host, size_t bytes) override;
  Status CopyDeviceToDevice(const DeviceBuffer& source, size_t source_offset, DeviceBuffer& destination,
                            size_t destination_offset, size_t bytes) override;
  Status Synchronize() override { return Status::Ok(); }

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
  using Outputs = std::initializer_list<std::pair<float*, int64_t>>;
  // Runs `compute` on the host, rounds `rounded` (float outputs) when the op is native, models
  // its time, records it in the placement account and paces.
  template <typename Compute>
  void Run(Op op, const OpCost& cost, Outputs rounded, Compute&& compute);
  void AddModelledTime(double milliseconds);
  double NativeMs(const OpCost& cost) const;
  double LinkMs(uint64_t bytes) const;

  DeviceProfile profile_;
  EmulatedDeviceOptions options_;
  std::unique_ptr<Device> host_;  // the CPU backend that computes
  std::atomic<uint64_t> driver_bytes_{0};  // held from the host for the pool (capacity check)
  MemoryPool pool_;
  DeviceCapabilities capabilities_;
  OpPlacement placement_;
  std::chrono::steady_clock::time_point clock_origin_;
  double modelled_ms_ = 0;
  std::function<bool()> pacing_stop_;  // true ends the pacing sleep in progress (and skips later ones)
};

}  // namespace tessera
