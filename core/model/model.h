// Models: a sequence of layers computing through one Device, with all parameters in one
// contiguous device buffer and all their gradients in another (same order, same offsets), so
// an optimiser step or a gradient allreduce touches one buffer.
//
// Parameter order and names are fixed per architecture and match PyTorch's state_dict
// ("conv1.weight", "conv1.bias", ..., "fc3.bias"); GetState/SetState exchange host copies in
// that order.
//
// Ownership: a Model borrows its Device, which must outlive it. Thread safety: one thread at a
// time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/model/layers.h"
#include "core/tensor.h"
#include "device/device.h"

namespace tessera {

// One layer of a declared model (docs/JOBS.md, "Declared models"); what a type does not use
// is ignored. Checked by CreateModel and CountParameters, with errors naming the layer.
struct LayerConfig {
  // "conv2d", "linear", "relu", "gelu", "tanh", "sigmoid", "max_pool", "avg_pool",
  // "global_avg_pool", "batch_norm", "layer_norm", "dropout", "flatten", "residual"; or
  // "softmax_cross_entropy" as the last entry, naming the loss every model ends in (no layer)
  std::string type;
  // Parameter prefix. Unnamed: "layers.<index>", or "<residual>.body.<index>" and
  // "<residual>.shortcut.<index>" inside a residual, whose named layers are "<residual>.<name>".
  std::string name;
  int out = 0;             // conv2d's out_channels, linear's out_features (linear: 0 is the classes)
  int kernel = 0;          // conv2d: square kernel
  int stride = 0;          // conv2d (0: 1), pools (0: the window)
  int padding = 0;         // conv2d: zeros on every side
  int groups = 1;          // conv2d: grouped convolution; divides the input channels and out
  bool bias = true;        // conv2d
  int window = 0;          // max_pool, avg_pool (0: 2)
  float probability = 0.5f;  // dropout
  float epsilon = 1e-5f;   // batch_norm, layer_norm
  float momentum = 0.1f;   // batch_norm's running statistics
  bool local = false;      // batch_norm: kept on each worker (FedBN, Li et al. 2021)
  std::vector<LayerConfig> body, shortcut;  // residual (an empty shortcut is the identity)
};

struct ModelConfig {
  // "simplecnn" | "mlp" | "mcmahan-cnn" | "resnet8" | "declared" (the layers below)
  std::string name = "simplecnn";
  std::vector<int> hidden = {200, 200};  // mlp hidden layer widths
  std::vector<LayerConfig> layers;       // "declared": the model, in order
  int channels = 1, rows = 28, cols = 28, classes = 10;
  uint64_t seed = 0;                  // initialisation; the same seed gives the same weights
};

// Bounds on declared models (enforced by CreateModel and CountParameters).
inline constexpr int kMaxDeclaredLayers = 256;            // in all, residuals' sub-layers included
inline constexpr int64_t kMaxActivationValues = 1 << 24;  // one sample's output of any layer
inline constexpr int kMaxLayerWidth = 1 << 16;            // out, kernel, window, stride
// A convolution's input unfolded for one sample (im2col): input channels per group x kernel x
// kernel x output positions. The devices hold that matrix whole inside the op (CUDA one per
// sample of the batch), and the CPU device aborts when it cannot allocate it.
inline constexpr int64_t kMaxConvolutionColumns = int64_t{1} << 28;

// Where one named parameter lies in the flat buffers (offset and count in floats).
struct ParameterView {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t count = 0;
  int64_t fan_in = 1;  // inputs feeding one output unit, as PyTorch's initialisation uses
  ParameterInit init = ParameterInit::kFanInUniform;
  bool trainable = true;  // false: a buffer (running statistics), not moved by the optimiser
  bool local = false;     // kept on each worker (ParameterSpec::local)
  bool non_negative = false;  // no value below zero (ParameterSpec::non_negative)
};

// A read-only description of one layer of a model.
struct LayerInfo {
  std::string name;             // "conv1", "relu1", "pool1", "fc3": the parameter prefix, or the
                                // kind's short name numbered in order of appearance
  std::string kind;             // "conv2d", "linear", "relu", "max_pool"
  ActivationShape output;       // per sample
  std::vector<LayerOp> ops;     // what one training step issues for it (see Layer::StepOps)
  std::vector<std::pair<std::string, int>> attributes;  // Layer::attributes()
  // A residual block's body, then its shortcut (empty: the identity), described alike.
  std::vector<std::vector<LayerInfo>> paths;
};

class Model {
 public:
  // Use CreateModel. Lays out the parameters of `layers` (run in order) in layer order,
  // allocates the flat parameters on `device` and binds the layers to them; the parameter
  // values are left undefined. The gradients come with the first Backward (EnsureGradients).
  static Result<std::unique_ptr<Model>> Build(std::string name, Device* device, ActivationShape input,
                                              std::vector<std::unique_ptr<Layer>> layers);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const std::string& name() const { return name_; }
  Device& device() const { return *device_; }
  const ActivationShape& input_shape() const { return input_; }
  int classes() const { return static_cast<int>(layers_.back()->output_shape().size()); }

  // Every value of the model's state: trained parameters, then buffers (running statistics).
  int64_t NumParameters() const { return num_parameters_; }
  // The trained parameters: the first NumTrainable() values of the flat buffers, which the
  // optimiser steps; the buffers after them change only in training forwards.
  int64_t NumTrainable() const { return num_trainable_; }
  const std::vector<ParameterView>& parameter_views() const { return views_; }
  // Training (the default: batch statistics, dropout) or inference (running statistics, no
  // dropout), for every layer, as PyTorch's train() / eval().
  void SetTraining(bool training);
  bool training() const { return training_; }
  // For a site cohort member training samples first_sample.. of each batch: the next training
  // forwards draw dropout as the whole batch would for those samples (0: whole batches, the
  // default). SkipStep moves the draws on by one step for a step whose slice is empty, so that
  // every member stays at the same step.
  void SetBatchSlice(int64_t first_sample);
  void SkipStep();
  // The flat buffers, NumParameters() floats each. Gradients hold the last Backward's values
  // (always zero over the buffers); empty before the first Backward and after
  // ReleaseGradients.
  DeviceBuffer& flat_parameters() { return parameters_; }
  DeviceBuffer& flat_gradients() { return gradients_; }
  // Frees the flat gradients (BackwardInPieces needs none), giving their memory back to the
  // device for the optimiser's state. EnsureGradients (which Backward calls) allocates them
  // again, zero, and points the layers back at them.
  void ReleaseGradients();
  Status EnsureGradients();

  // Host copies of every parameter, in parameter order; a copy from the device that fails
  // (a CUDA or XRT error) is the error, never zeros.
  Result<TensorSet> GetState() const;
  // Replaces every parameter. InvalidArgument (nothing changed) when names, shapes or order
  // differ from GetState()'s, a value is not finite, or a value that must not be negative (a
  // batch norm's running variance) is; the error names the tensor and the element.
  Status SetState(const TensorSet& state);

  // Runs the forward pass over `batch` samples at `input` (device address, [batch, C, H, W]).
  // Returns the logits [batch, classes] (a device address valid until the next Forward).
  // Grows the activation buffers when `batch` exceeds every earlier batch.
  Result<const float*> Forward(const float* input, int batch);
  // After Forward: writes the mean cross-entropy against `labels` (device int32 [batch]) to
  // *loss (one device float) and the gradients of every parameter to flat_gradients().
  // Errors: the device's, allocating the gradients after ReleaseGradients.
  Status Backward(const int32_t* labels, float* loss);

  // A piece of the trained parameters' gradients: `count` values (device address, valid for
  // the call; the callee may change them) for the parameters at flat offset `offset`.
  using GradientPiece = std::function<void(int64_t offset, int64_t count, float* gradients)>;
  // After Forward: Backward without the flat gradients. Each layer's gradients go to `piece`
  // once the pass no longer reads the parameters they belong to (layers run last to first,
  // each computing its input gradient before handing over its own), so `piece` may step
  // those parameters in place: an optimiser that needs one model-sized buffer fewer. The
  // values are those Backward writes (the same arithmetic, in scratch of the largest piece's
  // size): on host memory a large fully connected layer's weights come in pieces of rows
  // (LinearLayer::BackwardInPieces), every other layer's gradients at once; on an accelerator
  // (capabilities().device_index >= 0) every layer's at once.
  Status BackwardInPieces(const int32_t* labels, float* loss, const GradientPiece& piece);
  // The buffer holding the last Forward's logits ([batch, classes] at offset 0), for copying
  // them to the host.
  const DeviceBuffer& logits_buffer() const { return outputs_.back(); }

  // Every layer in order, with the ops one training step of `batch` samples issues for it.
  // The loss (SoftmaxCrossEntropy) and the optimiser step are not layers and not listed.
  std::vector<LayerInfo> DescribeLayers(int batch) const;
  // Forward over `batch` samples at `input` (device address), then copies every layer's output
  // to the host: (*per_layer_outputs)[i] holds layer i's [batch, output size] in NCHW order.
  // The last entry is the logits. Errors as Forward and the device's copies.
  Status ForwardCapture(const float* input, int batch, std::vector<std::vector<float>>* per_layer_outputs);

 private:
  Model(std::string name, Device* device, ActivationShape input, std::vector<std::unique_ptr<Layer>> layers);
  Status Reserve(int batch);

  std::string name_;
  Device* device_;
  ActivationShape input_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<ParameterView> views_;
  int64_t num_parameters_ = 0;
  int64_t num_trainable_ = 0;
  bool training_ = true;
  DeviceBuffer parameters_;
  DeviceBuffer gradients_;
  bool gradients_bound_ = false;  // every layer points at gradients_ (not at none or scratch_)
  // layer_offsets_[i], layer_counts_[i]: where layer i's trained parameters lie (floats).
  std::vector<int64_t> layer_offsets_;
  std::vector<int64_t> layer_counts_;
  DeviceBuffer scratch_;  // BackwardInPieces' pieces
  int64_t scratch_values_ = 0;
  // outputs_[i] and output_gradients_[i] hold layer i's output and its gradient.
  std::vector<DeviceBuffer> outputs_;
  std::vector<DeviceBuffer> output_gradients_;
  int reserved_batch_ = 0;
  int batch_ = 0;
  const float* input_data_ = nullptr;
};

// Builds a model on `device` with PyTorch-default initialisation drawn from config.seed
// (norms' weights 1 and biases 0, running means 0 and variances 1):
// "simplecnn" (NIID-Bench's SimpleCNN: conv 6@5x5, ReLU, pool 2, conv 16@5x5, ReLU, pool 2,
// fc 120, ReLU, fc 84, ReLU, fc classes; 44,426 parameters on 1x28x28), "mlp"
// (fc hidden[0], ReLU, ..., fc classes; names fc1, fc2, ...) or "mcmahan-cnn" (McMahan et
// al. 2017: conv 32@5x5 pad 2, ReLU, pool 2, conv 64@5x5 pad 2, ReLU, pool 2, fc 512, ReLU,
// fc classes; 1,663,370 parameters on 1x28x28), "resnet8" (a small ResNet for 32x32x3: conv
// 16@3x3, three residual stages of one basic block each at 16, 32 and 64 channels, the last
// two with stride 2 and a 1x1 projection shortcut, global average pool, fc classes; batch
// norm after every convolution, convolutions without bias) or "declared" (config.layers).
// InvalidArgument naming the unknown name and the known ones, a bad dimension, or the
// declared layer at fault ("model.layers[3] (conv2d): ...").
Result<std::unique_ptr<Model>> CreateModel(const ModelConfig& config, Device* device);

// As CreateModel, with `state` (every parameter and buffer, in the model's layout: SetState's
// checks) as its weights instead of the seeded draw, which is not made: a worker's model for a
// round whose weights come from the coordinator.
Result<std::unique_ptr<Model>> CreateModelWithState(const ModelConfig& config, Device* device,
                                                    const TensorSet& state);

// The names CreateModel knows.
std::vector<std::string> KnownModelNames();

// How many parameters (floats) CreateModel would lay out for `config`, computed from the
// layers' descriptions without allocating anything: a check of a model's size before it is
// built. The same errors as CreateModel for a bad config; InvalidArgument when the count
// overflows int64. With `non_negative`, the names of the parameters and buffers whose values
// may not be negative (ParameterSpec::non_negative: a batch norm's running variance) are
// appended to it.
Result<int64_t> CountParameters(const ModelConfig& config, std::vector<std::string>* non_negative = nullptr);

// The per-sample input shape of `config` (channels, rows, cols).
ActivationShape InputShape(const ModelConfig& config);

}  // namespace tessera
