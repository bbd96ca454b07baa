#include "core/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>

namespace tessera {
namespace {

Status CheckDataMatchesModel(const Model& model, const Dataset& data) {
  const ActivationShape& input = model.input_shape();
  if (data.channels != input.channels || data.rows != input.height || data.cols != input.width) {
    return InvalidArgumentError("dataset '" + data.source + "': samples are " + std::to_string(data.channels) + "x" +
                                std::to_string(data.rows) + "x" + std::to_string(data.cols) + " but model '" +
                                model.name() + "' expects " + std::to_string(input.channels) + "x" +
                                std::to_string(input.height) + "x" + std::to_string(input.width));
  }
  if (data.num_classes > model.classes()) {
    return InvalidArgumentError("dataset '" + data.source + "' has " + std::to_string(data.num_classes) +
                                " classes but model '" + model.name() + "' only " + std::to_string(model.classes()));
  }
  return Status::Ok();
}

// The first batch norm (residual blocks' included) whose channels hold one value per sample:
// its input is [C, 1, 1]. Empty when there is none.
std::string OneValueBatchNorm(const std::vector<LayerInfo>& layers) {
  for (const LayerInfo& layer : layers) {
    if (layer.kind == "batch_norm" && layer.output.height * layer.output.width == 1) return layer.name;
    for (const auto& path : layer.paths) {
      if (std::string found = OneValueBatchNorm(path); !found.empty()) return found;
    }
  }
  return "";
}

// Whether a batch of `whole` samples cut into `shards` slices (as TrainLocal cuts it: member i
// takes [whole * i / shards, whole * (i + 1) / shards)) gives some member exactly one sample.
// The slices hold whole / shards samples, and one more for some members when the division has
// a remainder.
bool SomeSliceHoldsOne(uint64_t whole, uint64_t shards) {
  const uint64_t least = whole / shards;
  return least == 1 || (least == 0 && whole % shards != 0);
}

// SplitMix64: a sample's random bits from (seed, epoch, position), the same on every platform.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Device-side staging for one batch of images and labels.
struct BatchBuffers {
  DeviceBuffer images;
  DeviceBuffer labels;
  DeviceBuffer loss;
  std::vector<float> host_images;
  std::vector<int32_t> host_labels;

  Status Allocate(Device& device, int64_t sample_size, uint32_t batch_size) {
    ASSIGN_OR_RETURN(images, device.Allocate(sizeof(float) * sample_size * batch_size));
    ASSIGN_OR_RETURN(labels, device.Allocate(sizeof(int32_t) * batch_size));
    ASSIGN_OR_RETURN(loss, device.Allocate(sizeof(float)));
    host_images.resize(sample_size * batch_size);
    host_labels.resize(batch_size);
    return Status::Ok();
  }

  // Gathers samples `order[first, first + count)` and copies them to the device. With an
  // augmentation, `draw(i)` gives the random bits of the i-th sample gathered.
  Status Load(Device& device, const Dataset& data, const int64_t* order, int count,
              const Augmentation* augment = nullptr, const std::function<uint64_t(int)>& draw = nullptr) {
    const int64_t sample_size = data.SampleSize();
    for (int i = 0; i < count; ++i) {
      float* out = host_images.data() + i * sample_size;
      if (augment != nullptr) {
        AugmentImage(data, order[i], *augment, draw(i), out);
      } else {
        data.CopyImage(order[i], out);
      }
      host_labels[i] = data.labels[order[i]];
    }
    RETURN_IF_ERROR(device.CopyHostToDevice(host_images.data(), images, 0, sizeof(float) * sample_size * count));
    return device.CopyHostToDevice(host_labels.data(), labels, 0, sizeof(int32_t) * count);
  }
};

// Fisher-Yates with a multiply-shift draw, so the order is the same on every platform.
void Shuffle(std::vector<int64_t>& order, std::mt19937_64& engine) {
  for (size_t i = order.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>((static_cast<unsigned __int128>(engine()) * i) >> 64);
    std::swap(order[i - 1], order[j]);
  }
}

}  // namespace

void AugmentImage(const Dataset& data, int64_t index, const Augmentation& augment, uint64_t bits, float* out) {
  const int rows = data.rows, cols = data.cols;
  const bool flip = augment.horizontal_flip && (bits & 1u);
  int dy = 0, dx = 0;
  if (augment.crop_padding > 0) {
    const int span = 2 * augment.crop_padding + 1;
    dy = static_cast<int>((bits >> 8) % static_cast<uint64_t>(span)) - augment.crop_padding;
    dx = static_cast<int>((bits >> 24) % static_cast<uint64_t>(span)) - augment.crop_padding;
  }
  thread_local std::vector<float> sample;  // the image's values, for either kind of dataset
  sample.resize(static_cast<size_t>(data.SampleSize()));
  data.CopyImage(index, sample.data());
  const float* in = sample.data();
  for (int c = 0; c < data.channels; ++c) {
    const float* plane = in + static_cast<int64_t>(c) * rows * cols;
    float* dst = out + static_cast<int64_t>(c) * rows * cols;
    for (int y = 0; y < rows; ++y) {
      const int sy = y + dy;
      for (int x = 0; x < cols; ++x) {
        const int tx = flip ? cols - 1 - x : x;  // the output column this input column lands in
        const int sx = x + dx;
        dst[y * cols + tx] = (sy >= 0 && sy < rows && sx >= 0 && sx < cols) ? plane[sy * cols + sx] : 0.0f;
      }
    }
  }
}

Result<TrainReport> TrainLocal(Model& model, const Dataset& data, const std::vector<int64_t>& indices,
                               const TrainOptions& options) {
  RETURN_IF_ERROR(CheckDataMatchesModel(model, data));
  if (options.batch_size == 0) return InvalidArgumentError("TrainLocal: batch_size must be positive, got 0");
  if (options.shard_count == 0 || options.shard_index >= options.shard_count) {
    return InvalidArgumentError("TrainLocal: shard " + std::to_string(options.shard_index) + " of " +
                                std::to_string(options.shard_count) + " does not exist");
  }
  if (options.shard_count > 1 && options.gradient_hook == nullptr) {
    return InvalidArgumentError("TrainLocal: sharded training needs a gradient hook to combine the shards");
  }
  for (int64_t index : indices) {
    if (index < 0 || index >= data.count) {
      return InvalidArgumentError("TrainLocal: sample index " + std::to_string(index) + " is outside dataset '" +
                                  data.source + "' of " + std::to_string(data.count) + " samples");
    }
  }
  Device& device = model.device();
  const int64_t parameter_count = model.NumParameters();
  const int64_t trainable_count = model.NumTrainable();
  model.SetTraining(true);
  // A batch whose slice (the whole batch outside a cohort) holds one sample is skipped when
  // this batch norm would see one value per channel: every member decides alike, from the
  // batch's size. A full batch cut so (batch_size against the cohort's members) would make
  // every batch so: refused.
  const std::string one_value_norm = OneValueBatchNorm(model.DescribeLayers(1));
  if (!one_value_norm.empty() && options.shard_count > 1 &&
      SomeSliceHoldsOne(options.batch_size, options.shard_count)) {
    return InvalidArgumentError("TrainLocal: a batch of " + std::to_string(options.batch_size) + " samples cut among " +
                                std::to_string(options.shard_count) +
                                " cohort members gives a member one sample, and batch norm '" + one_value_norm +
                                "' would hold one value per channel; expected a batch size of at least 2 per member (" +
                                std::to_string(2 * options.shard_count) + " or more)");
  }
  if (!(options.proximal_mu >= 0.0f) || !std::isfinite(options.proximal_mu)) {
    return InvalidArgumentError("TrainLocal: proximal_mu must be a finite number >= 0, got " +
                                std::to_string(options.proximal_mu));
  }
  const bool corrected = options.server_control != nullptr || options.client_control != nullptr;
  if (corrected) {
    for (const auto& [name, control] : {std::pair<const char*, const std::vector<float>*>{"server", options.server_control},
                                        {"client", options.client_control}}) {
      if (control == nullptr || static_cast<int64_t>(control->size()) != parameter_count) {
        return InvalidArgumentError(std::string("TrainLocal: the ") + name + " control variate has " +
                                    (control ? std::to_string(control->size()) : std::string("no")) +
                                    " values; model '" + model.name() + "' has " + std::to_string(parameter_count) +
                                    " parameters");
      }
    }
  }
  // Without a gradient hook each layer's gradients step its parameters as the backward pass
  // hands them over (Model::BackwardInPieces): no model-sized gradient buffer beside the
  // velocity, which takes its memory. A hook needs the whole flat gradient.
  const bool in_pieces = options.gradient_hook == nullptr && options.shard_count == 1;
  if (in_pieces) {
    model.ReleaseGradients();
  } else {
    RETURN_IF_ERROR(model.EnsureGradients());
  }
  // Staging for the largest batch the data gives, not the spec's batch size: a party with
  // fewer samples than a batch holds only what it loads.
  BatchBuffers batch;
  const uint32_t largest_batch = static_cast<uint32_t>(
      std::clamp<uint64_t>(indices.size(), 1, options.batch_size));
  RETURN_IF_ERROR(batch.Allocate(device, data.SampleSize(), largest_batch));
  ASSIGN_OR_RETURN(DeviceBuffer velocity, device.Allocate(sizeof(float) * parameter_count));
  device.Fill(parameter_count, 0.0f, velocity.f32());
  const size_t parameter_bytes = sizeof(float) * static_cast<size_t>(parameter_count);
  // FedProx's anchor: the parameters as the call starts, copied on the device.
  DeviceBuffer anchor;
  if (options.proximal_mu > 0.0f) {
    ASSIGN_OR_RETURN(anchor, device.Allocate(parameter_bytes));
    RETURN_IF_ERROR(device.CopyDeviceToDevice(model.flat_parameters(), 0, anchor, 0, parameter_bytes));
  }
  // SCAFFOLD's variates, on the device for the whole call.
  DeviceBuffer server_control, client_control;
  if (corrected) {
    ASSIGN_OR_RETURN(server_control, device.Allocate(parameter_bytes));
    ASSIGN_OR_RETURN(client_control, device.Allocate(parameter_bytes));
    RETURN_IF_ERROR(device.CopyHostToDevice(options.server_control->data(), server_control, 0, parameter_bytes));
    RETURN_IF_ERROR(device.CopyHostToDevice(options.client_control->data(), client_control, 0, parameter_bytes));
  }

  const bool augmenting = options.augment.horizontal_flip || options.augment.crop_padding > 0;
  if (options.augment.crop_padding < 0 || options.augment.crop_padding > 64) {
    return InvalidArgumentError("TrainLocal: crop_padding must be in [0, 64], got " +
                                std::to_string(options.augment.crop_padding));
  }
  // The optimiser's step and the algorithms' terms on one piece of the trained parameters
  // (all of them at once without pieces): elementwise, so pieces step exactly as a whole.
  float* parameters = model.flat_parameters().f32();
  const auto step = [&](int64_t offset, int64_t count, float* gradients) {
    if (!anchor.empty()) {
      device.AddScaledDifference(count, options.proximal_mu, parameters + offset, anchor.f32() + offset, gradients);
    }
    device.SgdMomentumUpdate(count, options.learning_rate, options.momentum, options.weight_decay, gradients,
                             velocity.f32() + offset, parameters + offset);
    if (corrected) {
      // SCAFFOLD's correction moves the weights by -lr (c - c_i) after the optimiser's step,
      // outside its momentum, as NIID-Bench's reference client does.
      device.AddScaledDifference(count, -options.learning_rate, server_control.f32() + offset,
                                 client_control.f32() + offset, parameters + offset);
    }
  };
  TrainReport report;
  double loss_sum = 0.0;
  // A shard's forwards draw dropout for its samples' places in the whole batch; the model is
  // left drawing for whole batches on every return.
  struct SliceGuard {
    Model& model;
    ~SliceGuard() { model.SetBatchSlice(0); }
  } slice_guard{model};
  const auto began = std::chrono::steady_clock::now();
  std::vector<int64_t> order = indices;
  for (uint32_t epoch = 0; epoch < options.epochs; ++epoch) {
    std::mt19937_64 engine(options.seed * 0x9E3779B97F4A7C15ull + epoch);
    Shuffle(order, engine);
    for (size_t first = 0; first < order.size(); first += options.batch_size) {
      if (options.should_stop && options.should_stop()) {
        return CancelledError("training of model '" + model.name() + "' stopped after " +
                              std::to_string(report.steps) + " steps");
      }
      const int whole = static_cast<int>(std::min<size_t>(options.batch_size, order.size() - first));
      if (!one_value_norm.empty() && SomeSliceHoldsOne(static_cast<uint64_t>(whole), options.shard_count)) {
        ++report.skipped_batches;
        report.skipped_for = one_value_norm;
        continue;
      }
      // This shard's slice of the batch (all of it when not sharded).
      const int begin = static_cast<int>(static_cast<int64_t>(whole) * options.shard_index / options.shard_count);
      const int end = static_cast<int>(static_cast<int64_t>(whole) * (options.shard_index + 1) / options.shard_count);
      const int count = end - begin;
      if (count > 0) {
        if (augmenting) {
          const uint64_t epoch_key = Mix(options.seed ^ Mix(epoch));
          const size_t base = first + static_cast<size_t>(begin);
          RETURN_IF_ERROR(batch.Load(device, data, order.data() + base, count, &options.augment,
                                     [&](int i) { return Mix(epoch_key + base + static_cast<size_t>(i)); }));
        } else {
          RETURN_IF_ERROR(batch.Load(device, data, order.data() + first + begin, count));
        }
        model.SetBatchSlice(begin);
        ASSIGN_OR_RETURN(const float* logits, model.Forward(batch.images.f32(), count));
        (void)logits;
        if (in_pieces) {
          RETURN_IF_ERROR(model.BackwardInPieces(batch.labels.i32(), batch.loss.f32(), step));
        } else {
          RETURN_IF_ERROR(model.Backward(batch.labels.i32(), batch.loss.f32()));
        }
      } else {
        model.SkipStep();  // the members whose slices are not empty drew this step's dropout
        device.Fill(parameter_count, 0.0f, model.flat_gradients().f32());
        device.Fill(1, 0.0f, batch.loss.f32());
      }
      if (options.shard_count > 1 && count > 0 && count * options.shard_count != static_cast<uint32_t>(whole)) {
        // An uneven split (at most once an epoch, on the last partial batch): rescale on the host.
        const float scale = static_cast<float>(count) * options.shard_count / static_cast<float>(whole);
        std::vector<float> gradients(static_cast<size_t>(parameter_count));
        RETURN_IF_ERROR(device.CopyDeviceToHost(model.flat_gradients(), 0, gradients.data(),
                                                sizeof(float) * gradients.size()));
        for (float& g : gradients) g *= scale;
        RETURN_IF_ERROR(device.CopyHostToDevice(gradients.data(), model.flat_gradients(), 0,
                                                sizeof(float) * gradients.size()));
      }
      if (options.gradient_hook != nullptr) {
        RETURN_IF_ERROR(options.gradient_hook->OnGradients(device, model.flat_gradients(), parameter_count,
                                                           static_cast<int64_t>(report.steps)));
      }
      // The optimiser and the algorithms' terms move the trained parameters only: the buffers
      // after them (running statistics) change in training forwards alone.
      if (!in_pieces) step(0, trainable_count, model.flat_gradients().f32());
      float loss = 0.0f;
      RETURN_IF_ERROR(device.CopyDeviceToHost(batch.loss, 0, &loss, sizeof(float)));
      loss_sum += static_cast<double>(loss) * count;
      report.samples += count;
      ++report.steps;
    }
  }
  RETURN_IF_ERROR(device.Synchronize());
  report.compute_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
  report.mean_loss = report.samples > 0 ? loss_sum / static_cast<double>(report.samples) : 0.0;
  return report;
}

Result<EvalReport> Evaluate(Model& model, const Dataset& data, uint32_t batch_size, int64_t max_samples) {
  RETURN_IF_ERROR(CheckDataMatchesModel(model, data));
  if (batch_size == 0) return InvalidArgumentError("Evaluate: batch_size must be positive, got 0");
  const int64_t total = max_samples > 0 ? std::min(max_samples, data.count) : data.count;
  Device& device = model.device();
  // Sized for the largest batch evaluated, which the test set may keep below batch_size.
  const uint32_t largest_batch = static_cast<uint32_t>(std::clamp<int64_t>(total, 1, batch_size));
  BatchBuffers batch;
  RETURN_IF_ERROR(batch.Allocate(device, data.SampleSize(), largest_batch));
  const int classes = model.classes();
  std::vector<float> logits_host(static_cast<size_t>(largest_batch) * classes);
  std::vector<int64_t> order(largest_batch);

  EvalReport report;
  double loss_sum = 0.0;
  uint64_t correct = 0;
  // Inference: running statistics, no dropout; the model's mode is restored on every return.
  struct ModeGuard {
    Model& model;
    bool was;
    ~ModeGuard() { model.SetTraining(was); }
  } guard{model, model.training()};
  model.SetTraining(false);
  for (int64_t first = 0; first < total; first += batch_size) {
    const int count = static_cast<int>(std::min<int64_t>(batch_size, total - first));
    for (int i = 0; i < count; ++i) order[i] = first + i;
    RETURN_IF_ERROR(batch.Load(device, data, order.data(), count));
    ASSIGN_OR_RETURN(const float* logits, model.Forward(batch.images.f32(), count));
    device.SoftmaxCrossEntropy(count, classes, logits, batch.labels.i32(), batch.loss.f32(), nullptr);
    float loss = 0.0f;
    RETURN_IF_ERROR(device.CopyDeviceToHost(batch.loss, 0, &loss, sizeof(float)));
    RETURN_IF_ERROR(device.CopyDeviceToHost(model.logits_buffer(), 0, logits_host.data(),
                                            sizeof(float) * count * classes));
    for (int i = 0; i < count; ++i) {
      const float* row = logits_host.data() + static_cast<int64_t>(i) * classes;
      const int predicted = static_cast<int>(std::max_element(row, row + classes) - row);
      if (predicted == batch.host_labels[i]) ++correct;
    }
    loss_sum += static_cast<double>(loss) * count;
    report.samples += count;
  }
  if (report.samples > 0) {
    report.accuracy = static_cast<double>(correct) / static_cast<double>(report.samples);
    report.loss = loss_sum / static_cast<double>(report.samples);
  }
  return report;
}

}  // namespace tessera
