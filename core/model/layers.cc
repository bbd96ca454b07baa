#include "core/model/layers.h"

#include <utility>

#include "device/op_cost.h"

namespace tessera {

Conv2dLayer::Conv2dLayer(std::string name, ActivationShape input, int out_channels, int kernel, int stride,
                         int padding)
    : Layer(input),
      name_(std::move(name)),
      out_channels_(out_channels),
      kernel_(kernel),
      stride_(stride),
      padding_(padding) {}

ActivationShape Conv2dLayer::output_shape() const {
  const Conv2dShape shape = ShapeFor(1);
  return {out_channels_, shape.out_height(), shape.out_width()};
}

std::vector<ParameterSpec> Conv2dLayer::parameters() const {
  const int64_t fan_in = static_cast<int64_t>(input_shape().channels) * kernel_ * kernel_;
  return {{name_ + ".weight", {out_channels_, input_shape().channels, kernel_, kernel_}, fan_in},
          {name_ + ".bias", {out_channels_}, fan_in}};
}

void Conv2dLayer::Bind(float* parameters, float* gradients) {
  const int64_t weights = static_cast<int64_t>(out_channels_) * input_shape().channels * kernel_ * kernel_;
  weight_ = parameters;
  bias_ = parameters + weights;
  weight_grad_ = gradients;
  bias_grad_ = gradients + weights;
}

Conv2dShape Conv2dLayer::ShapeFor(int batch) const {
  Conv2dShape shape;
  shape.batch = batch;
  shape.in_channels = input_shape().channels;
  shape.in_height = input_shape().height;
  shape.in_width = input_shape().width;
  shape.out_channels = out_channels_;
  shape.kernel_height = kernel_;
  shape.kernel_width = kernel_;
  shape.stride = stride_;
  shape.padding = padding_;
  return shape;
}

void Conv2dLayer::Forward(Device& device, int batch, const float* x, float* y) {
  device.Conv2dForward(ShapeFor(batch), x, weight_, bias_, y);
}

void Conv2dLayer::Backward(Device& device, int batch, const float* x, const float* y, const float* dy,
                           float* dx) {
  const Conv2dShape shape = ShapeFor(batch);
  device.Conv2dBackwardFilter(shape, x, dy, weight_grad_, bias_grad_);
  if (dx != nullptr) device.Conv2dBackwardData(shape, dy, weight_, dx);
}

LinearLayer::LinearLayer(std::string name, ActivationShape input, int out_features)
    : Layer(input), name_(std::move(name)), out_features_(out_features) {}

std::vector<ParameterSpec> LinearLayer::parameters() const {
  const int64_t in = input_shape().size();
  return {{name_ + ".weight", {out_features_, in}, in}, {name_ + ".bias", {out_features_}, in}};
}

void LinearLayer::Bind(float* parameters, float* gradients) {
  const int64_t weights = out_features_ * input_shape().size();
  weight_ = parameters;
  bias_ = parameters + weights;
  weight_grad_ = gradients;
  bias_grad_ = gradients + weights;
}

void LinearLayer::Forward(Device& device, int batch, const float* x, float* y) {
  const int in = static_cast<int>(input_shape().size());
  device.Gemm(false, true, batch, out_features_, in, 1.0f, x, weight_, 0.0f, y);
  device.BiasAdd(batch, out_features_, 1, bias_, y);
}

void LinearLayer::Backward(Device& device, int batch, const float* x, const float* y, const float* dy,
                           float* dx) {
  const int in = static_cast<int>(input_shape().size());
  device.Gemm(true, false, out_features_, in, batch, 1.0f, dy, x, 0.0f, weight_grad_);
  device.BiasGrad(batch, out_features_, 1, dy, bias_grad_);
  if (dx != nullptr) device.Gemm(false, false, batch, in, out_features_, 1.0f, dy, weight_, 0.0f, dx);
}

void ReluLayer::Forward(Device& device, int batch, const float* x, float* y) {
  device.Relu(batch * input_shape().size(), x, y);
}

void ReluLayer::Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) {
  if (dx != nullptr) device.ReluBackward(batch * input_shape().size(), y, dy, dx);
}

MaxPoolLayer::MaxPoolLayer(ActivationShape input, int window, int stride)
    : Layer(input), window_(window), stride_(stride) {}

ActivationShape MaxPoolLayer::output_shape() const {
  return {input_shape().channels, (input_shape().height - window_) / stride_ + 1,
          (input_shape().width - window_) / stride_ + 1};
}

std::vector<std::pair<std::string, int>> MaxPoolLayer::attributes() const {
  const MaxPoolShape shape = ShapeFor(1);
  return {{"window", shape.window}, {"stride", shape.stride}};
}

MaxPoolShape MaxPoolLayer::ShapeFor(int batch) const {
  MaxPoolShape shape;
  shape.batch = batch;
  shape.channels = input_shape().channels;
  shape.in_height = input_shape().height;
  shape.in_width = input_shape().width;
  shape.window = window_;
  shape.stride = stride_;
  return shape;
}

Status MaxPoolLayer::Reserve(Device& device, int batch) {
  const size_t bytes = static_cast<size_t>(batch) * output_shape().size() * sizeof(int32_t);
  if (argmax_.bytes() >= bytes) return Status::Ok();
  argmax_.Reset();
  ASSIGN_OR_RETURN(argmax_, device.Allocate(bytes));
  return Status::Ok();
}

void MaxPoolLayer::Forward(Device& device, int batch, const float* x, float* y) {
  device.MaxPool(ShapeFor(batch), x, y, argmax_.i32());
}

void MaxPoolLayer::Backward(Device& device, int batch, const float* x, const float* y, const float* dy,
                            float* dx) {
  if (dx != nullptr) device.MaxPoolBackward(ShapeFor(batch), dy, argmax_.i32(), dx);
}


// ---- The ops each layer issues per training step (mirrors Forward and Backward above) ----

std::vector<LayerOp> Conv2dLayer::StepOps(int batch, bool input_gradient) const {
  const Conv2dShape shape = ShapeFor(batch);
  std::vector<LayerOp> ops = {{Op::kConv2dForward, Conv2dForwardCost(shape, true), false},
                              {Op::kConv2dBackwardFilter, Conv2dBackwardFilterCost(shape, true), true}};
  if (input_gradient) ops.push_back({Op::kConv2dBackwardData, Conv2dBackwardDataCost(shape), true});
  return ops;
}

std::vector<LayerOp> LinearLayer::StepOps(int batch, bool input_gradient) const {
  const int in = static_cast<int>(input_shape().size());
  std::vector<LayerOp> ops = {{Op::kGemm, GemmCost(batch, out_features_, in, false), false},
                              {Op::kBiasAdd, BiasAddCost(batch, out_features_, 1), false},
                              {Op::kGemm, GemmCost(out_features_, in, batch, false), true},
                              {Op::kBiasGrad, BiasGradCost(batch, out_features_, 1), true}};
  if (input_gradient) ops.push_back({Op::kGemm, GemmCost(batch, in, out_features_, false), true});
  return ops;
}

std::vector<LayerOp> ReluLayer::StepOps(int batch, bool input_gradient) const {
  const int64_t count = batch * input_shape().size();
  std::vector<LayerOp> ops = {{Op::kRelu, ReluCost(count), false}};
  if (input_gradient) ops.push_back({Op::kReluBackward, ReluBackwardCost(count), true});
  return ops;
}

std::vector<LayerOp> MaxPoolLayer::StepOps(int batch, bool input_gradient) const {
  const MaxPoolShape shape = ShapeFor(batch);
  std::vector<LayerOp> ops = {{Op::kMaxPool, MaxPoolCost(shape), false}};
  if (input_gradient) ops.push_back({Op::kMaxPoolBackward, MaxPoolBackwardCost(shape), true});
  return ops;
}

}  // namespace tessera
