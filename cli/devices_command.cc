#include "cli/devices_command.h"

#include <google/protobuf/struct.pb.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <random>
#include <sstream>

#include "base/escape.h"
#include "base/format.h"
#include "cli/job_spec.h"
#include "core/data/idx.h"
#include "device/measure.h"
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "device/emulated/factory.h"
#include "device/op_cost.h"
#include "device/placement.h"
#include "device/registry.h"
#include "proto/job_mapping.h"
#include "proto/json.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// True for a registered backend's name or an emulated-device name ("emu:..."; whether its
// profile exists is CreateDevice's to say).
bool IsKnownDeviceName(const std::string& name) {
  for (const auto& backend : RegisteredDeviceBackends()) {
    if (backend.name == name) return true;
  }
  return IsEmulatedDeviceName(name);
}

// --model: a built-in model's name, or a job file whose [model] (built-in or declared) is built
// for its data's shape.
Result<ModelConfig> ModelFor(const std::string& model) {
  ModelConfig config;
  if (model.size() > 5 && model.compare(model.size() - 5, 5, ".toml") == 0) {
    ASSIGN_OR_RETURN(v1::JobSpec spec, ParseJobSpecFile(model));
    if (!spec.model().trainer().empty()) {
      return InvalidArgumentError("--model " + QuoteUntrusted(model, 256) +
                                  ": the job trains with an external trainer, not a native model");
    }
    return wire::ToModelConfig(spec);
  }
  const auto known = KnownModelNames();
  if (std::find(known.begin(), known.end(), model) == known.end() || model == "declared") {
    return InvalidArgumentError("--model: expected a built-in model (simplecnn, mlp, mcmahan-cnn, resnet8) or a "
                                "job file (.toml)");
  }
  config.name = model;
  if (model == "resnet8") {
    config.channels = 3;
    config.rows = config.cols = 32;
  }
  return config;
}

Dataset RandomData(const Model& model, int count) {
  Dataset data;
  data.count = count;
  data.channels = model.input_shape().channels;
  data.rows = model.input_shape().height;
  data.cols = model.input_shape().width;
  data.num_classes = model.classes();
  std::mt19937 engine(1);
  std::normal_distribution<float> normal;
  data.images.resize(size_t(count) * data.SampleSize());
  for (float& value : data.images) value = normal(engine);
  for (int i = 0; i < count; ++i) data.labels.push_back(static_cast<uint8_t>(i % data.num_classes));
  return data;
}

Placement PlaceOn(Device& device, Op op) {
  if (OpPlacement* placement = device.placement()) return placement->Place(op);
  return device.capabilities().Supports(op) ? Placement::kNative : Placement::kUnsupported;
}

// The time model of device/emulated/factory.h, from an op's cost alone: native ops at the
// profile's roofline; fallbacks across the host link both ways plus the host's compute at the
// measured host GEMM rate. Without a profile (real hardware) nothing is modelled: returns < 0.
double ModelledOpMs(const DeviceProfile* profile, DType precision, Placement where, const OpCost& cost,
                    double host_gflops) {
  if (profile == nullptr) return -1;
  if (where == Placement::kNative) {
    const double scale = double(DTypeSize(precision)) / sizeof(float);
    const double peak = profile->PeakFlops(precision);
    const double compute_s = peak > 0 ? cost.flops / peak : 0;
    const double memory_s = double(cost.bytes_read + cost.bytes_written) * scale / (profile->memory_bandwidth_gbps * 1e9);
    return std::max(compute_s, memory_s) * 1e3;
  }
  const double link_s = double(cost.bytes_read + cost.bytes_written) / (profile->host_link_gbps * 1e9);
  const double host_s = host_gflops > 0 ? cost.flops / (host_gflops * 1e9) : 0;
  return (link_s + host_s) * 1e3;
}

// The per-layer risk list: every layer's ops (then the loss and the optimiser step), from the
// model's own description and device/op_cost.h, placed as the device places them.
void LayerRiskList(Device& device, const Model& model, int batch, double host_gflops, std::ostream& out) {
  const DeviceProfile* profile = EmulatedProfile(device);
  const DType precision = device.capabilities().compute_precision;
  const double element_scale = double(DTypeSize(precision)) / sizeof(float);
  const double balance = profile != nullptr ? profile->BalancePoint() : 0;
  std::vector<LayerInfo> layers = model.DescribeLayers(batch);
  LayerInfo loss{"loss", "softmax_cross_entropy", {model.classes(), 1, 1},
                 {{Op::kSoftmaxCrossEntropy, SoftmaxCrossEntropyCost(batch, model.classes(), true), false}},
                 {}, {}};
  LayerInfo optimiser{"optimiser", "sgd_momentum", {},
                      {{Op::kSgdMomentumUpdate, SgdMomentumUpdateCost(model.NumTrainable()), false}}, {}, {}};
  layers.push_back(loss);
  layers.push_back(optimiser);

  out << "  per-layer risk list, " << model.name() << " training step, batch " << batch << " (intensity in FLOPs per "
      << DTypeName(precision) << " byte";
  if (balance > 0) out << "; balance point " << std::fixed << std::setprecision(1) << balance;
  out << "):\n";
  out << "    " << std::left << std::setw(12) << "layer" << std::setw(30) << "op" << std::setw(15) << "placement"
      << std::right << std::setw(12) << "FLOPs/byte" << std::setw(11) << "bound" << std::setw(14) << "host-link B"
      << std::setw(13) << "modelled ms" << "\n";
  uint64_t total_fallback_bytes = 0;
  double total_ms = 0;
  int fallback_ops = 0, unsupported_ops = 0, all_ops = 0;
  for (const LayerInfo& layer : layers) {
    double flops = 0, bytes = 0, layer_ms = 0;
    uint64_t layer_link = 0;
    for (const LayerOp& step : layer.ops) {
      const Placement where = PlaceOn(device, step.op);
      const double op_bytes = double(step.cost.bytes_read + step.cost.bytes_written) * element_scale;
      const uint64_t link = where == Placement::kHostFallback ? step.cost.bytes_read + step.cost.bytes_written : 0;
      const double ms = ModelledOpMs(profile, precision, where, step.cost, host_gflops);
      const double intensity = op_bytes > 0 ? step.cost.flops / op_bytes : 0;
      flops += step.cost.flops;
      bytes += op_bytes;
      layer_link += link;
      layer_ms += std::max(0.0, ms);
      ++all_ops;
      fallback_ops += where == Placement::kHostFallback;
      unsupported_ops += where == Placement::kUnsupported;
      out << "    " << std::left << std::setw(12) << layer.name << std::setw(30)
          << (std::string(OpName(step.op)) + (step.backward ? " (bwd)" : "")) << std::setw(15) << PlacementName(where)
          << std::right << std::fixed << std::setprecision(2) << std::setw(12) << intensity << std::setw(11)
          << (balance > 0 ? (intensity >= balance ? "compute" : "bandwidth") : "-") << std::setw(14) << link
          << std::setw(13);
      if (ms >= 0) {
        out << std::setprecision(5) << ms;
      } else {
        out << "-";
      }
      out << "\n";
    }
    const double intensity = bytes > 0 ? flops / bytes : 0;
    total_fallback_bytes += layer_link;
    total_ms += layer_ms;
    out << "    " << std::left << std::setw(12) << layer.name << std::setw(30) << ("= " + layer.kind) << std::setw(15)
        << "" << std::right << std::fixed << std::setprecision(2) << std::setw(12) << intensity << std::setw(11)
        << (balance > 0 ? (intensity >= balance ? "compute" : "bandwidth") : "-") << std::setw(14) << layer_link
        << std::setw(13);
    if (profile != nullptr) {
      out << std::setprecision(5) << layer_ms;
    } else {
      out << "-";
    }
    out << "\n";
  }
  out << "    ops: " << all_ops << ", native " << (all_ops - fallback_ops - unsupported_ops) << ", host fallback "
      << fallback_ops << ", unsupported " << unsupported_ops << "\n";
  out << "    fallback bytes across the host link per step (layers): " << total_fallback_bytes << "\n";
  if (profile != nullptr) {
    out << "    modelled step (layers, loss, optimiser; no input copies): " << std::setprecision(4) << total_ms << " ms\n";
  }
}

Status RiskList(Device& device, const ModelConfig& config, const DevicesOptions& options, double host_gflops,
                std::ostream& out) {
  OpPlacement* placement = device.placement();
  ASSIGN_OR_RETURN(auto model, CreateModel(config, &device));
  LayerRiskList(device, *model, options.batch, host_gflops, out);
  Dataset data = RandomData(*model, options.batch);
  std::vector<int64_t> indices(options.batch);
  std::iota(indices.begin(), indices.end(), 0);
  TrainOptions train;
  train.batch_size = options.batch;
  RETURN_IF_ERROR(TrainLocal(*model, data, indices, train).status());  // warm-up: buffers, scratch
  ResetEmulatedClock(device);
  if (placement != nullptr) placement->Reset();
  const auto start = Clock::now();
  RETURN_IF_ERROR(TrainLocal(*model, data, indices, train).status());
  const double measured_ms = SecondsSince(start) * 1e3;

  const DeviceProfile* profile = EmulatedProfile(device);
  const double balance = profile != nullptr ? profile->BalancePoint() : 0;
  out << "  per-op account of one training step on the device, batch " << options.batch << ":\n";
  out << "    " << std::left << std::setw(24) << "op" << std::setw(15) << "placement" << std::right << std::setw(7)
      << "calls" << std::setw(14) << "FLOPs/byte" << std::setw(11) << "bound" << std::setw(16) << "host-link B"
      << std::setw(13) << "modelled ms" << "\n";
  uint64_t fallback_bytes = 0;
  for (Op op : AllOps()) {
    const Placement where = PlaceOn(device, op);
    OpAccount account;
    if (placement != nullptr) {
      account = where == Placement::kNative ? placement->Native(op) : placement->Fallback(op);
    }
    if (placement != nullptr && account.calls == 0) continue;  // the model does not use it
    const double intensity = account.bytes_accessed > 0 ? account.flops / double(account.bytes_accessed) : 0;
    std::string bound = "-";
    if (balance > 0 && account.calls > 0) bound = intensity >= balance ? "compute" : "bandwidth";
    fallback_bytes += account.host_link_bytes();
    out << "    " << std::left << std::setw(24) << OpName(op) << std::setw(15) << PlacementName(where) << std::right
        << std::setw(7) << account.calls << std::setw(14) << std::fixed << std::setprecision(2) << intensity
        << std::setw(11) << bound << std::setw(16) << account.host_link_bytes() << std::setw(13)
        << std::setprecision(4) << account.modelled_ms << "\n";
  }
  out << "    fallback bytes across the host link per step: " << fallback_bytes << "\n";
  if (profile != nullptr) {
    out << "    balance point " << std::setprecision(1) << balance << " FLOPs/byte; modelled step "
        << std::setprecision(4) << EmulatedModelledMs(device) << " ms (measured here " << std::setprecision(2)
        << measured_ms << " ms)\n";
  } else {
    out << "    measured step " << std::setprecision(2) << measured_ms << " ms\n";
  }
  return Status::Ok();
}

}  // namespace

Status CheckDevicesOptions(const DevicesOptions& options) {
  if (options.json && !options.model.empty()) {
    return InvalidArgumentError("--json lists the devices without a risk list; drop --model or --json");
  }
  // A name no backend knows is a typo in the command: refused with the others, before anything
  // is read or measured.
  for (const auto* list : {&options.devices, &options.extra_devices}) {
    for (const std::string& name : *list) {
      if (IsKnownDeviceName(name)) continue;
      std::string known;
      for (const auto& backend : RegisteredDeviceBackends()) known += (known.empty() ? "" : ", ") + backend.name;
      return InvalidArgumentError("unknown device " + QuoteUntrusted(name) + "; known devices: " + known +
                                  ", or emu:<profile.toml>");
    }
  }
  return Status::Ok();
}

Status DevicesCommand(const DevicesOptions& options, std::ostream& out) {
  RETURN_IF_ERROR(CheckDevicesOptions(options));
  std::vector<std::string> names = options.devices;
  if (names.empty()) {
    for (const auto& backend : RegisteredDeviceBackends()) names.push_back(backend.name);
  }
  names.insert(names.end(), options.extra_devices.begin(), options.extra_devices.end());
  // Every name before any device is measured (seconds each): a typo is an error at once, and
  // nothing is printed for a command that fails.
  for (const std::string& name : names) {
    // (Unknown names were refused by CheckDevicesOptions.) An emulated device's profile (built in, or a file) is read now: one misspelt or that does
    // not load is refused before another device is measured.
    if (IsEmulatedDeviceName(name)) {
      auto device = CreateDevice(name);
      if (!device.ok() && (device.status().code() == StatusCode::kInvalidArgument ||
                           device.status().code() == StatusCode::kNotFound)) {
        return device.status();
      }
    }
  }
  // So is the model of the risk list: a misspelt name or a job file that does not read.
  ModelConfig model_config;
  if (!options.model.empty()) {
    ASSIGN_OR_RETURN(model_config, ModelFor(options.model));
  }
  for (const std::string& name : names) {
    // With --json, one object per device in place of its lines.
    google::protobuf::Struct record;
    auto& f = *record.mutable_fields();
    f["name"].set_string_value(name);
    std::ostringstream text;
    auto emit = [&] { out << (options.json ? wire::ToJson(record) + "\n" : text.str()); };
    text << name << "\n";
    std::string reason;
    for (const auto& backend : RegisteredDeviceBackends()) {
      if (backend.name != name) continue;
      Viability viability = backend.viability();
      if (!viability.viable) reason = viability.reason.empty() ? "not viable" : viability.reason;
    }
    if (!reason.empty()) {
      text << "  not viable: " << reason << "\n";
      f["viable"].set_bool_value(false);
      f["reason"].set_string_value(reason);
      emit();
      continue;
    }
    auto device = CreateDevice(name);
    if (!device.ok()) {
      // A named profile file that does not load is the caller's error, not the device's.
      if (device.status().code() == StatusCode::kInvalidArgument || device.status().code() == StatusCode::kNotFound) {
        return device.status();
      }
      text << "  not viable: " << device.status().ToString() << "\n";
      f["viable"].set_bool_value(false);
      f["reason"].set_string_value(device.status().ToString());
      emit();
      continue;
    }
    const DeviceCapabilities& capabilities = (*device)->capabilities();
    text << "  " << capabilities.name << "; native ops " << capabilities.native_ops.size() << "/" << AllOps().size()
         << "; computes in " << DTypeName(capabilities.compute_precision) << "\n";
    f["viable"].set_bool_value(true);
    f["description"].set_string_value(capabilities.name);
    f["kind"].set_string_value(capabilities.kind);
    f["emulated"].set_bool_value(capabilities.emulated);
    f["native_ops"].set_number_value(static_cast<double>(capabilities.native_ops.size()));
    f["all_ops"].set_number_value(static_cast<double>(AllOps().size()));
    f["compute_precision"].set_string_value(std::string(DTypeName(capabilities.compute_precision)));
    auto measured = MeasureDevice(**device, options.gemm_size);
    if (!measured.ok()) {
      text << "  measurement failed: " << measured.status().ToString() << "\n";
      f["measurement_error"].set_string_value(measured.status().ToString());
      emit();
      continue;
    }
    text << std::fixed << std::setprecision(1) << "  measured: GEMM " << measured->gemm_gflops
         << " GFLOP/s, device copy " << measured->copy_gbps << " GB/s";
    f["measured_gemm_gflops"].set_number_value(measured->gemm_gflops);
    f["measured_copy_gbps"].set_number_value(measured->copy_gbps);
    if (const DeviceProfile* profile = EmulatedProfile(**device)) {
      text << "; datasheet: " << profile->PeakFlops(profile->precision) / 1e9 << " GFLOP/s ("
           << DTypeName(profile->precision) << "), " << profile->memory_bandwidth_gbps << " GB/s, "
           << profile->power_watts << " W (emulated on this host)";
      auto& sheet = *f["datasheet"].mutable_struct_value()->mutable_fields();
      sheet["gflops"].set_number_value(profile->PeakFlops(profile->precision) / 1e9);
      sheet["precision"].set_string_value(std::string(DTypeName(profile->precision)));
      sheet["bandwidth_gbps"].set_number_value(profile->memory_bandwidth_gbps);
      sheet["power_watts"].set_number_value(profile->power_watts);
    }
    text << "\n";
    emit();
    if (!options.model.empty()) RETURN_IF_ERROR(RiskList(**device, model_config, options, measured->gemm_gflops, out));
  }
  return Status::Ok();
}

Status AlignCommand(const AlignOptions& options, std::ostream& result_out) {
  std::ostringstream out;  // the text; with --json, `json` instead
  google::protobuf::Struct json;
  auto& j = *json.mutable_fields();
  if (options.samples <= 0) {
    return InvalidArgumentError("--samples: expected a positive count, got " + std::to_string(options.samples));
  }
  if (!(options.divergence_threshold > 0) || !std::isfinite(options.divergence_threshold)) {
    return InvalidArgumentError("--threshold: expected a positive finite number, got " +
                                FormatNumber(options.divergence_threshold));
  }
  const std::string names[2] = {options.device_a, options.device_b};
  // Both devices first, so a wrong name fails before the data is read.
  std::unique_ptr<Device> devices[2];
  for (int side = 0; side < 2; ++side) {
    auto created = CreateDevice(names[side]);
    if (!created.ok()) {
      return Status(created.status().code(), "device " + std::string(side == 0 ? "--a" : "--b") + " " +
                                                 QuoteUntrusted(names[side]) + ": " + created.status().message());
    }
    devices[side] = std::move(created).value();
  }
  ASSIGN_OR_RETURN(ModelConfig base_config, ModelFor(options.model));
  base_config.seed = options.seed;
  // Fashion-MNIST for a model of its shape; otherwise seeded random inputs of the model's shape.
  const bool fashion = base_config.channels == 1 && base_config.rows == 28 && base_config.cols == 28;
  Dataset data;
  if (fashion) {
    ASSIGN_OR_RETURN(data, LoadFashionMnist(options.data_dir, false));
  }
  const int count = static_cast<int>(fashion ? std::min<int64_t>(options.samples, data.count) : options.samples);
  std::vector<std::vector<float>> activations[2];  // per side, per layer: [count, layer output]
  std::vector<LayerInfo> layers;
  int classes = 0;
  TensorSet weights;
  for (int side = 0; side < 2; ++side) {
    Device& device = *devices[side];
    ASSIGN_OR_RETURN(auto model, CreateModel(base_config, &device));
    model->SetTraining(false);  // inference: running statistics, no dropout
    if (side == 0 && !fashion) data = RandomData(*model, count);
    if (side == 0) {
      ASSIGN_OR_RETURN(weights, model->GetState());
    }
    RETURN_IF_ERROR(model->SetState(weights));
    classes = model->classes();
    layers = model->DescribeLayers(count);
    const size_t sample = size_t(data.SampleSize());
    ASSIGN_OR_RETURN(DeviceBuffer input, device.Allocate(size_t(count) * sample * sizeof(float)));
    std::vector<float> host(size_t(count) * sample);
    for (int i = 0; i < count; ++i) data.CopyImage(i, host.data() + size_t(i) * sample);
    RETURN_IF_ERROR(device.CopyHostToDevice(host.data(), input, 0, host.size() * sizeof(float)));
    RETURN_IF_ERROR(model->ForwardCapture(input.f32(), count, &activations[side]));
  }
  const std::vector<float>& logits_a = activations[0].back();
  const std::vector<float>& logits_b = activations[1].back();
  std::vector<std::pair<double, int>> errors;
  int agree = 0;
  for (int i = 0; i < count; ++i) {
    const float* a = logits_a.data() + size_t(i) * classes;
    const float* b = logits_b.data() + size_t(i) * classes;
    double mae = 0;
    for (int j = 0; j < classes; ++j) mae += std::fabs(double(a[j]) - b[j]);
    errors.push_back({mae / classes, i});
    agree += std::max_element(a, a + classes) - a == std::max_element(b, b + classes) - b;
  }
  std::sort(errors.rbegin(), errors.rend());
  double mean = 0;
  for (const auto& [mae, index] : errors) mean += mae;
  j["model"].set_string_value(options.model);
  j["a"].set_string_value(names[0]);
  j["b"].set_string_value(names[1]);
  j["samples"].set_number_value(count);
  j["mean_logit_mae"].set_number_value(mean / count);
  j["top1_agreement"].set_number_value(static_cast<double>(agree) / count);
  out << "align " << options.model << ": " << names[0] << " vs " << names[1] << ", " << count << " samples\n"
      << std::scientific << std::setprecision(3) << "  mean per-sample logit MAE " << mean / count << "\n"
      << std::fixed << std::setprecision(2) << "  top-1 agreement " << 100.0 * agree / count << "%\n"
      << "  worst 5% (sample: MAE):";
  const size_t worst = std::max<size_t>(1, errors.size() / 20);
  auto* worst_list = j["worst"].mutable_list_value();
  for (size_t i = 0; i < worst; ++i) {
    out << " " << errors[i].second << ":" << std::scientific << errors[i].first;
    auto& w = *worst_list->add_values()->mutable_struct_value()->mutable_fields();
    w["sample"].set_number_value(errors[i].second);
    w["mae"].set_number_value(errors[i].first);
  }
  out << "\n";

  // Per layer: relative MAE = mean |a - b| / mean |a| over every output of the layer.
  out << "  per-layer relative MAE (mean |a-b| / mean |a|), threshold " << std::scientific << std::setprecision(1)
      << options.divergence_threshold << ":\n";
  std::string first_divergent;
  double first_value = 0;
  for (size_t layer = 0; layer < layers.size(); ++layer) {
    const std::vector<float>& a = activations[0][layer];
    const std::vector<float>& b = activations[1][layer];
    double difference = 0, magnitude = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      difference += std::fabs(double(a[i]) - b[i]);
      magnitude += std::fabs(double(a[i]));
    }
    const double relative = magnitude > 0 ? difference / magnitude : (difference > 0 ? INFINITY : 0.0);
    const bool diverged = relative > options.divergence_threshold;
    if (diverged && first_divergent.empty()) {
      first_divergent = layers[layer].name;
      first_value = relative;
    }
    auto& entry = *j["layers"].mutable_list_value()->add_values()->mutable_struct_value()->mutable_fields();
    entry["name"].set_string_value(layers[layer].name);
    entry["kind"].set_string_value(layers[layer].kind);
    entry["relative_mae"].set_number_value(std::isfinite(relative) ? relative : 1e308);
    entry["diverged"].set_bool_value(diverged);
    out << "    " << std::left << std::setw(10) << layers[layer].name << std::setw(10) << layers[layer].kind
        << std::right << std::scientific << std::setprecision(3) << std::setw(12) << relative
        << (diverged ? "  diverged" : "") << "\n";
  }
  j["threshold"].set_number_value(options.divergence_threshold);
  if (first_divergent.empty()) {
    j["first_divergent_layer"].set_null_value(google::protobuf::NULL_VALUE);
  } else {
    j["first_divergent_layer"].set_string_value(first_divergent);
  }
  if (first_divergent.empty()) {
    out << "  first divergent layer: none (every layer within " << std::scientific << std::setprecision(1)
        << options.divergence_threshold << ")\n";
  } else {
    out << "  first divergent layer: " << first_divergent << " (relative MAE " << std::scientific
        << std::setprecision(3) << first_value << ")\n";
  }
  result_out << (options.json ? wire::ToJson(json) + "\n" : out.str());
  return Status::Ok();
}

}  // namespace tessera
