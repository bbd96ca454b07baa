#include "device/xrt/xrt_device.h"

#include <xrt/ert.h>

#include <chrono>
#include <cstring>

#include "device/op_cost.h"

namespace tessera {
namespace {

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

XrtDevice::XrtDevice(xrt::device device, xrt::uuid xclbin, xrt::kernel kernel, std::string description,
                     bool emulated, std::unique_ptr<Device> host)
    : device_(std::move(device)),
      xclbin_(std::move(xclbin)),
      kernel_(std::move(kernel)),
      host_(std::move(host)),
      pool_(DriverAllocator{
          [this](size_t bytes) -> void* {
            try {
              xrt::bo bo(device_, bytes, kernel_.group_id(0));
              auto* mapped = bo.map<char*>();
              std::lock_guard<std::mutex> lock(buffers_mutex_);
              buffers_.emplace(mapped, std::move(bo));
              return mapped;
            } catch (const std::exception&) {
              return nullptr;  // the pool reports ResourceExhausted
            }
          },
          [this](void* address, size_t) {
            std::lock_guard<std::mutex> lock(buffers_mutex_);
            buffers_.erase(static_cast<const char*>(address));
          }}),
      placement_({Op::kGemm}) {
  capabilities_.kind = "xrt";
  capabilities_.name = std::move(description);
  capabilities_.emulated = emulated;
  capabilities_.native_ops = {Op::kGemm};
  capabilities_.dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt8, DType::kInt32};
}

XrtDevice::~XrtDevice() = default;

Result<DeviceBuffer> XrtDevice::Allocate(size_t bytes) {
  size_t class_bytes = 0;
  Result<void*> address = pool_.Acquire(bytes, &class_bytes);
  if (!address.ok()) {
    return ResourceExhaustedError(capabilities_.name + ": cannot allocate a buffer object of " +
                                  std::to_string(bytes) + " bytes: " + address.status().message());
  }
  return DeviceBuffer(this, &pool_, *address, bytes, class_bytes);
}

Status XrtDevice::CopyHostToDevice(const void* host, DeviceBuffer& destination, size_t destination_offset,
                                   size_t bytes) {
  RETURN_IF_ERROR(CheckBufferRange(destination, destination_offset, bytes, "CopyHostToDevice destination"));
  std::memcpy(static_cast<char*>(destination.data()) + destination_offset, host, bytes);
  return Status::Ok();
}

Status XrtDevice::CopyDeviceToHost(const DeviceBuffer& source, size_t source_offset, void* host, size_t bytes) {
  RETURN_IF_ERROR(CheckBufferRange(source, source_offset, bytes, "CopyDeviceToHost source"));
  std::memcpy(host, static_cast<const char*>(source.data()) + source_offset, bytes);
  return deferred_fault_;
}

Status XrtDevice::CopyDeviceToDevice(const DeviceBuffer& source, size_t source_offset, DeviceBuffer& destination,
                                     size_t destination_offset, size_t bytes) {
  RETURN_IF_ERROR(CheckBufferRange(source, source_offset, bytes, "CopyDeviceToDevice source"));
  RETURN_IF_ERROR(CheckBufferRange(destination, destination_offset, bytes, "CopyDeviceToDevice destination"));
  std::memmove(static_cast<char*>(destination.data()) + destination_offset,
               static_cast<const char*>(source.data()) + source_offset, bytes);
  return Status::Ok();
}

Status XrtDevice::Synchronize() { return deferred_fault_; }

std::pair<xrt::bo*, size_t> XrtDevice::Locate(const void* address) {
  const char* byte = static_cast<const char*>(address);
  std::lock_guard<std::mutex> lock(buffers_mutex_);
  auto found = buffers_.upper_bound(byte);
  if (found == buffers_.begin()) return {nullptr, 0};
  --found;
  const size_t offset = static_cast<size_t>(byte - found->first);
  if (offset >= found->second.size()) return {nullptr, 0};
  return {&found->second, offset};
}

void XrtDevice::Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
                     const float* b, float beta, float* c) {
  const auto start = std::chrono::steady_clock::now();
  const size_t a_bytes = size_t(m) * k * sizeof(float), b_bytes = size_t(k) * n * sizeof(float),
               c_bytes = size_t(m) * n * sizeof(float);
  auto [a_bo, a_offset] = Locate(a);
  auto [b_bo, b_offset] = Locate(b);
  auto [c_bo, c_offset] = Locate(c);
  if (a_bo == nullptr || b_bo == nullptr || c_bo == nullptr) {
    deferred_fault_ = InvalidArgumentError(capabilities_.name + ": Gemm was given a pointer outside this device's buffers");
    return;
  }
  try {
    a_bo->sync(XCL_BO_SYNC_BO_TO_DEVICE, a_bytes, a_offset);
    b_bo->sync(XCL_BO_SYNC_BO_TO_DEVICE, b_bytes, b_offset);
    if (beta != 0) c_bo->sync(XCL_BO_SYNC_BO_TO_DEVICE, c_bytes, c_offset);
    xrt::bo a_view(*a_bo, a_bytes, a_offset), b_view(*b_bo, b_bytes, b_offset), c_view(*c_bo, c_bytes, c_offset);
    const int flags = (transpose_a ? 1 : 0) | (transpose_b ? 2 : 0);
    xrt::run run = kernel_(a_view, b_view, c_view, m, n, k, flags, alpha, beta);
    const ert_cmd_state state = run.wait();
    ++kernel_runs_;
    last_gemm_launch_ = ReadBackLaunch(run, a_view, b_view, c_view);
    if (state != ERT_CMD_STATE_COMPLETED) {
      deferred_fault_ = InternalError(capabilities_.name + ": the GEMM kernel run ended in state " +
                                      std::to_string(static_cast<int>(state)));
    }
    c_bo->sync(XCL_BO_SYNC_BO_FROM_DEVICE, c_bytes, c_offset);
  } catch (const std::exception& error) {
    deferred_fault_ = InternalError(capabilities_.name + ": GEMM kernel: " + error.what());
  }
  const double measured = MillisecondsSince(start);
  placement_.RecordNative(Op::kGemm, GemmCost(m, n, k, beta != 0), measured, measured);
}

XrtGemmLaunch XrtDevice::ReadBackLaunch(const xrt::run& run, const xrt::bo& a, const xrt::bo& b,
                                        const xrt::bo& c) const {
  // ERT_START_CU: header, the mandatory CU mask, extra_cu_masks more masks, then the register
  // map indexed by byte offset / 4; a buffer argument is a 64-bit address in two words.
  XrtGemmLaunch launch;
  launch.runs = kernel_runs_;
  launch.a = {0, a.address(), a.size()};
  launch.b = {0, b.address(), b.size()};
  launch.c = {0, c.address(), c.size()};
  const auto* command = reinterpret_cast<const ert_start_kernel_cmd*>(run.get_ert_packet());
  if (command == nullptr || command->opcode != ERT_START_CU) return launch;
  const uint32_t* registers = command->data + command->extra_cu_masks;
  auto word = [&](int argument) { return registers[kernel_.offset(argument) / 4]; };
  auto address = [&](int argument) {
    const uint32_t low = word(argument), high = registers[kernel_.offset(argument) / 4 + 1];
    return (uint64_t{high} << 32) | low;
  };
  auto as_float = [](uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    return value;
  };
  launch.a.command_address = address(0);
  launch.b.command_address = address(1);
  launch.c.command_address = address(2);
  launch.m = static_cast<int32_t>(word(3));
  launch.n = static_cast<int32_t>(word(4));
  launch.k = static_cast<int32_t>(word(5));
  launch.transpose_flags = static_cast<int32_t>(word(6));
  launch.alpha = as_float(word(7));
  launch.beta = as_float(word(8));
  return launch;
}

template <typename Compute>
void XrtDevice::Fallback(Op op, const OpCost& cost, Compute&& compute) {
  const auto start = std::chrono::steady_clock::now();
  compute();
  const double measured = MillisecondsSince(start);
  placement_.RecordFallback(op, cost, measured, measured);
}

void XrtDevice::Conv2dForward(const Conv2dShape& shape, const float* x, const float* w, const float* bias,
                              float* y) {
  Fallback(Op::kConv2dForward, Conv2dForwardCost(shape, bias != nullptr),
           [&] { host_->Conv2dForward(shape, x, w, bias, y); });
}
void XrtDevice::Conv2dBackwardData(const Conv2dShape& shape, const float* dy, const float* w, float* dx) {
  Fallback(Op::kConv2dBackwardData, Conv2dBackwardDataCost(shape), [&] { host_->Conv2dBackwardData(shape, dy, w, dx); });
}
void XrtDevice::Conv2dBackwardFilter(const Conv2dShape& shape, const float* x, const float* dy, float* dw,
                                     float* dbias) {
  Fallback(Op::kConv2dBackwardFilter, Conv2dBackwardFilterCost(shape, dbias != nullptr),
           [&] { host_->Conv2dBackwardFilter(shape, x, dy, dw, dbias); });
}
void XrtDevice::BiasAdd(int64_t outer, int channels, int64_t inner, const float* bias, float* x) {
  Fallback(Op::kBiasAdd, BiasAddCost(outer, channels, inner), [&] { host_->BiasAdd(outer, channels, inner, bias, x); });
}
void XrtDevice::BiasGrad(int64_t outer, int channels, int64_t inner, const float* dy, float* dbias) {
  Fallback(Op::kBiasGrad, BiasGradCost(outer, channels, inner), [&] { host_->BiasGrad(outer, channels, inner, dy, dbias); });
}
void XrtDevice::Relu(int64_t count, const float* x, float* y) {
  Fallback(Op::kRelu, ReluCost(count), [&] { host_->Relu(count, x, y); });
}
void XrtDevice::ReluBackward(int64_t count, const float* y, const float* dy, float* dx) {
  Fallback(Op::kReluBackward, ReluBackwardCost(count), [&] { host_->ReluBackward(count, y, dy, dx); });
}
void XrtDevice::MaxPool(const MaxPoolShape& shape, const float* x, float* y, int32_t* argmax) {
  Fallback(Op::kMaxPool, MaxPoolCost(shape), [&] { host_->MaxPool(shape, x, y, argmax); });
}
void XrtDevice::MaxPoolBackward(const MaxPoolShape& shape, const float* dy, const int32_t* argmax, float* dx) {
  Fallback(Op::kMaxPoolBackward, MaxPoolBackwardCost(shape), [&] { host_->MaxPoolBackward(shape, dy, argmax, dx); });
}
void XrtDevice::SoftmaxCrossEntropy(int batch, int classes, const float* logits, const int32_t* labels, float* loss,
                                    float* dlogits) {
  Fallback(Op::kSoftmaxCrossEntropy, SoftmaxCrossEntropyCost(batch, classes, dlogits != nullptr),
           [&] { host_->SoftmaxCrossEntropy(batch, classes, logits, labels, loss, dlogits); });
}
void XrtDevice::SgdMomentumUpdate(int64_t count, float learning_rate, float momentum, float weight_decay,
                                  const float* gradients, float* velocity, float* weights) {
  Fallback(Op::kSgdMomentumUpdate, SgdMomentumUpdateCost(count), [&] {
    host_->SgdMomentumUpdate(count, learning_rate, momentum, weight_decay, gradients, velocity, weights);
  });
}
void XrtDevice::AddScaledDifference(int64_t count, float alpha, const float* a, const float* b, float* y) {
  Fallback(Op::kAddScaledDifference, AddScaledDifferenceCost(count),
           [&] { host_->AddScaledDifference(count, alpha, a, b, y); });
}
void XrtDevice::ReduceSum(int64_t count, const float* x, float* sum) {
  Fallback(Op::kReduceSum, ReduceSumCost(count), [&] { host_->ReduceSum(count, x, sum); });
}
void XrtDevice::Cast(int64_t count, DType from, const void* x, DType to, void* y) {
  Fallback(Op::kCast, CastCost(count, from, to), [&] { host_->Cast(count, from, x, to, y); });
}
void XrtDevice::Fill(int64_t count, float value, float* x) {
  Fallback(Op::kFill, FillCost(count), [&] { host_->Fill(count, value, x); });
}
void XrtDevice::Activation(ActivationFunction function, int64_t count, const float* x, float* y) {
  Fallback(Op::kActivation, ActivationCost(function, count), [&] { host_->Activation(function, count, x, y); });
}
void XrtDevice::ActivationBackward(ActivationFunction function, int64_t count, const float* x, const float* y,
                                   const float* dy, float* dx) {
  Fallback(Op::kActivationBackward, ActivationBackwardCost(function, count),
           [&] { host_->ActivationBackward(function, count, x, y, dy, dx); });
}
void XrtDevice::AvgPool(const MaxPoolShape& shape, const float* x, float* y) {
  Fallback(Op::kAvgPool, AvgPoolCost(shape), [&] { host_->AvgPool(shape, x, y); });
}
void XrtDevice::AvgPoolBackward(const MaxPoolShape& shape, const float* dy, float* dx) {
  Fallback(Op::kAvgPoolBackward, AvgPoolBackwardCost(shape), [&] { host_->AvgPoolBackward(shape, dy, dx); });
}
void XrtDevice::BatchNormForward(const BatchNormShape& shape, bool training, float momentum, float epsilon,
                                 const float* x, const float* gamma, const float* beta, float* running_mean,
                                 float* running_var, float* saved_mean, float* saved_invstd, float* y) {
  Fallback(Op::kBatchNormForward, BatchNormForwardCost(shape, training), [&] {
    host_->BatchNormForward(shape, training, momentum, epsilon, x, gamma, beta, running_mean, running_var, saved_mean,
                            saved_invstd, y);
  });
}
void XrtDevice::BatchNormBackward(const BatchNormShape& shape, const float* x, const float* dy, const float* gamma,
                                  const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma,
                                  float* dbeta) {
  Fallback(Op::kBatchNormBackward, BatchNormBackwardCost(shape, dx != nullptr),
           [&] { host_->BatchNormBackward(shape, x, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta); });
}
void XrtDevice::LayerNormForward(int64_t rows, int columns, float epsilon, const float* x, const float* gamma,
                                 const float* beta, float* saved_mean, float* saved_invstd, float* y) {
  Fallback(Op::kLayerNormForward, LayerNormForwardCost(rows, columns),
           [&] { host_->LayerNormForward(rows, columns, epsilon, x, gamma, beta, saved_mean, saved_invstd, y); });
}
void XrtDevice::LayerNormBackward(int64_t rows, int columns, const float* x, const float* dy, const float* gamma,
                                  const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma,
                                  float* dbeta) {
  Fallback(Op::kLayerNormBackward, LayerNormBackwardCost(rows, columns, dx != nullptr),
           [&] { host_->LayerNormBackward(rows, columns, x, dy, gamma, saved_mean, saved_invstd, dx, dgamma, dbeta); });
}
void XrtDevice::Dropout(int64_t count, float probability, uint64_t seed, const float* x, float* y, float* mask) {
  Fallback(Op::kDropout, DropoutCost(count), [&] { host_->Dropout(count, probability, seed, x, y, mask); });
}
void XrtDevice::DropoutBackward(int64_t count, const float* mask, const float* dy, float* dx) {
  Fallback(Op::kDropoutBackward, DropoutBackwardCost(count), [&] { host_->DropoutBackward(count, mask, dy, dx); });
}
void XrtDevice::Axpby(int64_t count, float alpha, const float* x, float beta, float* y) {
  Fallback(Op::kAxpby, AxpbyCost(count, beta != 0), [&] { host_->Axpby(count, alpha, x, beta, y); });
}

}  // namespace tessera
