// The layers models are built from. Each computes only through a Device and sees its
// parameters as views into the model's flat parameter and gradient buffers.
//
// Shapes are per sample, NCHW without the batch dimension; a fully connected layer reads its
// input flattened. A layer is used by one thread at a time (its model's).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "device/device.h"
#include "device/placement.h"

namespace tessera {

struct ActivationShape {
  int channels = 1, height = 1, width = 1;
  int64_t size() const { return static_cast<int64_t>(channels) * height * width; }
};

struct ParameterSpec {
  std::string name;             // full name: "conv1.weight"
  std::vector<int64_t> shape;   // PyTorch's layout: conv [out, in, kh, kw], linear [out, in]
  int64_t fan_in = 1;           // for PyTorch-default initialisation: uniform(+-1/sqrt(fan_in))
};

// One op a layer issues in a training step, with the work it does at a given batch
// (device/op_cost.h's figures).
struct LayerOp {
  Op op;
  OpCost cost;
  bool backward = false;  // issued by Backward (false: by Forward)
};

class Layer {
 public:
  explicit Layer(ActivationShape input) : input_(input) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const ActivationShape& input_shape() const { return input_; }
  virtual ActivationShape output_shape() const = 0;
  // What the layer computes: "conv2d", "linear", "relu", "max_pool".
  virtual std::string_view kind() const = 0;
  // The parameter prefix ("conv1"); empty for layers without parameters.
  virtual std::string name() const { return ""; }
  // The settings that define what it computes besides its shapes, by name: a convolution's
  // "kernel", "stride", "padding"; a pool's "window", "stride". For exporters (ONNX).
  virtual std::vector<std::pair<std::string, int>> attributes() const { return {}; }
  // The ops Forward and then Backward issue for `batch` samples, in issue order, with their
  // costs; `input_gradient` says whether Backward also computes dx (false for the first layer).
  virtual std::vector<LayerOp> StepOps(int batch, bool input_gradient) const = 0;
  // The parameters, in the order they lie in the flat buffers.
  virtual std::vector<ParameterSpec> parameters() const { return {}; }
  // Points the layer at its parameters and their gradients (device addresses, laid out as
  // parameters() says). Called once the model has allocated its flat buffers.
  virtual void Bind(float* parameters, float* gradients) {}
  // Makes room for batches of up to `batch` samples (layer-private device state, such as a
  // max pool's argmax). Allocates only when `batch` exceeds what was reserved before.
  virtual Status Reserve(Device& device, int batch) { return Status::Ok(); }

  // y = layer(x) for `batch` samples.
  virtual void Forward(Device& device, int batch, const float* x, float* y) = 0;
  // Given x, y from Forward and dy, writes the parameter gradients and, when dx is not
  // null, the input gradient (all overwritten, not accumulated).
  virtual void Backward(Device& device, int batch, const float* x, const float* y, const float* dy,
                        float* dx) = 0;

 private:
  ActivationShape input_;
};

// 2-D convolution with bias, a square kernel, a stride and zero padding on every side:
// "<name>.weight", "<name>.bias".
class Conv2dLayer final : public Layer {
 public:
  // A square `kernel`, moved by `stride`, over the input padded with `padding` zeros per side.
  Conv2dLayer(std::string name, ActivationShape input, int out_channels, int kernel, int stride = 1, int padding = 0);
  ActivationShape output_shape() const override;
  std::string_view kind() const override { return "conv2d"; }
  std::string name() const override { return name_; }
  std::vector<std::pair<std::string, int>> attributes() const override {
    return {{"kernel", kernel_}, {"stride", stride_}, {"padding", padding_}};
  }
  std::vector<LayerOp> StepOps(int batch, bool input_gradient) const override;
  std::vector<ParameterSpec> parameters() const override;
  void Bind(float* parameters, float* gradients) override;
  void Forward(Device& device, int batch, const float* x, float* y) override;
  void Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) override;

 private:
  Conv2dShape ShapeFor(int batch) const;

  std::string name_;
  int out_channels_, kernel_, stride_, padding_;
  float* weight_ = nullptr;
  float* bias_ = nullptr;
  float* weight_grad_ = nullptr;
  float* bias_grad_ = nullptr;
};

// Fully connected y = x W^T + b over the flattened input: "<name>.weight" [out, in], "<name>.bias".
class LinearLayer final : public Layer {
 public:
  LinearLayer(std::string name, ActivationShape input, int out_features);
  ActivationShape output_shape() const override { return {out_features_, 1, 1}; }
  std::string_view kind() const override { return "linear"; }
  std::string name() const override { return name_; }
  std::vector<LayerOp> StepOps(int batch, bool input_gradient) const override;
  std::vector<ParameterSpec> parameters() const override;
  void Bind(float* parameters, float* gradients) override;
  void Forward(Device& device, int batch, const float* x, float* y) override;
  void Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) override;

 private:
  std::string name_;
  int out_features_;
  float* weight_ = nullptr;
  float* bias_ = nullptr;
  float* weight_grad_ = nullptr;
  float* bias_grad_ = nullptr;
};

class ReluLayer final : public Layer {
 public:
  explicit ReluLayer(ActivationShape input) : Layer(input) {}
  ActivationShape output_shape() const override { return input_shape(); }
  std::string_view kind() const override { return "relu"; }
  std::vector<LayerOp> StepOps(int batch, bool input_gradient) const override;
  void Forward(Device& device, int batch, const float* x, float* y) override;
  void Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) override;
};

// Max pool with a square window, no padding; records the argmax on the device.
class MaxPoolLayer final : public Layer {
 public:
  MaxPoolLayer(ActivationShape input, int window, int stride);
  ActivationShape output_shape() const override;
  std::string_view kind() const override { return "max_pool"; }
  std::vector<std::pair<std::string, int>> attributes() const override;
  std::vector<LayerOp> StepOps(int batch, bool input_gradient) const override;
  Status Reserve(Device& device, int batch) override;
  void Forward(Device& device, int batch, const float* x, float* y) override;
  void Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) override;

 private:
  MaxPoolShape ShapeFor(int batch) const;

  int window_, stride_;
  DeviceBuffer argmax_;
};

}  // namespace tessera
