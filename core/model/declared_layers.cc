// The layers of declared models beyond the fully connected and convolutional ones
// (core/model/layers.cc): activations, pools, norms, dropout, flatten and residual blocks.
#include "core/model/layers.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <utility>

#include "core/model/layer_buffers.h"
#include "device/op_cost.h"

namespace tessera {

using layer_buffers::At;
using layer_buffers::Grow;

void ActivationLayer::Forward(Device& device, int batch, const float* x, float* y) {
  device.Activation(function_, batch * input_shape().size(), x, y);
}

void ActivationLayer::Backward(Device& device, int batch, const float* x, const float* y, const float* dy,
                               float* dx) {
  if (dx != nullptr) device.ActivationBackward(function_, batch * input_shape().size(), x, y, dy, dx);
}

std::vector<LayerOp> ActivationLayer::StepOps(int batch, bool input_gradient) const {
  const int64_t count = batch * input_shape().size();
  std::vector<LayerOp> ops = {{Op::kActivation, ActivationCost(function_, count), false}};
  if (input_gradient) ops.push_back({Op::kActivationBackward, ActivationBackwardCost(function_, count), true});
  return ops;
}

AvgPoolLayer::AvgPoolLayer(ActivationShape input, int window, int stride)
    : Layer(input), window_(window), stride_(stride) {}

ActivationShape AvgPoolLayer::output_shape() const { return PooledShape(input_shape(), window_, stride_); }

std::vector<std::pair<std::string, int>> AvgPoolLayer::attributes() const {
  return {{"window", window_}, {"stride", stride_}};
}

MaxPoolShape AvgPoolLayer::ShapeFor(int batch) const {
  return PoolShapeFor(input_shape(), batch, window_, stride_);
}

void AvgPoolLayer::Forward(Device& device, int batch, const float* x, float* y) {
  device.AvgPool(ShapeFor(batch), x, y);
}

void AvgPoolLayer::Backward(Device& device, int batch, const float* x, const float* y, const float* dy,
                            float* dx) {
  if (dx != nullptr) device.AvgPoolBackward(ShapeFor(batch), dy, dx);
}

std::vector<LayerOp> AvgPoolLayer::StepOps(int batch, bool input_gradient) const {
  const MaxPoolShape shape = ShapeFor(batch);
  std::vector<LayerOp> ops = {{Op::kAvgPool, AvgPoolCost(shape), false}};
  if (input_gradient) ops.push_back({Op::kAvgPoolBackward, AvgPoolBackwardCost(shape), true});
  return ops;
}

Status GlobalAvgPoolLayer::Reserve(Device& device, int batch) {
  if (!averaging_.empty()) return Status::Ok();
  const int64_t plane = static_cast<int64_t>(input_shape().height) * input_shape().width;
  ASSIGN_OR_RETURN(averaging_, device.Allocate(static_cast<size_t>(plane) * sizeof(float)));
  device.Fill(plane, 1.0f / static_cast<float>(plane), averaging_.f32());
  return Status::Ok();
}

int GlobalAvgPoolLayer::SamplesPerGemm(int batch) const {
  return static_cast<int>(std::min<int64_t>(batch, INT_MAX / input_shape().channels));
}

// y [batch C, 1] = x [batch C, H W] * (1 / (H W)) [H W, 1], in as few Gemms as keep their
// batch C rows within int (one unless the channels are many).
void GlobalAvgPoolLayer::Forward(Device& device, int batch, const float* x, float* y) {
  const int channels = input_shape().channels;
  const int plane = input_shape().height * input_shape().width;
  const int per_gemm = SamplesPerGemm(batch);
  for (int first = 0; first < batch; first += per_gemm) {
    const int64_t rows = static_cast<int64_t>(first) * channels;
    device.Gemm(false, false, std::min(per_gemm, batch - first) * channels, 1, plane, 1.0f, x + rows * plane,
                averaging_.f32(), 0.0f, y + rows);
  }
}

// dx [batch C, H W] = dy [batch C, 1] * (1 / (H W)) [1, H W].
void GlobalAvgPoolLayer::Backward(Device& device, int batch, const float* x, const float* y, const float* dy,
                                  float* dx) {
  if (dx == nullptr) return;
  const int channels = input_shape().channels;
  const int plane = input_shape().height * input_shape().width;
  const int per_gemm = SamplesPerGemm(batch);
  for (int first = 0; first < batch; first += per_gemm) {
    const int64_t rows = static_cast<int64_t>(first) * channels;
    device.Gemm(false, false, std::min(per_gemm, batch - first) * channels, plane, 1, 1.0f, dy + rows,
                averaging_.f32(), 0.0f, dx + rows * plane);
  }
}

std::vector<LayerOp> GlobalAvgPoolLayer::StepOps(int batch, bool input_gradient) const {
  const int channels = input_shape().channels;
  const int plane = input_shape().height * input_shape().width;
  const int per_gemm = SamplesPerGemm(batch);
  std::vector<LayerOp> forward, backward;
  for (int first = 0; first < batch; first += per_gemm) {
    const int rows = std::min(per_gemm, batch - first) * channels;
    forward.push_back({Op::kGemm, GemmCost(rows, 1, plane, false), false});
    if (input_gradient) backward.push_back({Op::kGemm, GemmCost(rows, plane, 1, false), true});
  }
  forward.insert(forward.end(), backward.begin(), backward.end());
  return forward;
}

BatchNormLayer::BatchNormLayer(std::string name, ActivationShape input, float epsilon, float momentum, bool local)
    : Layer(input), name_(std::move(name)), epsilon_(epsilon), momentum_(momentum), local_(local) {}

std::vector<std::pair<std::string, int>> BatchNormLayer::attributes() const {
  return {{"epsilon_bits", std::bit_cast<int>(epsilon_)}};
}

BatchNormShape BatchNormLayer::ShapeFor(int batch) const {
  return {batch, input_shape().channels, static_cast<int64_t>(input_shape().height) * input_shape().width};
}

std::vector<ParameterSpec> BatchNormLayer::parameters() const {
  const int64_t c = input_shape().channels;
  return {{name_ + ".weight", {c}, 1, ParameterInit::kOnes, local_},
          {name_ + ".bias", {c}, 1, ParameterInit::kZeros, local_}};
}

std::vector<ParameterSpec> BatchNormLayer::buffers() const {
  const int64_t c = input_shape().channels;
  return {{name_ + ".running_mean", {c}, 1, ParameterInit::kZeros, local_},
          {name_ + ".running_var", {c}, 1, ParameterInit::kOnes, local_, /*non_negative=*/true}};
}

void BatchNormLayer::Bind(float* parameters, float* gradients) {
  const int c = input_shape().channels;
  gamma_ = parameters;
  beta_ = parameters + c;
  gamma_grad_ = gradients;
  beta_grad_ = At(gradients, c);
}

void BatchNormLayer::BindBuffers(float* buffers) { running_ = buffers; }

Status BatchNormLayer::Reserve(Device& device, int batch) {
  return Grow(device, saved_, 2 * static_cast<size_t>(input_shape().channels) * sizeof(float));
}

void BatchNormLayer::Forward(Device& device, int batch, const float* x, float* y) {
  const int c = input_shape().channels;
  device.BatchNormForward(ShapeFor(batch), training(), momentum_, epsilon_, x, gamma_, beta_, running_,
                          running_ + c, saved_.f32(), saved_.f32() + c, y);
}

void BatchNormLayer::Backward(Device& device, int batch, const float* x, const float* y, const float* dy,
                              float* dx) {
  const int c = input_shape().channels;
  device.BatchNormBackward(ShapeFor(batch), x, dy, gamma_, saved_.f32(), saved_.f32() + c, dx, gamma_grad_,
                           beta_grad_);
}

std::vector<LayerOp> BatchNormLayer::StepOps(int batch, bool input_gradient) const {
  const BatchNormShape shape = ShapeFor(batch);
  return {{Op::kBatchNormForward, BatchNormForwardCost(shape, true), false},
          {Op::kBatchNormBackward, BatchNormBackwardCost(shape, input_gradient), true}};
}

LayerNormLayer::LayerNormLayer(std::string name, ActivationShape input, float epsilon)
    : Layer(input), name_(std::move(name)), epsilon_(epsilon) {}

std::vector<std::pair<std::string, int>> LayerNormLayer::attributes() const {
  return {{"epsilon_bits", std::bit_cast<int>(epsilon_)}};
}

std::vector<ParameterSpec> LayerNormLayer::parameters() const {
  const ActivationShape& in = input_shape();
  std::vector<int64_t> shape = {in.size()};
  if (in.height != 1 || in.width != 1) shape = {in.channels, in.height, in.width};
  return {{name_ + ".weight", shape, 1, ParameterInit::kOnes}, {name_ + ".bias", shape, 1, ParameterInit::kZeros}};
}

void LayerNormLayer::Bind(float* parameters, float* gradients) {
  const int64_t size = input_shape().size();
  gamma_ = parameters;
  beta_ = parameters + size;
  gamma_grad_ = gradients;
  beta_grad_ = At(gradients, size);
}

Status LayerNormLayer::Reserve(Device& device, int batch) {
  return Grow(device, saved_, 2 * static_cast<size_t>(batch) * sizeof(float));
}

void LayerNormLayer::Forward(Device& device, int batch, const float* x, float* y) {
  device.LayerNormForward(batch, static_cast<int>(input_shape().size()), epsilon_, x, gamma_, beta_, saved_.f32(),
                          saved_.f32() + batch, y);
}

void LayerNormLayer::Backward(Device& device, int batch, const float* x, const float* y, const float* dy,
                              float* dx) {
  device.LayerNormBackward(batch, static_cast<int>(input_shape().size()), x, dy, gamma_, saved_.f32(),
                           saved_.f32() + batch, dx, gamma_grad_, beta_grad_);
}

std::vector<LayerOp> LayerNormLayer::StepOps(int batch, bool input_gradient) const {
  const int columns = static_cast<int>(input_shape().size());
  return {{Op::kLayerNormForward, LayerNormForwardCost(batch, columns), false},
          {Op::kLayerNormBackward, LayerNormBackwardCost(batch, columns, input_gradient), true}};
}

DropoutLayer::DropoutLayer(ActivationShape input, float probability, uint64_t seed)
    : Layer(input), probability_(probability), seed_(seed) {}

Status DropoutLayer::Reserve(Device& device, int batch) {
  return Grow(device, mask_, static_cast<size_t>(batch) * input_shape().size() * sizeof(float));
}

void DropoutLayer::SkipStep() {
  if (training() && probability_ > 0.0f) ++step_;
}

void DropoutLayer::Forward(Device& device, int batch, const float* x, float* y) {
  const int64_t count = batch * input_shape().size();
  masked_ = training() && probability_ > 0.0f;
  if (masked_) {
    // A fresh draw per step; the step counter makes a resumed run draw what it would have.
    uint64_t step_seed = seed_ ^ ((step_++ + 1) * 0xD1B54A32D192ED03ull);
    // Element i's draw mixes seed + (i + 1) * 0x9E3779B97F4A7C15 (DropoutUniform): moving the
    // seed by the slice's first element times that constant draws the whole batch's elements
    // from there on.
    step_seed += static_cast<uint64_t>(first_sample_) * static_cast<uint64_t>(input_shape().size()) *
                 0x9E3779B97F4A7C15ull;
    device.Dropout(count, probability_, step_seed, x, y, mask_.f32());
  } else {
    device.Axpby(count, 1.0f, x, 0.0f, y);
  }
}

void DropoutLayer::Backward(Device& device, int batch, const float* x, const float* y, const float* dy,
                            float* dx) {
  if (dx == nullptr) return;
  const int64_t count = batch * input_shape().size();
  if (masked_) {
    device.DropoutBackward(count, mask_.f32(), dy, dx);
  } else {
    device.Axpby(count, 1.0f, dy, 0.0f, dx);
  }
}

std::vector<LayerOp> DropoutLayer::StepOps(int batch, bool input_gradient) const {
  const int64_t count = batch * input_shape().size();
  std::vector<LayerOp> ops = {{Op::kDropout, DropoutCost(count), false}};
  if (input_gradient) ops.push_back({Op::kDropoutBackward, DropoutBackwardCost(count), true});
  return ops;
}

void FlattenLayer::Forward(Device& device, int batch, const float* x, float* y) {
  device.Axpby(batch * input_shape().size(), 1.0f, x, 0.0f, y);
}

void FlattenLayer::Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) {
  if (dx != nullptr) device.Axpby(batch * input_shape().size(), 1.0f, dy, 0.0f, dx);
}

std::vector<LayerOp> FlattenLayer::StepOps(int batch, bool input_gradient) const {
  const int64_t count = batch * input_shape().size();
  std::vector<LayerOp> ops = {{Op::kAxpby, AxpbyCost(count, false), false}};
  if (input_gradient) ops.push_back({Op::kAxpby, AxpbyCost(count, false), true});
  return ops;
}

ResidualLayer::ResidualLayer(std::string name, ActivationShape input, std::vector<std::unique_ptr<Layer>> body,
                             std::vector<std::unique_ptr<Layer>> shortcut)
    : Layer(input), name_(std::move(name)) {
  body_path_.layers = std::move(body);
  shortcut_path_.layers = std::move(shortcut);
}

std::vector<std::vector<const Layer*>> ResidualLayer::paths() const {
  std::vector<std::vector<const Layer*>> paths(2);
  for (const auto& layer : body_path_.layers) paths[0].push_back(layer.get());
  for (const auto& layer : shortcut_path_.layers) paths[1].push_back(layer.get());
  return paths;
}

namespace {

// The specs of every layer of both paths, in order: their parameters or their buffers.
std::vector<ParameterSpec> PathSpecs(const std::vector<std::unique_ptr<Layer>>& body,
                                     const std::vector<std::unique_ptr<Layer>>& shortcut, bool buffers) {
  std::vector<ParameterSpec> specs;
  for (const auto* path : {&body, &shortcut}) {
    for (const auto& layer : *path) {
      for (ParameterSpec& spec : buffers ? layer->buffers() : layer->parameters()) specs.push_back(std::move(spec));
    }
  }
  return specs;
}

}  // namespace

std::vector<ParameterSpec> ResidualLayer::parameters() const {
  return PathSpecs(body_path_.layers, shortcut_path_.layers, false);
}

std::vector<ParameterSpec> ResidualLayer::buffers() const {
  return PathSpecs(body_path_.layers, shortcut_path_.layers, true);
}

void ResidualLayer::Bind(float* parameters, float* gradients) {
  int64_t offset = 0;
  for (Path* path : {&body_path_, &shortcut_path_}) {
    for (auto& layer : path->layers) {
      layer->Bind(parameters + offset, At(gradients, offset));
      for (const ParameterSpec& spec : layer->parameters()) offset += spec.Count();
    }
  }
}

void ResidualLayer::BindBuffers(float* buffers) {
  int64_t offset = 0;
  for (Path* path : {&body_path_, &shortcut_path_}) {
    for (auto& layer : path->layers) {
      layer->BindBuffers(buffers + offset);
      for (const ParameterSpec& spec : layer->buffers()) offset += spec.Count();
    }
  }
}

void ResidualLayer::set_training(bool training) {
  Layer::set_training(training);
  for (Path* path : {&body_path_, &shortcut_path_}) {
    for (auto& layer : path->layers) layer->set_training(training);
  }
}

void ResidualLayer::set_batch_slice(int64_t first_sample) {
  for (Path* path : {&body_path_, &shortcut_path_}) {
    for (auto& layer : path->layers) layer->set_batch_slice(first_sample);
  }
}

void ResidualLayer::SkipStep() {
  for (Path* path : {&body_path_, &shortcut_path_}) {
    for (auto& layer : path->layers) layer->SkipStep();
  }
}

Status ResidualLayer::ReservePath(Device& device, Path& path, int batch) {
  path.outputs.resize(path.layers.size());
  path.gradients.resize(path.layers.size());
  for (size_t i = 0; i < path.layers.size(); ++i) {
    const size_t bytes = static_cast<size_t>(batch) * path.layers[i]->output_shape().size() * sizeof(float);
    RETURN_IF_ERROR(Grow(device, path.outputs[i], bytes));
    RETURN_IF_ERROR(Grow(device, path.gradients[i], bytes));
    RETURN_IF_ERROR(path.layers[i]->Reserve(device, batch));
  }
  return Status::Ok();
}

Status ResidualLayer::Reserve(Device& device, int batch) {
  if (batch <= reserved_) return Status::Ok();
  // Nothing counts as reserved until every buffer is (Model::Reserve): a Grow that fails
  // leaves its buffer released.
  reserved_ = 0;
  RETURN_IF_ERROR(ReservePath(device, body_path_, batch));
  RETURN_IF_ERROR(ReservePath(device, shortcut_path_, batch));
  RETURN_IF_ERROR(Grow(device, shortcut_dx_, static_cast<size_t>(batch) * input_shape().size() * sizeof(float)));
  reserved_ = batch;
  return Status::Ok();
}

void ResidualLayer::ForwardPath(Device& device, Path& path, int batch, const float* x) {
  for (size_t i = 0; i < path.layers.size(); ++i) {
    path.layers[i]->Forward(device, batch, x, path.outputs[i].f32());
    x = path.outputs[i].f32();
  }
}

void ResidualLayer::BackwardPath(Device& device, Path& path, int batch, const float* x, const float* dy, float* dx) {
  for (size_t i = path.layers.size(); i-- > 0;) {
    const float* in = i == 0 ? x : path.outputs[i - 1].f32();
    float* din = i == 0 ? dx : path.gradients[i - 1].f32();
    const float* dout = i + 1 == path.layers.size() ? dy : path.gradients[i].f32();
    path.layers[i]->Backward(device, batch, in, path.outputs[i].f32(), dout, din);
  }
}

void ResidualLayer::Forward(Device& device, int batch, const float* x, float* y) {
  const int64_t count = batch * output_shape().size();
  ForwardPath(device, body_path_, batch, x);
  device.Axpby(count, 1.0f, body_path_.outputs.back().f32(), 0.0f, y);
  if (shortcut_path_.layers.empty()) {
    device.Axpby(count, 1.0f, x, 1.0f, y);
  } else {
    ForwardPath(device, shortcut_path_, batch, x);
    device.Axpby(count, 1.0f, shortcut_path_.outputs.back().f32(), 1.0f, y);
  }
}

void ResidualLayer::Backward(Device& device, int batch, const float* x, const float* y, const float* dy,
                             float* dx) {
  // Both paths see dy; their input gradients add up in dx.
  BackwardPath(device, body_path_, batch, x, dy, dx);
  const int64_t in_count = batch * input_shape().size();
  if (shortcut_path_.layers.empty()) {
    if (dx != nullptr) device.Axpby(in_count, 1.0f, dy, 1.0f, dx);
  } else {
    BackwardPath(device, shortcut_path_, batch, x, dy, dx == nullptr ? nullptr : shortcut_dx_.f32());
    if (dx != nullptr) device.Axpby(in_count, 1.0f, shortcut_dx_.f32(), 1.0f, dx);
  }
}

std::vector<LayerOp> ResidualLayer::StepOps(int batch, bool input_gradient) const {
  const int64_t count = batch * output_shape().size();
  std::vector<LayerOp> forward, backward;
  auto split = [&](const Path& path) {
    for (size_t i = 0; i < path.layers.size(); ++i) {
      for (const LayerOp& op : path.layers[i]->StepOps(batch, i > 0 || input_gradient)) {
        (op.backward ? backward : forward).push_back(op);
      }
    }
  };
  split(body_path_);
  forward.push_back({Op::kAxpby, AxpbyCost(count, false), false});
  split(shortcut_path_);
  forward.push_back({Op::kAxpby, AxpbyCost(count, true), false});
  if (input_gradient) backward.push_back({Op::kAxpby, AxpbyCost(count, true), true});
  forward.insert(forward.end(), backward.begin(), backward.end());
  return forward;
}

}  // namespace tessera
