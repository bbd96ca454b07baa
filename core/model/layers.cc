#include "core/model/layers.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/model/layer_buffers.h"
#include "device/op_cost.h"

namespace tessera {

using layer_buffers::At;
using layer_buffers::Grow;

Conv2dLayer::Conv2dLayer(std::string name, ActivationShape input, int out_channels, int kernel, int stride,
                         int padding, bool bias, int groups)
    : Layer(input),
      name_(std::move(name)),
      out_channels_(out_channels),
      kernel_(kernel),
      stride_(stride),
      padding_(padding),
      has_bias_(bias),
      groups_(groups) {}

ActivationShape Conv2dLayer::output_shape() const {
  const Conv2dShape shape = ShapeFor(1);
  return {out_channels_, shape.out_height(), shape.out_width()};
}

std::vector<ParameterSpec> Conv2dLayer::parameters() const {
  const int group_in = input_shape().channels / groups_;
  const int64_t fan_in = static_cast<int64_t>(group_in) * kernel_ * kernel_;
  std::vector<ParameterSpec> specs = {{name_ + ".weight", {out_channels_, group_in, kernel_, kernel_}, fan_in}};
  if (has_bias_) specs.push_back({name_ + ".bias", {out_channels_}, fan_in});
  return specs;
}

void Conv2dLayer::Bind(float* parameters, float* gradients) {
  const int64_t weights = static_cast<int64_t>(out_channels_) * (input_shape().channels / groups_) * kernel_ * kernel_;
  weight_ = parameters;
  weight_grad_ = gradients;
  if (has_bias_) {
    bias_ = parameters + weights;
    bias_grad_ = At(gradients, weights);
  }
}

Conv2dShape Conv2dLayer::ShapeFor(int batch) const {
  Conv2dShape shape;
  shape.batch = batch;
  shape.in_channels = input_shape().channels / groups_;
  shape.in_height = input_shape().height;
  shape.in_width = input_shape().width;
  shape.out_channels = out_channels_ / groups_;
  shape.kernel_height = kernel_;
  shape.kernel_width = kernel_;
  shape.stride = stride_;
  shape.padding = padding_;
  return shape;
}

Status Conv2dLayer::Reserve(Device& device, int batch) {
  if (groups_ == 1) return Status::Ok();
  const Conv2dShape shape = ShapeFor(batch);
  const size_t in = static_cast<size_t>(batch) * shape.in_channels * shape.in_height * shape.in_width * sizeof(float);
  const size_t out = static_cast<size_t>(batch) * shape.out_channels * shape.out_height() * shape.out_width() *
                     sizeof(float);
  for (auto [buffer, bytes] : {std::pair<DeviceBuffer*, size_t>{&group_in_, in}, {&group_in_grad_, in},
                               {&group_out_, out}, {&group_out_grad_, out}}) {
    RETURN_IF_ERROR(Grow(device, *buffer, bytes));
  }
  return Status::Ok();
}

void Conv2dLayer::Gather(Device& device, int batch, int g, int channels, int64_t plane, const float* full,
                         float* group) const {
  const int per_group = channels / groups_;
  const int64_t chunk = per_group * plane;
  for (int n = 0; n < batch; ++n) {
    device.Axpby(chunk, 1.0f, full + (static_cast<int64_t>(n) * channels + g * per_group) * plane, 0.0f,
                 group + n * chunk);
  }
}

void Conv2dLayer::Scatter(Device& device, int batch, int g, int channels, int64_t plane, const float* group,
                          float* full) const {
  const int per_group = channels / groups_;
  const int64_t chunk = per_group * plane;
  for (int n = 0; n < batch; ++n) {
    device.Axpby(chunk, 1.0f, group + n * chunk, 0.0f,
                 full + (static_cast<int64_t>(n) * channels + g * per_group) * plane);
  }
}

// One group's strides: an input and an output plane, and its share of the weights.
Conv2dLayer::GroupStrides Conv2dLayer::StridesFor(const Conv2dShape& shape) const {
  return {static_cast<int64_t>(shape.in_height) * shape.in_width,
          static_cast<int64_t>(shape.out_height()) * shape.out_width(),
          static_cast<int64_t>(shape.out_channels) * shape.in_channels * kernel_ * kernel_};
}

void Conv2dLayer::Forward(Device& device, int batch, const float* x, float* y) {
  const Conv2dShape shape = ShapeFor(batch);
  if (groups_ == 1) {
    device.Conv2dForward(shape, x, weight_, bias_, y);
    return;
  }
  const GroupStrides strides = StridesFor(shape);
  for (int g = 0; g < groups_; ++g) {
    Gather(device, batch, g, input_shape().channels, strides.in_plane, x, group_in_.f32());
    device.Conv2dForward(shape, group_in_.f32(), weight_ + g * strides.weights,
                         has_bias_ ? bias_ + g * shape.out_channels : nullptr, group_out_.f32());
    Scatter(device, batch, g, out_channels_, strides.out_plane, group_out_.f32(), y);
  }
}

void Conv2dLayer::Backward(Device& device, int batch, const float* x, const float* y, const float* dy,
                           float* dx) {
  const Conv2dShape shape = ShapeFor(batch);
  if (groups_ == 1) {
    device.Conv2dBackwardFilter(shape, x, dy, weight_grad_, bias_grad_);
    if (dx != nullptr) device.Conv2dBackwardData(shape, dy, weight_, dx);
    return;
  }
  const GroupStrides strides = StridesFor(shape);
  for (int g = 0; g < groups_; ++g) {
    Gather(device, batch, g, input_shape().channels, strides.in_plane, x, group_in_.f32());
    Gather(device, batch, g, out_channels_, strides.out_plane, dy, group_out_grad_.f32());
    device.Conv2dBackwardFilter(shape, group_in_.f32(), group_out_grad_.f32(), weight_grad_ + g * strides.weights,
                                has_bias_ ? bias_grad_ + g * shape.out_channels : nullptr);
    if (dx != nullptr) {
      device.Conv2dBackwardData(shape, group_out_grad_.f32(), weight_ + g * strides.weights, group_in_grad_.f32());
      Scatter(device, batch, g, input_shape().channels, strides.in_plane, group_in_grad_.f32(), dx);
    }
  }
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
  bias_grad_ = At(gradients, weights);
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

int64_t LinearLayer::PieceRows() const {
  const int64_t in = std::max<int64_t>(input_shape().size(), 1);
  return std::max(kPieceRowAlign, kPieceValues / in / kPieceRowAlign * kPieceRowAlign);
}

bool LinearLayer::CutsPieces() const {
  return static_cast<int64_t>(out_features_) * input_shape().size() >= kPieceAboveValues &&
         out_features_ > PieceRows();
}

int64_t LinearLayer::PieceScratch(int batch) const {
  if (!CutsPieces()) return 0;
  const int64_t rows = PieceRows();
  return std::max<int64_t>(out_features_, rows * input_shape().size() + static_cast<int64_t>(batch) * rows);
}

bool LinearLayer::BackwardInPieces(Device& device, int batch, const float* x, const float* y, const float* dy,
                                   float* dx, float* scratch, const GradientPiece& piece) {
  if (!CutsPieces()) return false;
  const int in = static_cast<int>(input_shape().size());
  const int64_t weights = static_cast<int64_t>(out_features_) * in;
  // dx reads the weights: it comes before any piece may change them.
  if (dx != nullptr) device.Gemm(false, false, batch, in, out_features_, 1.0f, dy, weight_, 0.0f, dx);
  device.BiasGrad(batch, out_features_, 1, dy, scratch);
  piece(weights, out_features_, scratch);
  const int rows_per_piece = static_cast<int>(PieceRows());
  float* rows_dy = scratch + static_cast<int64_t>(rows_per_piece) * in;  // [batch x rows]
  for (int first = 0; first < out_features_; first += rows_per_piece) {
    const int rows = std::min(rows_per_piece, out_features_ - first);
    for (int n = 0; n < batch; ++n) {
      device.Axpby(rows, 1.0f, dy + static_cast<int64_t>(n) * out_features_ + first, 0.0f,
                   rows_dy + static_cast<int64_t>(n) * rows);
    }
    device.Gemm(true, false, rows, in, batch, 1.0f, rows_dy, x, 0.0f, scratch);
    piece(static_cast<int64_t>(first) * in, static_cast<int64_t>(rows) * in, scratch);
  }
  return true;
}

void ReluLayer::Forward(Device& device, int batch, const float* x, float* y) {
  device.Relu(batch * input_shape().size(), x, y);
}

void ReluLayer::Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) {
  if (dx != nullptr) device.ReluBackward(batch * input_shape().size(), y, dy, dx);
}

ActivationShape PooledShape(const ActivationShape& input, int window, int stride) {
  return {input.channels, (input.height - window) / stride + 1, (input.width - window) / stride + 1};
}

MaxPoolShape PoolShapeFor(const ActivationShape& input, int batch, int window, int stride) {
  MaxPoolShape shape;
  shape.batch = batch;
  shape.channels = input.channels;
  shape.in_height = input.height;
  shape.in_width = input.width;
  shape.window = window;
  shape.stride = stride;
  return shape;
}

MaxPoolLayer::MaxPoolLayer(ActivationShape input, int window, int stride)
    : Layer(input), window_(window), stride_(stride) {}

ActivationShape MaxPoolLayer::output_shape() const { return PooledShape(input_shape(), window_, stride_); }

std::vector<std::pair<std::string, int>> MaxPoolLayer::attributes() const {
  const MaxPoolShape shape = ShapeFor(1);
  return {{"window", shape.window}, {"stride", shape.stride}};
}

MaxPoolShape MaxPoolLayer::ShapeFor(int batch) const {
  return PoolShapeFor(input_shape(), batch, window_, stride_);
}

Status MaxPoolLayer::Reserve(Device& device, int batch) {
  return Grow(device, argmax_, static_cast<size_t>(batch) * output_shape().size() * sizeof(int32_t));
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
  std::vector<LayerOp> ops;
  // Per group: the convolution and, for groups > 1, one copy per sample in and out.
  const int64_t in_chunk = static_cast<int64_t>(shape.in_channels) * shape.in_height * shape.in_width;
  const int64_t out_chunk = static_cast<int64_t>(shape.out_channels) * shape.out_height() * shape.out_width();
  auto copies = [&](int64_t chunk, bool backward) {
    if (groups_ == 1) return;
    for (int n = 0; n < batch; ++n) ops.push_back({Op::kAxpby, AxpbyCost(chunk, false), backward});
  };
  for (int g = 0; g < groups_; ++g) {
    copies(in_chunk, false);
    ops.push_back({Op::kConv2dForward, Conv2dForwardCost(shape, has_bias_), false});
    copies(out_chunk, false);
  }
  for (int g = 0; g < groups_; ++g) {
    copies(in_chunk, true);
    copies(out_chunk, true);
    ops.push_back({Op::kConv2dBackwardFilter, Conv2dBackwardFilterCost(shape, has_bias_), true});
    if (input_gradient) {
      ops.push_back({Op::kConv2dBackwardData, Conv2dBackwardDataCost(shape), true});
      copies(in_chunk, true);
    }
  }
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
