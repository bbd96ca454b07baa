#include "core/model/model.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <set>
#include <random>
#include <utility>

#include "base/huge_pages.h"

namespace tessera {

Model::Model(std::string name, Device* device, ActivationShape input, std::vector<std::unique_ptr<Layer>> layers)
    : name_(std::move(name)), device_(device), input_(input), layers_(std::move(layers)) {
  // Trained parameters first, in layer order, then the buffers, so the optimiser steps one
  // prefix of the flat buffer.
  for (bool trainable : {true, false}) {
    for (const auto& layer : layers_) {
      for (const ParameterSpec& spec : trainable ? layer->parameters() : layer->buffers()) {
        const int64_t count = spec.Count();
        views_.push_back({spec.name, spec.shape, num_parameters_, count, spec.fan_in, spec.init, trainable, spec.local,
                          spec.non_negative});
        num_parameters_ += count;
      }
    }
    if (trainable) num_trainable_ = num_parameters_;
  }
  outputs_.resize(layers_.size());
  output_gradients_.resize(layers_.size());
}

Result<std::unique_ptr<Model>> Model::Build(std::string name, Device* device, ActivationShape input,
                                            std::vector<std::unique_ptr<Layer>> layers) {
  std::unique_ptr<Model> model(new Model(std::move(name), device, input, std::move(layers)));
  const size_t bytes = static_cast<size_t>(model->num_parameters_) * sizeof(float);
  ASSIGN_OR_RETURN(model->parameters_, device->Allocate(bytes));
  // No gradients: they come with the first Backward (EnsureGradients); a model that only
  // infers, or trains in pieces, never holds them.
  int64_t offset = 0, buffer_offset = model->num_trainable_;
  for (const auto& layer : model->layers_) {
    layer->Bind(model->parameters_.f32() + offset, nullptr);
    layer->BindBuffers(model->parameters_.f32() + buffer_offset);
    model->layer_offsets_.push_back(offset);
    for (const ParameterSpec& spec : layer->parameters()) offset += spec.Count();
    model->layer_counts_.push_back(offset - model->layer_offsets_.back());
    for (const ParameterSpec& spec : layer->buffers()) buffer_offset += spec.Count();
  }
  return model;
}

void Model::SetTraining(bool training) {
  training_ = training;
  for (auto& layer : layers_) layer->set_training(training);
}

void Model::SetBatchSlice(int64_t first_sample) {
  for (auto& layer : layers_) layer->set_batch_slice(first_sample);
}

void Model::SkipStep() {
  for (auto& layer : layers_) layer->SkipStep();
}

Result<TensorSet> Model::GetState() const {
  // Tensor by tensor straight into the result: no flat copy of the whole model on the way.
  TensorSet state;
  state.reserve(views_.size());
  for (const ParameterView& view : views_) {
    NamedTensor tensor{view.name, view.shape, ZeroedFloats(static_cast<size_t>(view.count))};
    Status copied = device_->CopyDeviceToHost(parameters_, static_cast<size_t>(view.offset) * sizeof(float),
                                              tensor.values.data(), tensor.ByteSize());
    if (!copied.ok()) return copied.WithContext("model '" + name_ + "': reading " + view.name + " from the device");
    state.push_back(std::move(tensor));
  }
  return state;
}

Status Model::SetState(const TensorSet& state) {
  TensorSet reference;
  reference.reserve(views_.size());
  for (const ParameterView& view : views_) reference.push_back({view.name, view.shape, {}});
  const std::string what = "state for model '" + name_ + "'";
  RETURN_IF_ERROR(CheckSameLayout(reference, state, what));
  RETURN_IF_ERROR(CheckFinite(state, what));
  for (size_t i = 0; i < views_.size(); ++i) {  // a negative running variance: NaN in every evaluation
    if (views_[i].non_negative) RETURN_IF_ERROR(CheckNotNegative(state[i], what));
  }
  for (size_t i = 0; i < views_.size(); ++i) {
    RETURN_IF_ERROR(device_->CopyHostToDevice(state[i].values.data(), parameters_,
                                              views_[i].offset * sizeof(float), state[i].ByteSize()));
  }
  return Status::Ok();
}

Status Model::Reserve(int batch) {
  if (batch <= reserved_batch_) return Status::Ok();
  // Until every buffer is in place nothing is reserved: an allocation that fails half-way
  // leaves buffers released or too small, and the next pass must reserve them all again.
  reserved_batch_ = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const size_t bytes = static_cast<size_t>(batch) * layers_[i]->output_shape().size() * sizeof(float);
    outputs_[i].Reset();
    output_gradients_[i].Reset();
    ASSIGN_OR_RETURN(outputs_[i], device_->Allocate(bytes));
    ASSIGN_OR_RETURN(output_gradients_[i], device_->Allocate(bytes));
    RETURN_IF_ERROR(layers_[i]->Reserve(*device_, batch));
  }
  reserved_batch_ = batch;
  return Status::Ok();
}

Result<const float*> Model::Forward(const float* input, int batch) {
  if (batch <= 0) return InvalidArgumentError("model '" + name_ + "': batch must be positive, got " + std::to_string(batch));
  RETURN_IF_ERROR(Reserve(batch));
  batch_ = batch;
  input_data_ = input;
  const float* x = input;
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->Forward(*device_, batch, x, outputs_[i].f32());
    x = outputs_[i].f32();
  }
  return x;
}

namespace {

LayerInfo Describe(const Layer& layer, int batch, bool input_gradient, std::map<std::string, int>& seen) {
  LayerInfo info;
  info.kind = std::string(layer.kind());
  info.name = layer.name();
  if (info.name.empty()) {
    const std::string short_name = info.kind == "max_pool" ? "pool" : info.kind;
    info.name = short_name + std::to_string(++seen[short_name]);
  }
  info.output = layer.output_shape();
  info.attributes = layer.attributes();
  info.ops = layer.StepOps(batch, input_gradient);
  for (const auto& path : layer.paths()) {
    std::vector<LayerInfo> described;
    for (const Layer* sub : path) described.push_back(Describe(*sub, batch, true, seen));
    info.paths.push_back(std::move(described));
  }
  return info;
}

}  // namespace

std::vector<LayerInfo> Model::DescribeLayers(int batch) const {
  std::vector<LayerInfo> infos;
  std::map<std::string, int> seen;  // per short name, for numbering layers without parameters
  for (size_t i = 0; i < layers_.size(); ++i) {
    infos.push_back(Describe(*layers_[i], batch, i > 0, seen));  // the first layer's input needs no gradient
  }
  return infos;
}

Status Model::ForwardCapture(const float* input, int batch, std::vector<std::vector<float>>* per_layer_outputs) {
  RETURN_IF_ERROR(Forward(input, batch).status());
  per_layer_outputs->assign(layers_.size(), {});
  for (size_t i = 0; i < layers_.size(); ++i) {
    std::vector<float>& host = (*per_layer_outputs)[i];
    host.resize(static_cast<size_t>(batch) * layers_[i]->output_shape().size());
    RETURN_IF_ERROR(device_->CopyDeviceToHost(outputs_[i], 0, host.data(), host.size() * sizeof(float)));
  }
  return Status::Ok();
}

void Model::ReleaseGradients() {
  gradients_.Reset();
  gradients_bound_ = false;
}

Status Model::EnsureGradients() {
  if (gradients_bound_) return Status::Ok();
  if (gradients_.empty()) {
    ASSIGN_OR_RETURN(gradients_, device_->Allocate(static_cast<size_t>(num_parameters_) * sizeof(float)));
    device_->Fill(num_parameters_, 0.0f, gradients_.f32());
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->Bind(parameters_.f32() + layer_offsets_[i], gradients_.f32() + layer_offsets_[i]);
  }
  gradients_bound_ = true;
  return Status::Ok();
}

Status Model::Backward(const int32_t* labels, float* loss) {
  RETURN_IF_ERROR(EnsureGradients());
  const size_t last = layers_.size() - 1;
  device_->SoftmaxCrossEntropy(batch_, classes(), outputs_[last].f32(), labels, loss, output_gradients_[last].f32());
  for (size_t i = layers_.size(); i-- > 0;) {
    const float* x = i == 0 ? input_data_ : outputs_[i - 1].f32();
    float* dx = i == 0 ? nullptr : output_gradients_[i - 1].f32();
    layers_[i]->Backward(*device_, batch_, x, outputs_[i].f32(), output_gradients_[i].f32(), dx);
  }
  return Status::Ok();
}

Status Model::BackwardInPieces(const int32_t* labels, float* loss, const GradientPiece& piece) {
  // Rows in pieces only on host memory: on an accelerator each piece's gather is a kernel
  // launch per sample, and its memory is not what this saves.
  const bool rows = device_->capabilities().device_index < 0;
  int64_t needed = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int64_t own = rows ? layers_[i]->PieceScratch(batch_) : 0;
    needed = std::max(needed, own > 0 ? own : layer_counts_[i]);
  }
  if (needed > scratch_values_) {
    scratch_.Reset();
    scratch_values_ = 0;
    ASSIGN_OR_RETURN(scratch_, device_->Allocate(static_cast<size_t>(needed) * sizeof(float)));
    scratch_values_ = needed;
  }
  float* scratch = scratch_.f32();
  const size_t last = layers_.size() - 1;
  device_->SoftmaxCrossEntropy(batch_, classes(), outputs_[last].f32(), labels, loss, output_gradients_[last].f32());
  for (size_t i = layers_.size(); i-- > 0;) {
    const float* x = i == 0 ? input_data_ : outputs_[i - 1].f32();
    float* dx = i == 0 ? nullptr : output_gradients_[i - 1].f32();
    Layer& layer = *layers_[i];
    if (layer_counts_[i] == 0) {
      layer.Backward(*device_, batch_, x, outputs_[i].f32(), output_gradients_[i].f32(), dx);
      continue;
    }
    const int64_t base = layer_offsets_[i];
    const Layer::GradientPiece own_piece = [&](int64_t offset, int64_t count, float* values) {
      piece(base + offset, count, values);
    };
    if (rows && layer.BackwardInPieces(*device_, batch_, x, outputs_[i].f32(), output_gradients_[i].f32(), dx,
                                       scratch, own_piece)) {
      continue;
    }
    // The whole layer's gradients in scratch, handed over after its Backward has read the
    // parameters for dx.
    layer.Bind(parameters_.f32() + base, scratch);
    gradients_bound_ = false;
    layer.Backward(*device_, batch_, x, outputs_[i].f32(), output_gradients_[i].f32(), dx);
    piece(base, layer_counts_[i], scratch);
  }
  return Status::Ok();
}

namespace {

// Uniform(-bound, bound) from the top 24 bits of a 64-bit draw: the same on every platform.
float UniformFrom(std::mt19937_64& engine, float bound) {
  const float unit = static_cast<float>(engine() >> 40) * (1.0f / 16777216.0f);
  return (2.0f * unit - 1.0f) * bound;
}

}  // namespace

std::vector<std::string> KnownModelNames() { return {"simplecnn", "mlp", "mcmahan-cnn", "resnet8", "declared"}; }

ActivationShape InputShape(const ModelConfig& config) { return {config.channels, config.rows, config.cols}; }

namespace {

bool IsNameChar(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.'; }

// Turns declared layers into Layers, inferring each one's input from the one before.
// A setting given a value on a layer type that has no use for it (a kernel on a linear layer,
// a window on a convolution) is refused, naming the layer, the setting and the types it
// applies to: ignored, it would leave the job training another model than its spec reads.
Status RefuseUnusedSettings(const LayerConfig& layer, const std::string& at) {
  const LayerConfig defaults;
  struct Setting {
    const char* name;
    bool given;
    std::vector<const char*> types;
  };
  const Setting settings[] = {
      {"local", layer.local != defaults.local, {"batch_norm"}},
      {"bias = false", layer.bias != defaults.bias, {"conv2d"}},
      {"out", layer.out != defaults.out, {"conv2d", "linear"}},
      {"kernel", layer.kernel != defaults.kernel, {"conv2d"}},
      {"padding", layer.padding != defaults.padding, {"conv2d"}},
      {"groups", layer.groups != defaults.groups, {"conv2d"}},
      {"stride", layer.stride != defaults.stride, {"conv2d", "max_pool", "avg_pool"}},
      {"window", layer.window != defaults.window, {"max_pool", "avg_pool"}},
      {"probability", layer.probability != defaults.probability, {"dropout"}},
      {"epsilon", layer.epsilon != defaults.epsilon, {"batch_norm", "layer_norm"}},
      {"momentum", layer.momentum != defaults.momentum, {"batch_norm"}},
      {"body", !layer.body.empty(), {"residual"}},
      {"shortcut", !layer.shortcut.empty(), {"residual"}},
  };
  for (const Setting& setting : settings) {
    if (!setting.given) continue;
    bool used = false;
    std::string types;
    for (const char* type : setting.types) {
      used = used || layer.type == type;
      types += std::string(types.empty() ? "" : ", ") + type;
    }
    if (!used) return InvalidArgumentError(at + ": " + setting.name + " applies to " + types + " only");
  }
  return Status::Ok();
}

class DeclaredBuilder {
 public:
  DeclaredBuilder(const ModelConfig& config) : config_(config) {}

  Result<std::vector<std::unique_ptr<Layer>>> Build(const std::vector<LayerConfig>& layers, ActivationShape input,
                                                    const std::string& where, const std::string& named_prefix,
                                                    const std::string& index_prefix, int depth,
                                                    ActivationShape* output) {
    if (layers.empty()) return InvalidArgumentError(where + ": has no layers");
    std::vector<std::unique_ptr<Layer>> built;
    ActivationShape shape = input;
    for (size_t i = 0; i < layers.size(); ++i) {
      const LayerConfig& layer = layers[i];
      const std::string at = where + "[" + std::to_string(i) + "] (" + Printable(layer.type) + ")";
      if (++total_ > kMaxDeclaredLayers) {
        return InvalidArgumentError(at + ": a model may have at most " + std::to_string(kMaxDeclaredLayers) +
                                    " layers in all");
      }
      if (layer.type == "softmax_cross_entropy") {
        // The loss every model ends in; declaring it is allowed as the model's last entry only.
        if (depth == 0 && i + 1 == layers.size() && i > 0) continue;
        return InvalidArgumentError(at + ": the loss may only be the model's last entry (every model ends in "
                                    "softmax cross-entropy on its last layer's outputs, declared or not)");
      }
      ASSIGN_OR_RETURN(std::unique_ptr<Layer> made, Make(layer, shape, at, named_prefix, index_prefix, i, depth));
      shape = made->output_shape();
      if (shape.channels <= 0 || shape.height <= 0 || shape.width <= 0) {
        return InvalidArgumentError(at + ": leaves no output (" + Describe(shape) + ")");
      }
      if (shape.size() > kMaxActivationValues) {
        return InvalidArgumentError(at + ": its output of " + Describe(shape) + " exceeds " +
                                    std::to_string(kMaxActivationValues) + " values per sample");
      }
      built.push_back(std::move(made));
    }
    *output = shape;
    return built;
  }

 private:
  static std::string Describe(const ActivationShape& s) {
    return std::to_string(s.channels) + "x" + std::to_string(s.height) + "x" + std::to_string(s.width);
  }
  static std::string Printable(const std::string& text) {
    std::string out;
    for (char c : text.substr(0, 32)) out += IsNameChar(c) ? c : '?';
    return out;
  }
  static Status InRange(const std::string& at, const char* key, int value, int low, int high) {
    if (value < low || value > high) {
      return InvalidArgumentError(at + ": " + key + " must be in [" + std::to_string(low) + ", " +
                                  std::to_string(high) + "], got " + std::to_string(value));
    }
    return Status::Ok();
  }

  // A named layer is "<named_prefix><name>", an unnamed one "<index_prefix><index>".
  Result<std::string> NameFor(const LayerConfig& layer, const std::string& at, const std::string& named_prefix,
                              const std::string& index_prefix, size_t index) {
    std::string name = layer.name;
    if (name.size() > 64 || !std::all_of(name.begin(), name.end(), IsNameChar) ||
        (!name.empty() && (name.front() == '.' || name.back() == '.'))) {
      return InvalidArgumentError(at + ": name must be at most 64 letters, digits, '_' or '.' (not first or last)");
    }
    const std::string full = name.empty() ? index_prefix + std::to_string(index) : named_prefix + name;
    if (!names_.insert(full).second) return InvalidArgumentError(at + ": name '" + full + "' is used twice");
    return full;
  }

  Result<std::unique_ptr<Layer>> Make(const LayerConfig& layer, ActivationShape in, const std::string& at,
                                      const std::string& named_prefix, const std::string& index_prefix, size_t index,
                                      int depth) {
    const std::string& type = layer.type;
    // A setting the type has no use for is refused, not ignored: a job sent over the wire
    // (the CLI's TOML reader refuses it too) would otherwise train another model than it says.
    RETURN_IF_ERROR(RefuseUnusedSettings(layer, at));
    if (type == "conv2d") {
      ASSIGN_OR_RETURN(std::string name, NameFor(layer, at, named_prefix, index_prefix, index));
      RETURN_IF_ERROR(InRange(at, "out", layer.out, 1, kMaxLayerWidth));
      RETURN_IF_ERROR(InRange(at, "kernel", layer.kernel, 1, kMaxLayerWidth));
      RETURN_IF_ERROR(InRange(at, "stride", layer.stride == 0 ? 1 : layer.stride, 1, kMaxLayerWidth));
      RETURN_IF_ERROR(InRange(at, "padding", layer.padding, 0, layer.kernel - 1));
      RETURN_IF_ERROR(InRange(at, "groups", layer.groups, 1, kMaxLayerWidth));
      if (in.channels % layer.groups != 0 || layer.out % layer.groups != 0) {
        return InvalidArgumentError(at + ": groups " + std::to_string(layer.groups) + " must divide its " +
                                    std::to_string(in.channels) + " input channels and its " +
                                    std::to_string(layer.out) + " outputs");
      }
      if (layer.kernel > in.height + 2 * layer.padding || layer.kernel > in.width + 2 * layer.padding) {
        return InvalidArgumentError(at + ": kernel " + std::to_string(layer.kernel) + " is larger than its padded " +
                                    Describe(in) + " input");
      }
      // The output bound does not bound the unfolded input: a large kernel over a padded input
      // grows both its rows and its columns, past what any device can hold (the CPU's op
      // aborts when its scratch cannot be allocated).
      const int stride = layer.stride == 0 ? 1 : layer.stride;
      const int64_t out_height = (static_cast<int64_t>(in.height) + 2 * layer.padding - layer.kernel) / stride + 1;
      const int64_t out_width = (static_cast<int64_t>(in.width) + 2 * layer.padding - layer.kernel) / stride + 1;
      const int64_t positions = out_height * out_width;
      const int64_t rows = static_cast<int64_t>(in.channels / layer.groups) * layer.kernel * layer.kernel;
      int64_t unfolded = 0;
      if (__builtin_mul_overflow(rows, positions, &unfolded) || unfolded > kMaxConvolutionColumns) {
        return InvalidArgumentError(at + ": its input unfolded for one sample (" + std::to_string(rows) +
                                    " rows of input channels per group x kernel x kernel, by " +
                                    std::to_string(positions) + " output positions) exceeds " +
                                    std::to_string(kMaxConvolutionColumns) + " values");
      }
      return std::unique_ptr<Layer>(std::make_unique<Conv2dLayer>(name, in, layer.out, layer.kernel, stride,
                                                                  layer.padding, layer.bias, layer.groups));
    }
    if (type == "linear") {
      ASSIGN_OR_RETURN(std::string name, NameFor(layer, at, named_prefix, index_prefix, index));
      const int out = layer.out == 0 ? config_.classes : layer.out;
      RETURN_IF_ERROR(InRange(at, "out", out, 1, kMaxLayerWidth));
      if (in.size() > INT_MAX / kMaxLayerWidth) {
        return InvalidArgumentError(at + ": its input of " + Describe(in) + " is too large for a linear layer");
      }
      return std::unique_ptr<Layer>(std::make_unique<LinearLayer>(name, in, out));
    }
    if (type == "relu") return std::unique_ptr<Layer>(std::make_unique<ReluLayer>(in));
    if (type == "gelu") return std::unique_ptr<Layer>(std::make_unique<ActivationLayer>(in, ActivationFunction::kGelu));
    if (type == "tanh") return std::unique_ptr<Layer>(std::make_unique<ActivationLayer>(in, ActivationFunction::kTanh));
    if (type == "sigmoid") {
      return std::unique_ptr<Layer>(std::make_unique<ActivationLayer>(in, ActivationFunction::kSigmoid));
    }
    if (type == "max_pool" || type == "avg_pool") {
      const int window = layer.window == 0 ? 2 : layer.window;
      const int stride = layer.stride == 0 ? window : layer.stride;
      RETURN_IF_ERROR(InRange(at, "window", window, 1, kMaxLayerWidth));
      RETURN_IF_ERROR(InRange(at, "stride", stride, 1, kMaxLayerWidth));
      if (window > in.height || window > in.width) {
        return InvalidArgumentError(at + ": window " + std::to_string(window) + " is larger than its " +
                                    Describe(in) + " input");
      }
      if (type == "max_pool") return std::unique_ptr<Layer>(std::make_unique<MaxPoolLayer>(in, window, stride));
      return std::unique_ptr<Layer>(std::make_unique<AvgPoolLayer>(in, window, stride));
    }
    if (type == "global_avg_pool") return std::unique_ptr<Layer>(std::make_unique<GlobalAvgPoolLayer>(in));
    if (type == "flatten") return std::unique_ptr<Layer>(std::make_unique<FlattenLayer>(in));
    if (type == "batch_norm" || type == "layer_norm") {
      ASSIGN_OR_RETURN(std::string name, NameFor(layer, at, named_prefix, index_prefix, index));
      if (!(layer.epsilon > 0.0f && layer.epsilon <= 1.0f)) {
        return InvalidArgumentError(at + ": epsilon must be in (0, 1], got " + std::to_string(layer.epsilon));
      }
      if (type == "layer_norm") {
        return std::unique_ptr<Layer>(std::make_unique<LayerNormLayer>(name, in, layer.epsilon));
      }
      if (!(layer.momentum >= 0.0f && layer.momentum <= 1.0f)) {
        return InvalidArgumentError(at + ": momentum must be in [0, 1], got " + std::to_string(layer.momentum));
      }
      return std::unique_ptr<Layer>(
          std::make_unique<BatchNormLayer>(name, in, layer.epsilon, layer.momentum, layer.local));
    }
    if (type == "dropout") {
      if (!(layer.probability >= 0.0f && layer.probability < 1.0f)) {
        return InvalidArgumentError(at + ": probability must be in [0, 1), got " + std::to_string(layer.probability));
      }
      const uint64_t seed = config_.seed * 0x9E3779B97F4A7C15ull + 0x5851F42D4C957F2Dull * (++dropouts_);
      return std::unique_ptr<Layer>(std::make_unique<DropoutLayer>(in, layer.probability, seed));
    }
    if (type == "residual") {
      if (depth > 0) return InvalidArgumentError(at + ": a residual block cannot hold another residual block");
      ASSIGN_OR_RETURN(std::string name, NameFor(layer, at, named_prefix, index_prefix, index));
      ActivationShape body_out, shortcut_out = in;
      ASSIGN_OR_RETURN(auto body, Build(layer.body, in, at + ".body", name + ".", name + ".body.", depth + 1, &body_out));
      std::vector<std::unique_ptr<Layer>> shortcut;
      if (!layer.shortcut.empty()) {
        ASSIGN_OR_RETURN(shortcut, Build(layer.shortcut, in, at + ".shortcut", name + ".", name + ".shortcut.",
                                         depth + 1, &shortcut_out));
      }
      if (body_out.channels != shortcut_out.channels || body_out.height != shortcut_out.height ||
          body_out.width != shortcut_out.width) {
        return InvalidArgumentError(at + ": its body ends at " + Describe(body_out) + " but its shortcut at " +
                                    Describe(shortcut_out) +
                                    (layer.shortcut.empty() ? " (the identity: give a shortcut that matches)" : ""));
      }
      return std::unique_ptr<Layer>(std::make_unique<ResidualLayer>(name, in, std::move(body), std::move(shortcut)));
    }
    return InvalidArgumentError(at + ": unknown layer type; known: conv2d, linear, relu, gelu, tanh, sigmoid, "
                                "max_pool, avg_pool, global_avg_pool, batch_norm, layer_norm, dropout, flatten, "
                                "residual, softmax_cross_entropy (last)");
  }

  const ModelConfig& config_;
  std::set<std::string> names_;
  int total_ = 0;
  uint64_t dropouts_ = 0;
};

// The declared layers of resnet8 (see CreateModel).
std::vector<LayerConfig> ResNet8Layers() {
  auto conv = [](std::string name, int out, int kernel, int stride) {
    LayerConfig c;
    c.type = "conv2d";
    c.name = std::move(name);
    c.out = out;
    c.kernel = kernel;
    c.stride = stride;
    c.padding = kernel / 2;
    c.bias = false;
    return c;
  };
  auto norm = [](std::string name) {
    LayerConfig c;
    c.type = "batch_norm";
    c.name = std::move(name);
    return c;
  };
  LayerConfig relu;
  relu.type = "relu";
  std::vector<LayerConfig> layers = {conv("conv1", 16, 3, 1), norm("bn1"), relu};
  int channels = 16;
  for (int stage = 1; stage <= 3; ++stage) {
    const int out = 16 << (stage - 1);
    const int stride = stage == 1 ? 1 : 2;
    LayerConfig block;
    block.type = "residual";
    block.name = "layer" + std::to_string(stage);
    block.body = {conv("conv1", out, 3, stride), norm("bn1"), relu, conv("conv2", out, 3, 1), norm("bn2")};
    if (stride != 1 || out != channels) block.shortcut = {conv("shortcut.0", out, 1, stride), norm("shortcut.1")};
    layers.push_back(block);
    layers.push_back(relu);
    channels = out;
  }
  LayerConfig pool;
  pool.type = "global_avg_pool";
  LayerConfig fc;
  fc.type = "linear";
  fc.name = "fc";
  layers.push_back(pool);
  layers.push_back(fc);
  return layers;
}

// The layers of `config`, in order. Layers only describe their parameters: nothing is
// allocated here, whatever the widths.
Result<std::vector<std::unique_ptr<Layer>>> BuildLayers(const ModelConfig& config) {
  if (config.channels <= 0 || config.rows <= 0 || config.cols <= 0 || config.classes <= 0) {
    return InvalidArgumentError("model '" + config.name + "': channels, rows, cols and classes must be positive");
  }
  // One sample's values, as a layer's output is bounded: the product in int64 wrapped for
  // dimensions near INT_MAX (65536 x 2^24 x 2^24 is 2^64, taken for 0 values).
  int64_t values = 0;
  if (__builtin_mul_overflow(int64_t{config.channels} * config.rows, int64_t{config.cols}, &values) ||
      values > kMaxActivationValues) {
    return InvalidArgumentError("model '" + config.name + "': an input of " + std::to_string(config.channels) + "x" +
                                std::to_string(config.rows) + "x" + std::to_string(config.cols) + " exceeds " +
                                std::to_string(kMaxActivationValues) + " values per sample");
  }
  const ActivationShape input = InputShape(config);
  std::vector<std::unique_ptr<Layer>> layers;
  auto add = [&layers](std::unique_ptr<Layer> layer) -> ActivationShape {
    layers.push_back(std::move(layer));
    return layers.back()->output_shape();
  };
  if (config.name == "simplecnn") {
    if (config.rows < 16 || config.cols < 16) {
      return InvalidArgumentError("model 'simplecnn' needs images of at least 16x16, got " +
                                  std::to_string(config.rows) + "x" + std::to_string(config.cols));
    }
    ActivationShape shape = add(std::make_unique<Conv2dLayer>("conv1", input, 6, 5));
    shape = add(std::make_unique<ReluLayer>(shape));
    shape = add(std::make_unique<MaxPoolLayer>(shape, 2, 2));
    shape = add(std::make_unique<Conv2dLayer>("conv2", shape, 16, 5));
    shape = add(std::make_unique<ReluLayer>(shape));
    shape = add(std::make_unique<MaxPoolLayer>(shape, 2, 2));
    shape = add(std::make_unique<LinearLayer>("fc1", shape, 120));
    shape = add(std::make_unique<ReluLayer>(shape));
    shape = add(std::make_unique<LinearLayer>("fc2", shape, 84));
    shape = add(std::make_unique<ReluLayer>(shape));
    add(std::make_unique<LinearLayer>("fc3", shape, config.classes));
  } else if (config.name == "mcmahan-cnn") {
    // McMahan et al. 2017 ("Communication-Efficient Learning of Deep Networks from
    // Decentralized Data"): two 5x5 convolutions of 32 and 64 channels, each padded to keep
    // the size and followed by ReLU and a 2x2 max pool, then a 512-unit ReLU layer.
    if (config.rows < 4 || config.cols < 4) {
      return InvalidArgumentError("model 'mcmahan-cnn' needs images of at least 4x4, got " +
                                  std::to_string(config.rows) + "x" + std::to_string(config.cols));
    }
    ActivationShape shape = add(std::make_unique<Conv2dLayer>("conv1", input, 32, 5, 1, 2));
    shape = add(std::make_unique<ReluLayer>(shape));
    shape = add(std::make_unique<MaxPoolLayer>(shape, 2, 2));
    shape = add(std::make_unique<Conv2dLayer>("conv2", shape, 64, 5, 1, 2));
    shape = add(std::make_unique<ReluLayer>(shape));
    shape = add(std::make_unique<MaxPoolLayer>(shape, 2, 2));
    shape = add(std::make_unique<LinearLayer>("fc1", shape, 512));
    shape = add(std::make_unique<ReluLayer>(shape));
    add(std::make_unique<LinearLayer>("fc2", shape, config.classes));
  } else if (config.name == "mlp") {
    ActivationShape shape = input;
    int index = 1;
    for (int width : config.hidden) {
      if (width <= 0) return InvalidArgumentError("model 'mlp': hidden widths must be positive, got " + std::to_string(width));
      shape = add(std::make_unique<LinearLayer>("fc" + std::to_string(index++), shape, width));
      shape = add(std::make_unique<ReluLayer>(shape));
    }
    add(std::make_unique<LinearLayer>("fc" + std::to_string(index), shape, config.classes));
  } else if (config.name == "resnet8" || config.name == "declared") {
    const bool preset = config.name == "resnet8";
    if (preset && (config.rows < 8 || config.cols < 8)) {
      return InvalidArgumentError("model 'resnet8' needs images of at least 8x8, got " + std::to_string(config.rows) +
                                  "x" + std::to_string(config.cols));
    }
    if (preset && !config.layers.empty()) {
      return InvalidArgumentError("model 'resnet8' is a preset: declare layers with model 'declared'");
    }
    ActivationShape output;
    DeclaredBuilder builder(config);
    ASSIGN_OR_RETURN(layers, builder.Build(preset ? ResNet8Layers() : config.layers, input, "model.layers", "",
                                           "layers.", 0, &output));
    if (output.size() != config.classes) {
      return InvalidArgumentError("model.layers: the last layer gives " + std::to_string(output.size()) +
                                  " values per sample; the data has " + std::to_string(config.classes) +
                                  " classes (end with a linear layer of out = " + std::to_string(config.classes) +
                                  " or out unset)");
    }
  } else {
    std::string known;
    for (const std::string& name : KnownModelNames()) known += (known.empty() ? "" : ", ") + name;
    return InvalidArgumentError("unknown model '" + config.name + "'; known models: " + known);
  }

  return layers;
}

}  // namespace

Result<int64_t> CountParameters(const ModelConfig& config, std::vector<std::string>* non_negative) {
  ASSIGN_OR_RETURN(auto layers, BuildLayers(config));
  int64_t total = 0;
  for (const auto& layer : layers) {
    std::vector<ParameterSpec> specs = layer->parameters();
    for (ParameterSpec& buffer : layer->buffers()) specs.push_back(std::move(buffer));
    for (const ParameterSpec& spec : specs) {
      if (non_negative != nullptr && spec.non_negative) non_negative->push_back(spec.name);
      int64_t count = 1;
      for (int64_t dim : spec.shape) {
        if (__builtin_mul_overflow(count, dim, &count)) {
          return InvalidArgumentError("model '" + config.name + "': parameter '" + spec.name + "' has too many values");
        }
      }
      if (__builtin_add_overflow(total, count, &total)) {
        return InvalidArgumentError("model '" + config.name + "': too many parameters to count");
      }
    }
  }
  return total;
}

namespace {

// The model's layers and buffers laid out on `device`, its weights not set yet.
Result<std::unique_ptr<Model>> BuildModel(const ModelConfig& config, Device* device, const char* caller) {
  if (device == nullptr) return InvalidArgumentError(std::string(caller) + ": no device given");
  ASSIGN_OR_RETURN(auto layers, BuildLayers(config));
  return Model::Build(config.name, device, InputShape(config), std::move(layers));
}

}  // namespace

Result<std::unique_ptr<Model>> CreateModelWithState(const ModelConfig& config, Device* device,
                                                    const TensorSet& state) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, BuildModel(config, device, "CreateModelWithState"));
  RETURN_IF_ERROR(model->SetState(state));
  return model;
}

Result<std::unique_ptr<Model>> CreateModel(const ModelConfig& config, Device* device) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, BuildModel(config, device, "CreateModel"));

  // PyTorch defaults: kaiming_uniform(a=sqrt(5)) for weights and uniform(+-1/sqrt(fan_in)) for
  // biases; both reduce to a bound of 1/sqrt(fan_in). Drawn in parameter order, through a
  // host buffer of at most kChunk values (not a second copy of a large model).
  constexpr int64_t kChunk = int64_t{1} << 16;
  std::mt19937_64 engine(config.seed);
  std::vector<float> values(static_cast<size_t>(std::min<int64_t>(kChunk, model->NumParameters())));
  for (const ParameterView& view : model->parameter_views()) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(view.fan_in));
    for (int64_t done = 0; done < view.count; done += kChunk) {
      const int64_t count = std::min(kChunk, view.count - done);
      float* first = values.data();
      switch (view.init) {
        case ParameterInit::kOnes: std::fill(first, first + count, 1.0f); break;
        case ParameterInit::kZeros: std::fill(first, first + count, 0.0f); break;
        case ParameterInit::kFanInUniform:
          for (int64_t j = 0; j < count; ++j) first[j] = UniformFrom(engine, bound);
          break;
      }
      RETURN_IF_ERROR(device->CopyHostToDevice(first, model->flat_parameters(),
                                               static_cast<size_t>(view.offset + done) * sizeof(float),
                                               static_cast<size_t>(count) * sizeof(float)));
    }
  }
  return model;
}

}  // namespace tessera
