// The layers models are built from. Each computes only through a Device and sees its
// parameters as views into the model's flat parameter and gradient buffers.
//
// Shapes are per sample, NCHW without the batch dimension; a fully connected layer reads its
// input flattened. A layer is used by one thread at a time (its model's).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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

// How a parameter starts (PyTorch's defaults for each layer).
enum class ParameterInit {
  kFanInUniform,  // uniform(+-1/sqrt(fan_in)): convolutions and linear layers
  kOnes,          // a norm's weight, a batch norm's running variance
  kZeros,         // a norm's bias, a batch norm's running mean
};

struct ParameterSpec {
  std::string name;             // full name: "conv1.weight"
  std::vector<int64_t> shape;   // PyTorch's layout: conv [out, in, kh, kw], linear [out, in]
  int64_t fan_in = 1;           // for PyTorch-default initialisation: uniform(+-1/sqrt(fan_in))
  ParameterInit init = ParameterInit::kFanInUniform;
  // Kept on each worker rather than averaged into the global model (FedBN's batch norms).
  bool local = false;
  // A value below zero is refused when a model's state is set (a batch norm's running
  // variance: evaluation takes its square root).
  bool non_negative = false;

  int64_t Count() const {  // values: the product of the shape
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    return count;
  }
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
  // parameters() says; gradients null until the model allocates them for a Backward). Called
  // once the model has allocated its flat buffers.
  virtual void Bind(float* parameters, float* gradients) {}
  // State that is part of the model but not trained by the optimiser (a batch norm's running
  // statistics, PyTorch's "buffers"), in the order BindBuffers lays it out.
  virtual std::vector<ParameterSpec> buffers() const { return {}; }
  virtual void BindBuffers(float* buffers) {}
  // A residual block's paths: its body, then its shortcut (empty: the identity). Empty for
  // every other layer.
  virtual std::vector<std::vector<const Layer*>> paths() const { return {}; }
  // Training (the default) or inference: a batch norm's statistics and dropout depend on it.
  virtual void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }
  // Where the samples of the next training forwards sit in the batch their step trains: a
  // site cohort member computes samples first_sample.. of each batch (0, the default: all of
  // it). A layer that draws per sample (dropout) draws what those samples get in the whole
  // batch.
  virtual void set_batch_slice(int64_t first_sample) {}
  // A training step that gives this model no samples (a cohort member's empty slice): a layer
  // that draws per step (dropout) moves to the next step's draw as a forward would.
  virtual void SkipStep() {}
  // Makes room for batches of up to `batch` samples (layer-private device state, such as a
  // max pool's argmax). Allocates only when `batch` exceeds what was reserved before.
  virtual Status Reserve(Device& device, int batch) { return Status::Ok(); }

  // y = layer(x) for `batch` samples.
  virtual void Forward(Device& device, int batch, const float* x, float* y) = 0;
  // Given x, y from Forward and dy, writes the parameter gradients and, when dx is not
  // null, the input gradient (all overwritten, not accumulated).
  virtual void Backward(Device& device, int batch, const float* x, const float* y, const float* dy,
                        float* dx) = 0;

  // Backward for Model::BackwardInPieces, for a layer that cuts its own parameters' gradients
  // into pieces: writes dx (when not null) first, then hands each piece to `piece` (offset
  // within the layer's parameters, count, values in `scratch`), which may change the
  // parameters it covers. Returns false, doing nothing, for a layer that does not (the
  // default): the model then runs Backward with every gradient in scratch at once.
  using GradientPiece = std::function<void(int64_t offset, int64_t count, float* gradients)>;
  virtual bool BackwardInPieces(Device& device, int batch, const float* x, const float* y, const float* dy,
                                float* dx, float* scratch, const GradientPiece& piece) {
    return false;
  }
  // The scratch (floats) BackwardInPieces needs for `batch` samples: 0 for a layer that does
  // not cut pieces.
  virtual int64_t PieceScratch(int batch) const { return 0; }

 private:
  ActivationShape input_;
  bool training_ = true;
};

// 2-D convolution with bias, a square kernel, a stride and zero padding on every side:
// "<name>.weight" [out, in / groups, k, k], "<name>.bias". With groups > 1 (both channel counts
// divisible by it) group g's outputs see only group g's inputs, as PyTorch's Conv2d(groups=):
// each group runs as its own convolution over the group's channels, gathered into a
// contiguous buffer (Axpby copies per sample) and scattered back.
class Conv2dLayer final : public Layer {
 public:
  // A square `kernel`, moved by `stride`, over the input padded with `padding` zeros per side.
  Conv2dLayer(std::string name, ActivationShape input, int out_channels, int kernel, int stride = 1, int padding = 0,
              bool bias = true, int groups = 1);
  ActivationShape output_shape() const override;
  std::string_view kind() const override { return "conv2d"; }
  std::string name() const override { return name_; }
  std::vector<std::pair<std::string, int>> attributes() const override {
    return {{"kernel", kernel_}, {"stride", stride_}, {"padding", padding_}, {"bias", has_bias_ ? 1 : 0},
            {"groups", groups_}};
  }
  std::vector<LayerOp> StepOps(int batch, bool input_gradient) const override;
  std::vector<ParameterSpec> parameters() const override;
  void Bind(float* parameters, float* gradients) override;
  Status Reserve(Device& device, int batch) override;
  void Forward(Device& device, int batch, const float* x, float* y) override;
  void Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) override;

 private:
  // One group's convolution (all of it when groups_ is 1).
  Conv2dShape ShapeFor(int batch) const;
  struct GroupStrides {
    int64_t in_plane;   // values in one input channel's plane
    int64_t out_plane;  // and in one output channel's
    int64_t weights;    // one group's weights
  };
  GroupStrides StridesFor(const Conv2dShape& shape) const;
  // Copies group g's channels of `batch` samples between the full layout (`channels` per
  // sample, `plane` values per channel) and a contiguous group buffer, either way.
  void Gather(Device& device, int batch, int g, int channels, int64_t plane, const float* full, float* group) const;
  void Scatter(Device& device, int batch, int g, int channels, int64_t plane, const float* group, float* full) const;

  std::string name_;
  int out_channels_, kernel_, stride_, padding_;
  bool has_bias_;
  int groups_;
  DeviceBuffer group_in_, group_out_, group_in_grad_, group_out_grad_;  // groups > 1 only
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
  // Weights of kPieceAboveValues or more, in more than one piece, come in pieces of whole
  // rows (the bias first, at once): about kPieceValues each, in multiples of kPieceRowAlign
  // rows. Each piece's columns of dy are gathered (batch x rows) and multiplied alone: a row's
  // gradient is the same dot products over the batch as in Backward, and with the rows aligned
  // so, BLAS kernels that work in blocks of 4, 8, 16, 24, 32 or 48 rows compute them alike
  // (bit for bit with OpenBLAS on one thread, tests/core/train_pieces_test.cc; more BLAS
  // threads split the whole product differently, which changes the last bits of a Backward
  // too). Smaller layers: false.
  bool BackwardInPieces(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx,
                        float* scratch, const GradientPiece& piece) override;
  int64_t PieceScratch(int batch) const override;
  static constexpr int64_t kPieceAboveValues = int64_t{1} << 20;  // 4 MiB of weights
  static constexpr int64_t kPieceValues = int64_t{1} << 16;       // 256 KiB
  static constexpr int64_t kPieceRowAlign = 96;

 private:
  int64_t PieceRows() const;  // rows of weights per piece
  bool CutsPieces() const;     // large enough for more than one piece

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

// A square pooling window without padding over `input`, as the max and average pools use it:
// the output's shape, and the device's shape for a batch.
ActivationShape PooledShape(const ActivationShape& input, int window, int stride);
MaxPoolShape PoolShapeFor(const ActivationShape& input, int batch, int window, int stride);

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

// GELU, tanh or sigmoid, elementwise.
class ActivationLayer final : public Layer {
 public:
  ActivationLayer(ActivationShape input, ActivationFunction function) : Layer(input), function_(function) {}
  ActivationShape output_shape() const override { return input_shape(); }
  std::string_view kind() const override { return ActivationName(function_); }
  std::vector<LayerOp> StepOps(int batch, bool input_gradient) const override;
  void Forward(Device& device, int batch, const float* x, float* y) override;
  void Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) override;

 private:
  ActivationFunction function_;
};

// Average pool with a square window, no padding.
class AvgPoolLayer final : public Layer {
 public:
  AvgPoolLayer(ActivationShape input, int window, int stride);
  ActivationShape output_shape() const override;
  std::string_view kind() const override { return "avg_pool"; }
  std::vector<std::pair<std::string, int>> attributes() const override;
  std::vector<LayerOp> StepOps(int batch, bool input_gradient) const override;
  void Forward(Device& device, int batch, const float* x, float* y) override;
  void Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) override;

 private:
  MaxPoolShape ShapeFor(int batch) const;
  int window_, stride_;
};

// The mean of each channel over its plane: [C, H, W] -> [C, 1, 1]. A GEMM against a vector
// of 1 / (H W), so every backend that multiplies matrices runs it natively; a batch of more
// than INT_MAX rows (batch x C) runs as several, each of whole samples.
class GlobalAvgPoolLayer final : public Layer {
 public:
  explicit GlobalAvgPoolLayer(ActivationShape input) : Layer(input) {}
  ActivationShape output_shape() const override { return {input_shape().channels, 1, 1}; }
  std::string_view kind() const override { return "global_avg_pool"; }
  std::vector<LayerOp> StepOps(int batch, bool input_gradient) const override;
  Status Reserve(Device& device, int batch) override;
  void Forward(Device& device, int batch, const float* x, float* y) override;
  void Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) override;

 private:
  int SamplesPerGemm(int batch) const;  // whole samples of at most INT_MAX rows in all
  DeviceBuffer averaging_;  // H W values of 1 / (H W)
};

// Batch normalisation per channel (PyTorch's BatchNorm2d, or BatchNorm1d on a flat input):
// "<name>.weight", "<name>.bias" trained; "<name>.running_mean", "<name>.running_var" kept as
// buffers and used in inference. PyTorch's num_batches_tracked is not kept (momentum is fixed).
class BatchNormLayer final : public Layer {
 public:
  BatchNormLayer(std::string name, ActivationShape input, float epsilon, float momentum, bool local);
  ActivationShape output_shape() const override { return input_shape(); }
  std::string_view kind() const override { return "batch_norm"; }
  std::string name() const override { return name_; }
  // epsilon_bits: epsilon's float bits (attributes are integers), std::bit_cast back.
  std::vector<std::pair<std::string, int>> attributes() const override;
  std::vector<LayerOp> StepOps(int batch, bool input_gradient) const override;
  std::vector<ParameterSpec> parameters() const override;
  std::vector<ParameterSpec> buffers() const override;
  void Bind(float* parameters, float* gradients) override;
  void BindBuffers(float* buffers) override;
  Status Reserve(Device& device, int batch) override;
  void Forward(Device& device, int batch, const float* x, float* y) override;
  void Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) override;

 private:
  BatchNormShape ShapeFor(int batch) const;
  std::string name_;
  float epsilon_, momentum_;
  bool local_;
  float* gamma_ = nullptr;
  float* beta_ = nullptr;
  float* gamma_grad_ = nullptr;
  float* beta_grad_ = nullptr;
  float* running_ = nullptr;  // mean, then variance
  DeviceBuffer saved_;        // the last training forward's mean, then invstd
};

// Layer normalisation over each sample's features (PyTorch's LayerNorm(input.shape[1:])):
// "<name>.weight", "<name>.bias" of the sample's shape.
class LayerNormLayer final : public Layer {
 public:
  LayerNormLayer(std::string name, ActivationShape input, float epsilon);
  ActivationShape output_shape() const override { return input_shape(); }
  std::string_view kind() const override { return "layer_norm"; }
  std::string name() const override { return name_; }
  // epsilon_bits: epsilon's float bits (attributes are integers), std::bit_cast back.
  std::vector<std::pair<std::string, int>> attributes() const override;
  std::vector<LayerOp> StepOps(int batch, bool input_gradient) const override;
  std::vector<ParameterSpec> parameters() const override;
  void Bind(float* parameters, float* gradients) override;
  Status Reserve(Device& device, int batch) override;
  void Forward(Device& device, int batch, const float* x, float* y) override;
  void Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) override;

 private:
  std::string name_;
  float epsilon_;
  float* gamma_ = nullptr;
  float* beta_ = nullptr;
  float* gamma_grad_ = nullptr;
  float* beta_grad_ = nullptr;
  DeviceBuffer saved_;  // per sample: mean, then invstd
};

// Inverted dropout in training; the identity in inference. The mask of each training step is
// drawn from (seed, step), so a run is reproducible and every backend drops the same units.
class DropoutLayer final : public Layer {
 public:
  DropoutLayer(ActivationShape input, float probability, uint64_t seed);
  ActivationShape output_shape() const override { return input_shape(); }
  std::string_view kind() const override { return "dropout"; }
  void set_batch_slice(int64_t first_sample) override { first_sample_ = first_sample; }
  void SkipStep() override;
  std::vector<LayerOp> StepOps(int batch, bool input_gradient) const override;
  Status Reserve(Device& device, int batch) override;
  void Forward(Device& device, int batch, const float* x, float* y) override;
  void Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) override;

 private:
  float probability_;
  uint64_t seed_;
  uint64_t step_ = 0;
  int64_t first_sample_ = 0;  // set_batch_slice
  bool masked_ = false;       // the last Forward drew a mask
  DeviceBuffer mask_;
};

// [C, H, W] -> [C H W, 1, 1]: the values unchanged (a copy), for a linear layer's input.
class FlattenLayer final : public Layer {
 public:
  explicit FlattenLayer(ActivationShape input) : Layer(input) {}
  ActivationShape output_shape() const override { return {static_cast<int>(input_shape().size()), 1, 1}; }
  std::string_view kind() const override { return "flatten"; }
  std::vector<LayerOp> StepOps(int batch, bool input_gradient) const override;
  void Forward(Device& device, int batch, const float* x, float* y) override;
  void Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) override;
};

// y = body(x) + shortcut(x), the shortcut the identity when it has no layers (He et al. 2016).
// The sub-layers carry their full parameter names ("layer2.conv1", "layer2.shortcut.0").
class ResidualLayer final : public Layer {
 public:
  // body must not be empty; body's output shape must equal the shortcut's (the input's when
  // the shortcut is the identity): BuildLayers checks both.
  ResidualLayer(std::string name, ActivationShape input, std::vector<std::unique_ptr<Layer>> body,
                std::vector<std::unique_ptr<Layer>> shortcut);
  ActivationShape output_shape() const override { return body_.back()->output_shape(); }
  std::string_view kind() const override { return "residual"; }
  std::string name() const override { return name_; }
  std::vector<std::vector<const Layer*>> paths() const override;
  std::vector<LayerOp> StepOps(int batch, bool input_gradient) const override;
  std::vector<ParameterSpec> parameters() const override;
  std::vector<ParameterSpec> buffers() const override;
  void Bind(float* parameters, float* gradients) override;
  void BindBuffers(float* buffers) override;
  void set_training(bool training) override;
  void set_batch_slice(int64_t first_sample) override;
  void SkipStep() override;
  Status Reserve(Device& device, int batch) override;
  void Forward(Device& device, int batch, const float* x, float* y) override;
  void Backward(Device& device, int batch, const float* x, const float* y, const float* dy, float* dx) override;

 private:
  // Runs `path` from x; the last layer writes `last` (a path's own buffer when null).
  struct Path {
    std::vector<std::unique_ptr<Layer>> layers;
    std::vector<DeviceBuffer> outputs, gradients;  // one per layer
  };
  Status ReservePath(Device& device, Path& path, int batch);
  void ForwardPath(Device& device, Path& path, int batch, const float* x);
  // Writes dx (overwritten) when not null.
  void BackwardPath(Device& device, Path& path, int batch, const float* x, const float* dy, float* dx);

  std::string name_;
  Path body_path_, shortcut_path_;
  std::vector<std::unique_ptr<Layer>>& body_ = body_path_.layers;
  DeviceBuffer shortcut_dx_;  // the shortcut's input gradient, before the sum
  int reserved_ = 0;
};

}  // namespace tessera
