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
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/model/layers.h"
#include "core/tensor.h"
#include "device/device.h"

namespace tessera {

struct ModelConfig {
  std::string name = "simplecnn";     // "simplecnn" | "mlp" | "mcmahan-cnn"
  std::vector<int> hidden = {200, 200};  // mlp hidden layer widths
  int channels = 1, rows = 28, cols = 28, classes = 10;
  uint64_t seed = 0;                  // initialisation; the same seed gives the same weights
};

// Where one named parameter lies in the flat buffers (offset and count in floats).
struct ParameterView {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t count = 0;
  int64_t fan_in = 1;  // inputs feeding one output unit, as PyTorch's initialisation uses
};

// A read-only description of one layer of a model.
struct LayerInfo {
  std::string name;             // "conv1", "relu1", "pool1", "fc3": the parameter prefix, or the
                                // kind's short name numbered in order of appearance
  std::string kind;             // "conv2d", "linear", "relu", "max_pool"
  ActivationShape output;       // per sample
  std::vector<LayerOp> ops;     // what one training step issues for it (see Layer::StepOps)
  std::vector<std::pair<std::string, int>> attributes;  // Layer::attributes()
};

class Model {
 public:
  // Use CreateModel. Lays out the parameters of `layers` (run in order) in layer order,
  // allocates the flat buffers on `device` and binds the layers to them; the parameter values
  // are left undefined, the gradients zero.
  static Result<std::unique_ptr<Model>> Build(std::string name, Device* device, ActivationShape input,
                                              std::vector<std::unique_ptr<Layer>> layers);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const std::string& name() const { return name_; }
  Device& device() const { return *device_; }
  const ActivationShape& input_shape() const { return input_; }
  int classes() const { return static_cast<int>(layers_.back()->output_shape().size()); }

  int64_t NumParameters() const { return num_parameters_; }
  const std::vector<ParameterView>& parameter_views() const { return views_; }
  // The flat buffers, NumParameters() floats each. Gradients hold the last Backward's values.
  DeviceBuffer& flat_parameters() { return parameters_; }
  DeviceBuffer& flat_gradients() { return gradients_; }

  // Host copies of every parameter, in parameter order.
  TensorSet GetState() const;
  // Replaces every parameter. InvalidArgument (nothing changed) when names, shapes or order
  // differ from GetState()'s, or a value is not finite.
  Status SetState(const TensorSet& state);

  // Runs the forward pass over `batch` samples at `input` (device address, [batch, C, H, W]).
  // Returns the logits [batch, classes] (a device address valid until the next Forward).
  // Grows the activation buffers when `batch` exceeds every earlier batch.
  Result<const float*> Forward(const float* input, int batch);
  // After Forward: writes the mean cross-entropy against `labels` (device int32 [batch]) to
  // *loss (one device float) and the gradients of every parameter to flat_gradients().
  void Backward(const int32_t* labels, float* loss);
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
  DeviceBuffer parameters_;
  DeviceBuffer gradients_;
  // outputs_[i] and output_gradients_[i] hold layer i's output and its gradient.
  std::vector<DeviceBuffer> outputs_;
  std::vector<DeviceBuffer> output_gradients_;
  int reserved_batch_ = 0;
  int batch_ = 0;
  const float* input_data_ = nullptr;
};

// Builds a model on `device` with PyTorch-default initialisation drawn from config.seed:
// "simplecnn" (NIID-Bench's SimpleCNN: conv 6@5x5, ReLU, pool 2, conv 16@5x5, ReLU, pool 2,
// fc 120, ReLU, fc 84, ReLU, fc classes; 44,426 parameters on 1x28x28), "mlp"
// (fc hidden[0], ReLU, ..., fc classes; names fc1, fc2, ...) or "mcmahan-cnn" (McMahan et
// al. 2017: conv 32@5x5 pad 2, ReLU, pool 2, conv 64@5x5 pad 2, ReLU, pool 2, fc 512, ReLU,
// fc classes; 1,663,370 parameters on 1x28x28). InvalidArgument naming the
// unknown name and the known ones, or a bad dimension.
Result<std::unique_ptr<Model>> CreateModel(const ModelConfig& config, Device* device);

// The names CreateModel knows.
std::vector<std::string> KnownModelNames();

// How many parameters (floats) CreateModel would lay out for `config`, computed from the
// layers' descriptions without allocating anything: a check of a model's size before it is
// built. The same errors as CreateModel for a bad config; InvalidArgument when the count
// overflows int64.
Result<int64_t> CountParameters(const ModelConfig& config);

// The per-sample input shape of `config` (channels, rows, cols).
ActivationShape InputShape(const ModelConfig& config);

}  // namespace tessera
