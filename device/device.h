// Device: the one interface through which Tessera computes. A backend (cpu/ now; cuda/, xrt/
// and emulated NPUs later) implements memory, copies and the small op set that training a
// convolutional or fully connected model needs. Models in core/model/ compute only through it.
//
// Memory model. Every buffer comes from the device's MemoryPool as a DeviceBuffer (RAII). Ops
// take raw element pointers into device memory (`buffer.f32() + offset`), so a model can keep
// all its parameters in one buffer and hand out per-tensor views. Pointers must come from this
// device's buffers; host pointers are accepted only by the Copy* methods.
//
// Ordering. Ops and copies run in issue order on one stream. A backend may run them
// asynchronously; CopyDeviceToHost and Synchronize() block until everything issued before
// them is done. The CPU backend runs everything synchronously on the calling thread.
//
// Errors. Shapes and pointers passed to ops are programming errors when wrong (asserted, not
// reported). Faults the device itself can raise (out of memory, a lost accelerator) are
// reported as Status by Allocate, the copies and Synchronize.
//
// Thread safety. A Device is used by one thread at a time; different devices are independent.
// DeviceBuffer destruction may happen on any thread (the pool is thread-safe).
//
// Capabilities are data: `capabilities().native_ops` lists what a backend runs natively. The
// CPU backend implements every op; a backend missing one is paired with a fallback by the
// registry that places work, never by a method that fails at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>

#include "base/status.h"
#include "device/dtype.h"
#include "device/memory_pool.h"

namespace tessera {

class Device;
class OpPlacement;  // device/placement.h

// The op set, one entry per Device method below.
enum class Op {
  kGemm,
  kConv2dForward,
  kConv2dBackwardData,
  kConv2dBackwardFilter,
  kBiasAdd,
  kBiasGrad,
  kRelu,
  kReluBackward,
  kMaxPool,
  kMaxPoolBackward,
  kSoftmaxCrossEntropy,
  kSgdMomentumUpdate,
  kAddScaledDifference,
  kReduceSum,
  kCast,
  kFill,
  // The ops of declared layer graphs (core/model/layers.h).
  kActivation,
  kActivationBackward,
  kAvgPool,
  kAvgPoolBackward,
  kBatchNormForward,
  kBatchNormBackward,
  kLayerNormForward,
  kLayerNormBackward,
  kDropout,
  kDropoutBackward,
  kAxpby,
};
std::string_view OpName(Op op);
// Every Op, in declaration order.
const std::set<Op>& AllOps();

struct DeviceCapabilities {
  std::string kind;          // backend name: "cpu", "cuda", "xrt", "npu-emulated"
  std::string name;          // this device: "cpu (OpenBLAS, 1 thread)", "NVIDIA H100 #0"
  bool emulated = false;     // a software model of hardware that is not present
  std::set<Op> native_ops;   // ops that run on the device itself
  std::set<DType> dtypes;    // element types its buffers and Cast support
  uint64_t memory_bytes = 0; // device memory; 0 when it is host memory without a set limit
  // Which accelerator of its kind on this host (the CUDA device ordinal) the device computes
  // on; -1 for host memory. A collective over this device's buffers must use the same one.
  int device_index = -1;
  // The precision the device's native ops compute in: float32, or float16 / bfloat16 / int8
  // when results are rounded to it (an emulated fp16 NPU). Host fallbacks compute in float32.
  DType compute_precision = DType::kFloat32;

  bool Supports(Op op) const { return native_ops.count(op) != 0; }
};

// An owned block of device memory from a device's pool. Move-only; returns the block to the
// pool when destroyed. Must not outlive the Device that allocated it.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device* device, MemoryPool* pool, void* address, size_t bytes, size_t class_bytes);
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  bool empty() const { return address_ == nullptr; }
  size_t bytes() const { return bytes_; }          // the size asked for
  Device* device() const { return device_; }
  void* data() const { return address_; }          // a device address
  float* f32() const { return static_cast<float*>(address_); }
  int32_t* i32() const { return static_cast<int32_t*>(address_); }
  int64_t f32_count() const { return static_cast<int64_t>(bytes_ / sizeof(float)); }

  void Reset();  // returns the memory to the pool now

 private:
  Device* device_ = nullptr;
  MemoryPool* pool_ = nullptr;
  void* address_ = nullptr;
  size_t bytes_ = 0;
  size_t class_bytes_ = 0;
};

// Shape of a 2-D convolution over NCHW tensors. Input x: [batch, in_channels, in_height,
// in_width]; filter w: [out_channels, in_channels, kernel_height, kernel_width]; output y:
// [batch, out_channels, out_height(), out_width()]. Zero padding, no dilation or groups.
struct Conv2dShape {
  int batch = 0;
  int in_channels = 0, in_height = 0, in_width = 0;
  int out_channels = 0, kernel_height = 0, kernel_width = 0;
  int stride = 1, padding = 0;

  int out_height() const { return (in_height + 2 * padding - kernel_height) / stride + 1; }
  int out_width() const { return (in_width + 2 * padding - kernel_width) / stride + 1; }
};

// Shape of a max pool over NCHW tensors: window `window` x `window`, step `stride`, no padding.
struct MaxPoolShape {
  int batch = 0, channels = 0, in_height = 0, in_width = 0;
  int window = 2, stride = 2;

  int out_height() const { return (in_height - window) / stride + 1; }
  int out_width() const { return (in_width - window) / stride + 1; }
};

// The pointwise functions of Device::Activation (ReLU has its own op).
enum class ActivationFunction {
  kGelu,     // x * Phi(x), Phi the standard normal CDF (the exact form, PyTorch's default)
  kTanh,
  kSigmoid,  // 1 / (1 + exp(-x))
};
std::string_view ActivationName(ActivationFunction function);

// Shape of a batch norm over NCHW tensors: statistics per channel over outer (the batch) and
// inner (height * width) positions. A fully connected activation is inner = 1.
struct BatchNormShape {
  int64_t outer = 0;
  int channels = 0;
  int64_t inner = 1;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual const DeviceCapabilities& capabilities() const = 0;
  // Where each op runs and what it cost (device/placement.h), for backends that place ops on a
  // host fallback; null for a backend that runs every op natively and keeps no account.
  virtual OpPlacement* placement() { return nullptr; }

  // ---- Memory ----
  // A buffer of `bytes` bytes, contents undefined. Served from the pool when possible.
  virtual Result<DeviceBuffer> Allocate(size_t bytes) = 0;
  virtual MemoryPoolStats pool_stats() const = 0;
  // Returns the pool's cached (free) blocks to the driver: after a task, so that an idle
  // process holds what it uses and no more. Blocks in use are untouched.
  virtual void ReleaseCachedMemory() = 0;
  // Copies `bytes` bytes; offsets are in bytes. OutOfRange when a range leaves a buffer.
  virtual Status CopyHostToDevice(const void* host, DeviceBuffer& destination, size_t destination_offset,
                                  size_t bytes) = 0;
  virtual Status CopyDeviceToHost(const DeviceBuffer& source, size_t source_offset, void* host,
                                  size_t bytes) = 0;
  virtual Status CopyDeviceToDevice(const DeviceBuffer& source, size_t source_offset,
                                    DeviceBuffer& destination, size_t destination_offset, size_t bytes) = 0;
  // Blocks until every op and copy issued so far is complete; reports a deferred device fault.
  virtual Status Synchronize() = 0;

  // ---- Ops (float32; all pointers are device addresses; counts are elements) ----

  // c[m x n] = alpha * op(a) * op(b) + beta * c, row-major. op(a) is [m x k]: a is stored
  // [m x k] or, when transpose_a, [k x m]; likewise op(b) is [k x n], stored [n x k] when
  // transpose_b. Leading dimensions are the stored row lengths. m or n = 0 does nothing;
  // k = 0 leaves c = beta * c (c is not read when beta is 0, as in BLAS).
  virtual void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
                    const float* b, float beta, float* c) = 0;

  // y = conv(x, w) (+ bias[out_channels] when bias is not null). Shapes in Conv2dShape.
  virtual void Conv2dForward(const Conv2dShape& shape, const float* x, const float* w, const float* bias,
                             float* y) = 0;
  // dx = gradient of the loss w.r.t. x given dy (overwrites dx).
  virtual void Conv2dBackwardData(const Conv2dShape& shape, const float* dy, const float* w, float* dx) = 0;
  // dw = gradient w.r.t. w (overwrites dw); when dbias is not null also dbias[out_channels]
  // = sum of dy over batch and positions (fused Conv2d's BiasGrad).
  virtual void Conv2dBackwardFilter(const Conv2dShape& shape, const float* x, const float* dy, float* dw,
                                    float* dbias) = 0;

  // x[outer][channels][inner] += bias[channels], in place. A fully connected layer's output
  // is outer=batch, inner=1; an NCHW activation is outer=batch, inner=height*width.
  virtual void BiasAdd(int64_t outer, int channels, int64_t inner, const float* bias, float* x) = 0;
  // dbias[channels] = sum of dy[outer][channels][inner] over outer and inner (overwrites).
  virtual void BiasGrad(int64_t outer, int channels, int64_t inner, const float* dy, float* dbias) = 0;

  // y = max(x, 0); y may equal x.
  virtual void Relu(int64_t count, const float* x, float* y) = 0;
  // dx = dy where y > 0, else 0 (y is the forward output); dx may equal dy.
  virtual void ReluBackward(int64_t count, const float* y, const float* dy, float* dx) = 0;

  // y = max over each window; argmax[i] records the index of the chosen element within its
  // input plane (in_height * in_width), for the backward pass. y and argmax are
  // [batch, channels, out_height, out_width].
  virtual void MaxPool(const MaxPoolShape& shape, const float* x, float* y, int32_t* argmax) = 0;
  // dx = 0 except dx[argmax] += dy (overwrites dx), summed in output order where windows
  // overlap: deterministic, and the cpu and cuda backends agree bit for bit. argmax is what MaxPool
  // wrote for this shape: each index lies inside its own output's window.
  virtual void MaxPoolBackward(const MaxPoolShape& shape, const float* dy, const int32_t* argmax,
                               float* dx) = 0;

  // logits [batch x classes], labels [batch] in [0, classes). Writes the mean cross-entropy
  // over the batch to *loss (one device float) and, when dlogits is not null, its gradient
  // (softmax - onehot) / batch.
  virtual void SoftmaxCrossEntropy(int batch, int classes, const float* logits, const int32_t* labels,
                                   float* loss, float* dlogits) = 0;

  // PyTorch SGD with momentum (dampening 0, no Nesterov), over `count` elements:
  // d = g + weight_decay * w;  v = momentum * v + d;  w -= learning_rate * v.
  // Start with v = 0 to match PyTorch's first step (v = d).
  virtual void SgdMomentumUpdate(int64_t count, float learning_rate, float momentum, float weight_decay,
                                 const float* gradients, float* velocity, float* weights) = 0;

  // y += alpha * (a - b), elementwise over `count` elements; y may equal a or b. The
  // client-side terms of federated algorithms: FedProx's proximal term on a flat gradient
  // (a = the weights, b = the round's global weights, alpha = mu) and SCAFFOLD's correction on
  // the weights (a = the server's control variate, b = the client's, alpha = -lr).
  virtual void AddScaledDifference(int64_t count, float alpha, const float* a, const float* b, float* y) = 0;

  // *sum = sum of x[0..count) (one device float), accumulated in double where the backend can.
  virtual void ReduceSum(int64_t count, const float* x, float* sum) = 0;

  // Converts `count` elements between float32 and another dtype in capabilities().dtypes
  // (float16 and bfloat16 round to nearest even; int types round and saturate).
  virtual void Cast(int64_t count, DType from, const void* x, DType to, void* y) = 0;

  // x[0..count) = value.
  virtual void Fill(int64_t count, float value, float* x) = 0;

  // ---- The ops of declared layer graphs ----

  // y = f(x) elementwise; y may equal x.
  virtual void Activation(ActivationFunction function, int64_t count, const float* x, float* y) = 0;
  // dx = dy * f'(x), from x (GELU) or the forward output y (tanh: 1 - y^2, sigmoid: y (1 - y));
  // dx may equal dy.
  virtual void ActivationBackward(ActivationFunction function, int64_t count, const float* x, const float* y,
                                  const float* dy, float* dx) = 0;

  // y = the mean over each window (window x window, step stride, no padding; the MaxPoolShape
  // geometry). y is [batch, channels, out_height, out_width].
  virtual void AvgPool(const MaxPoolShape& shape, const float* x, float* y) = 0;
  // dx = each dy spread evenly over its window, summed where windows overlap (overwrites dx;
  // positions no window covers get 0). Deterministic: summed in output order.
  virtual void AvgPoolBackward(const MaxPoolShape& shape, const float* dy, float* dx) = 0;

  // Batch normalisation over x [outer, channels, inner] (PyTorch's BatchNorm1d/2d):
  // y = gamma[c] * (x - mean[c]) * invstd[c] + beta[c].
  // training: mean and the biased variance are the batch's; saved_mean and saved_invstd
  //   [channels] receive mean and 1 / sqrt(var + epsilon) for the backward pass, and the
  //   running statistics move by `momentum`: running_mean = (1 - momentum) running_mean +
  //   momentum mean, running_var likewise with the unbiased variance (n / (n - 1) var, n =
  //   outer * inner; the biased one when n = 1).
  // not training: mean and var are running_mean and running_var, nothing else is written and
  //   saved_mean / saved_invstd may be null.
  virtual void BatchNormForward(const BatchNormShape& shape, bool training, float momentum, float epsilon,
                                const float* x, const float* gamma, const float* beta, float* running_mean,
                                float* running_var, float* saved_mean, float* saved_invstd, float* y) = 0;
  // Given x, dy and what a training forward saved: dgamma[c] = sum dy * xhat, dbeta[c] = sum
  // dy (overwritten) and, when dx is not null, dx = gamma invstd / n (n dy - sum dy - xhat
  // sum dy xhat) with xhat = (x - mean) invstd, sums per channel over the n positions.
  virtual void BatchNormBackward(const BatchNormShape& shape, const float* x, const float* dy, const float* gamma,
                                 const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma,
                                 float* dbeta) = 0;

  // Layer normalisation of each of `rows` rows of `columns` values (PyTorch's LayerNorm over a
  // sample's features): y = gamma[j] (x - mean) invstd + beta[j] with the row's mean and
  // biased variance, invstd = 1 / sqrt(var + epsilon); saved_mean and saved_invstd [rows]
  // receive them for the backward pass.
  virtual void LayerNormForward(int64_t rows, int columns, float epsilon, const float* x, const float* gamma,
                                const float* beta, float* saved_mean, float* saved_invstd, float* y) = 0;
  // dgamma[j] = sum over rows of dy xhat, dbeta[j] = sum of dy (overwritten); when dx is not
  // null, dx = invstd / m (m g - sum g - xhat sum g xhat) per row, g = dy gamma, m = columns.
  virtual void LayerNormBackward(int64_t rows, int columns, const float* x, const float* dy, const float* gamma,
                                 const float* saved_mean, const float* saved_invstd, float* dx, float* dgamma,
                                 float* dbeta) = 0;

  // Inverted dropout: element i is kept when DropoutUniform(seed, i) >= probability; mask[i]
  // = 1 / (1 - probability) where kept and 0 where dropped, y = x * mask. The draw depends
  // only on (seed, i), so every backend drops the same elements. probability in [0, 1).
  virtual void Dropout(int64_t count, float probability, uint64_t seed, const float* x, float* y,
                       float* mask) = 0;
  // dx = dy * mask; dx may equal dy.
  virtual void DropoutBackward(int64_t count, const float* mask, const float* dy, float* dx) = 0;

  // y = alpha * x + beta * y elementwise (y is not read when beta is 0, as in BLAS): a
  // residual connection's sum and its gradient's fan-in.
  virtual void Axpby(int64_t count, float alpha, const float* x, float beta, float* y) = 0;
};

// The uniform draw in [0, 1) behind Device::Dropout for element `index`: the top 24 bits of
// SplitMix64 of seed + (index + 1) * 0x9E3779B97F4A7C15, times 2^-24. Exact in float on every
// backend (host and device code).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline float DropoutUniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

// OutOfRange unless [offset, offset + bytes) lies inside `buffer`; `what` names the call
// ("CopyHostToDevice"). For backends' copy methods.
Status CheckBufferRange(const DeviceBuffer& buffer, size_t offset, size_t bytes, const char* what);

}  // namespace tessera
