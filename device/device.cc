#include "device/device.h"

#include <utility>

namespace tessera {

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kGemm: return "gemm";
    case Op::kConv2dForward: return "conv2d_forward";
    case Op::kConv2dBackwardData: return "conv2d_backward_data";
    case Op::kConv2dBackwardFilter: return "conv2d_backward_filter";
    case Op::kBiasAdd: return "bias_add";
    case Op::kBiasGrad: return "bias_grad";
    case Op::kRelu: return "relu";
    case Op::kReluBackward: return "relu_backward";
    case Op::kMaxPool: return "max_pool";
    case Op::kMaxPoolBackward: return "max_pool_backward";
    case Op::kSoftmaxCrossEntropy: return "softmax_cross_entropy";
    case Op::kSgdMomentumUpdate: return "sgd_momentum_update";
    case Op::kAddScaledDifference: return "add_scaled_difference";
    case Op::kReduceSum: return "reduce_sum";
    case Op::kCast: return "cast";
    case Op::kFill: return "fill";
    case Op::kActivation: return "activation";
    case Op::kActivationBackward: return "activation_backward";
    case Op::kAvgPool: return "avg_pool";
    case Op::kAvgPoolBackward: return "avg_pool_backward";
    case Op::kBatchNormForward: return "batch_norm_forward";
    case Op::kBatchNormBackward: return "batch_norm_backward";
    case Op::kLayerNormForward: return "layer_norm_forward";
    case Op::kLayerNormBackward: return "layer_norm_backward";
    case Op::kDropout: return "dropout";
    case Op::kDropoutBackward: return "dropout_backward";
    case Op::kAxpby: return "axpby";
  }
  return "unknown";
}

const std::set<Op>& AllOps() {
  static const std::set<Op> all = {
      Op::kGemm,       Op::kConv2dForward,       Op::kConv2dBackwardData, Op::kConv2dBackwardFilter,
      Op::kBiasAdd,    Op::kBiasGrad,            Op::kRelu,               Op::kReluBackward,
      Op::kMaxPool,    Op::kMaxPoolBackward,     Op::kSoftmaxCrossEntropy, Op::kSgdMomentumUpdate,
      Op::kAddScaledDifference, Op::kReduceSum, Op::kCast, Op::kFill,
      Op::kActivation, Op::kActivationBackward, Op::kAvgPool, Op::kAvgPoolBackward,
      Op::kBatchNormForward, Op::kBatchNormBackward, Op::kLayerNormForward, Op::kLayerNormBackward,
      Op::kDropout, Op::kDropoutBackward, Op::kAxpby};
  return all;
}

std::string_view ActivationName(ActivationFunction function) {
  switch (function) {
    case ActivationFunction::kGelu: return "gelu";
    case ActivationFunction::kTanh: return "tanh";
    case ActivationFunction::kSigmoid: return "sigmoid";
  }
  return "unknown";
}

DeviceBuffer::DeviceBuffer(Device* device, MemoryPool* pool, void* address, size_t bytes, size_t class_bytes)
    : device_(device), pool_(pool), address_(address), bytes_(bytes), class_bytes_(class_bytes) {}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)),
      pool_(std::exchange(other.pool_, nullptr)),
      address_(std::exchange(other.address_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      class_bytes_(std::exchange(other.class_bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    device_ = std::exchange(other.device_, nullptr);
    pool_ = std::exchange(other.pool_, nullptr);
    address_ = std::exchange(other.address_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    class_bytes_ = std::exchange(other.class_bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (address_ != nullptr && pool_ != nullptr) pool_->Release(address_, class_bytes_);
  device_ = nullptr;
  pool_ = nullptr;
  address_ = nullptr;
  bytes_ = 0;
  class_bytes_ = 0;
}

Status CheckBufferRange(const DeviceBuffer& buffer, size_t offset, size_t bytes, const char* what) {
  if (buffer.empty() || offset > buffer.bytes() || bytes > buffer.bytes() - offset) {
    return OutOfRangeError(std::string(what) + ": range [" + std::to_string(offset) + ", " +
                           std::to_string(offset + bytes) + ") does not fit a buffer of " +
                           std::to_string(buffer.bytes()) + " bytes");
  }
  return Status::Ok();
}

}  // namespace tessera
