#include "core/model/model.h"

#include <cmath>
#include <map>
#include <random>
#include <utility>

namespace tessera {

Model::Model(std::string name, Device* device, ActivationShape input, std::vector<std::unique_ptr<Layer>> layers)
    : name_(std::move(name)), device_(device), input_(input), layers_(std::move(layers)) {
  for (const auto& layer : layers_) {
    for (const ParameterSpec& spec : layer->parameters()) {
      int64_t count = 1;
      for (int64_t dim : spec.shape) count *= dim;
      views_.push_back({spec.name, spec.shape, num_parameters_, count, spec.fan_in});
      num_parameters_ += count;
    }
  }
  outputs_.resize(layers_.size());
  output_gradients_.resize(layers_.size());
}

Result<std::unique_ptr<Model>> Model::Build(std::string name, Device* device, ActivationShape input,
                                            std::vector<std::unique_ptr<Layer>> layers) {
  std::unique_ptr<Model> model(new Model(std::move(name), device, input, std::move(layers)));
  const size_t bytes = static_cast<size_t>(model->num_parameters_) * sizeof(float);
  ASSIGN_OR_RETURN(model->parameters_, device->Allocate(bytes));
  ASSIGN_OR_RETURN(model->gradients_, device->Allocate(bytes));
  device->Fill(model->num_parameters_, 0.0f, model->gradients_.f32());
  int64_t offset = 0;
  for (const auto& layer : model->layers_) {
    layer->Bind(model->parameters_.f32() + offset, model->gradients_.f32() + offset);
    for (const ParameterSpec& spec : layer->parameters()) {
      int64_t count = 1;
      for (int64_t dim : spec.shape) count *= dim;
      offset += count;
    }
  }
  return model;
}

TensorSet Model::GetState() const {
  std::vector<float> flat(num_parameters_);
  Status copied = device_->CopyDeviceToHost(parameters_, 0, flat.data(), flat.size() * sizeof(float));
  (void)copied;  // the range is the buffer itself
  TensorSet state;
  state.reserve(views_.size());
  for (const ParameterView& view : views_) {
    state.push_back({view.name, view.shape,
                     std::vector<float>(flat.begin() + view.offset, flat.begin() + view.offset + view.count)});
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
  for (size_t i = 0; i < views_.size(); ++i) {
    RETURN_IF_ERROR(device_->CopyHostToDevice(state[i].values.data(), parameters_,
                                              views_[i].offset * sizeof(float), state[i].ByteSize()));
  }
  return Status::Ok();
}

Status Model::Reserve(int batch) {
  if (batch <= reserved_batch_) return Status::Ok();
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

std::vector<LayerInfo> Model::DescribeLayers(int batch) const {
  std::vector<LayerInfo> infos;
  std::map<std::string, int> seen;  // per short name, for numbering layers without parameters
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = *layers_[i];
    LayerInfo info;
    info.kind = std::string(layer.kind());
    info.name = layer.name();
    if (info.name.empty()) {
      const std::string short_name = info.kind == "max_pool" ? "pool" : info.kind;
      info.name = short_name + std::to_string(++seen[short_name]);
    }
    info.output = layer.output_shape();
    info.attributes = layer.attributes();
    info.ops = layer.StepOps(batch, i > 0);  // the first layer's input needs no gradient
    infos.push_back(std::move(info));
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

void Model::Backward(const int32_t* labels, float* loss) {
  const size_t last = layers_.size() - 1;
  device_->SoftmaxCrossEntropy(batch_, classes(), outputs_[last].f32(), labels, loss, output_gradients_[last].f32());
  for (size_t i = layers_.size(); i-- > 0;) {
    const float* x = i == 0 ? input_data_ : outputs_[i - 1].f32();
    float* dx = i == 0 ? nullptr : output_gradients_[i - 1].f32();
    layers_[i]->Backward(*device_, batch_, x, outputs_[i].f32(), output_gradients_[i].f32(), dx);
  }
}

namespace {

// Uniform(-bound, bound) from the top 24 bits of a 64-bit draw: the same on every platform.
float UniformFrom(std::mt19937_64& engine, float bound) {
  const float unit = static_cast<float>(engine() >> 40) * (1.0f / 16777216.0f);
  return (2.0f * unit - 1.0f) * bound;
}

}  // namespace

std::vector<std::string> KnownModelNames() { return {"simplecnn", "mlp", "mcmahan-cnn"}; }

ActivationShape InputShape(const ModelConfig& config) { return {config.channels, config.rows, config.cols}; }

namespace {

// The layers of `config`, in order. Layers only describe their parameters: nothing is
// allocated here, whatever the widths.
Result<std::vector<std::unique_ptr<Layer>>> BuildLayers(const ModelConfig& config) {
  if (config.channels <= 0 || config.rows <= 0 || config.cols <= 0 || config.classes <= 0) {
    return InvalidArgumentError("model '" + config.name + "': channels, rows, cols and classes must be positive");
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
  } else {
    std::string known;
    for (const std::string& name : KnownModelNames()) known += (known.empty() ? "" : ", ") + name;
    return InvalidArgumentError("unknown model '" + config.name + "'; known models: " + known);
  }

  return layers;
}

}  // namespace

Result<int64_t> CountParameters(const ModelConfig& config) {
  ASSIGN_OR_RETURN(auto layers, BuildLayers(config));
  int64_t total = 0;
  for (const auto& layer : layers) {
    for (const ParameterSpec& spec : layer->parameters()) {
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

Result<std::unique_ptr<Model>> CreateModel(const ModelConfig& config, Device* device) {
  if (device == nullptr) return InvalidArgumentError("CreateModel: no device given");
  ASSIGN_OR_RETURN(auto layers, BuildLayers(config));
  const ActivationShape input = InputShape(config);
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Build(config.name, device, input, std::move(layers)));

  // PyTorch defaults: kaiming_uniform(a=sqrt(5)) for weights and uniform(+-1/sqrt(fan_in)) for
  // biases; both reduce to a bound of 1/sqrt(fan_in). Drawn in parameter order.
  std::mt19937_64 engine(config.seed);
  std::vector<float> values(model->NumParameters());
  for (const ParameterView& view : model->parameter_views()) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(view.fan_in));
    for (int64_t j = 0; j < view.count; ++j) values[view.offset + j] = UniformFrom(engine, bound);
  }
  RETURN_IF_ERROR(device->CopyHostToDevice(values.data(), model->flat_parameters(), 0, values.size() * sizeof(float)));
  return model;
}

}  // namespace tessera
