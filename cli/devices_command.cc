#include "cli/devices_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <random>

#include "core/data/idx.h"
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "device/emulated/factory.h"
#include "device/placement.h"
#include "device/registry.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Measured {
  double gemm_gflops = 0;
  double copy_gbps = 0;
};

Result<Measured> Measure(Device& device, int size) {
  const size_t floats = size_t(size) * size;
  ASSIGN_OR_RETURN(DeviceBuffer a, device.Allocate(floats * sizeof(float)));
  ASSIGN_OR_RETURN(DeviceBuffer c, device.Allocate(floats * sizeof(float)));
  device.Fill(int64_t(floats), 0.5f, a.f32());
  device.Gemm(false, false, size, size, size, 1.0f, a.f32(), a.f32(), 0.0f, c.f32());  // warm-up
  RETURN_IF_ERROR(device.Synchronize());
  Measured measured;
  int repeats = 0;
  auto start = Clock::now();
  do {
    device.Gemm(false, false, size, size, size, 1.0f, a.f32(), a.f32(), 0.0f, c.f32());
    RETURN_IF_ERROR(device.Synchronize());
    ++repeats;
  } while (SecondsSince(start) < 0.2);
  measured.gemm_gflops = 2.0 * size * size * size * repeats / SecondsSince(start) / 1e9;
  repeats = 0;
  start = Clock::now();
  do {
    RETURN_IF_ERROR(device.CopyDeviceToDevice(a, 0, c, 0, floats * sizeof(float)));
    RETURN_IF_ERROR(device.Synchronize());
    ++repeats;
  } while (SecondsSince(start) < 0.1);
  measured.copy_gbps = 2.0 * floats * sizeof(float) * repeats / SecondsSince(start) / 1e9;  // read + write
  return measured;
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

Status RiskList(Device& device, const DevicesOptions& options, std::ostream& out) {
  OpPlacement* placement = device.placement();
  ModelConfig config;
  config.name = options.model;
  ASSIGN_OR_RETURN(auto model, CreateModel(config, &device));
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
  out << "  migration risk, " << options.model << " training step, batch " << options.batch << ":\n";
  out << "    " << std::left << std::setw(24) << "op" << std::setw(15) << "placement" << std::right << std::setw(7)
      << "calls" << std::setw(14) << "FLOPs/byte" << std::setw(11) << "bound" << std::setw(16) << "host-link B"
      << std::setw(13) << "modelled ms" << "\n";
  uint64_t fallback_bytes = 0;
  for (Op op : AllOps()) {
    const Placement where = placement != nullptr ? placement->Place(op)
                            : device.capabilities().Supports(op) ? Placement::kNative
                                                                 : Placement::kUnsupported;
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

Status DevicesCommand(const DevicesOptions& options, std::ostream& out) {
  std::vector<std::string> names;
  for (const auto& backend : RegisteredDeviceBackends()) names.push_back(backend.name);
  names.insert(names.end(), options.extra_devices.begin(), options.extra_devices.end());
  for (const std::string& name : names) {
    out << name << "\n";
    std::string reason;
    for (const auto& backend : RegisteredDeviceBackends()) {
      if (backend.name != name) continue;
      Viability viability = backend.viability();
      if (!viability.viable) reason = viability.reason.empty() ? "not viable" : viability.reason;
    }
    if (!reason.empty()) {
      out << "  not viable: " << reason << "\n";
      continue;
    }
    auto device = CreateDevice(name);
    if (!device.ok()) {
      out << "  not viable: " << device.status().ToString() << "\n";
      continue;
    }
    const DeviceCapabilities& capabilities = (*device)->capabilities();
    out << "  " << capabilities.name << "; native ops " << capabilities.native_ops.size() << "/" << AllOps().size()
        << "; computes in " << DTypeName(capabilities.compute_precision) << "\n";
    auto measured = Measure(**device, options.gemm_size);
    if (!measured.ok()) {
      out << "  measurement failed: " << measured.status().ToString() << "\n";
      continue;
    }
    out << std::fixed << std::setprecision(1) << "  measured: GEMM " << measured->gemm_gflops
        << " GFLOP/s, device copy " << measured->copy_gbps << " GB/s";
    if (const DeviceProfile* profile = EmulatedProfile(**device)) {
      out << "; datasheet: " << profile->PeakFlops(profile->precision) / 1e9 << " GFLOP/s ("
          << DTypeName(profile->precision) << "), " << profile->memory_bandwidth_gbps << " GB/s, "
          << profile->power_watts << " W (emulated on this host)";
    }
    out << "\n";
    if (!options.model.empty()) RETURN_IF_ERROR(RiskList(**device, options, out));
  }
  return Status::Ok();
}

Status AlignCommand(const AlignOptions& options, std::ostream& out) {
  if (options.samples <= 0) return InvalidArgumentError("align: --samples must be positive");
  ASSIGN_OR_RETURN(Dataset data, LoadFashionMnist(options.data_dir, false));
  const int count = static_cast<int>(std::min<int64_t>(options.samples, data.count));
  std::vector<std::vector<float>> logits(2);
  int classes = 0;
  TensorSet weights;
  const std::string names[2] = {options.device_a, options.device_b};
  for (int side = 0; side < 2; ++side) {
    ASSIGN_OR_RETURN(auto device, CreateDevice(names[side]));
    ModelConfig config;
    config.name = options.model;
    config.seed = options.seed;
    ASSIGN_OR_RETURN(auto model, CreateModel(config, device.get()));
    if (side == 0) weights = model->GetState();
    RETURN_IF_ERROR(model->SetState(weights));
    classes = model->classes();
    const size_t sample = size_t(data.SampleSize());
    ASSIGN_OR_RETURN(DeviceBuffer input, device->Allocate(size_t(count) * sample * sizeof(float)));
    RETURN_IF_ERROR(device->CopyHostToDevice(data.images.data(), input, 0, size_t(count) * sample * sizeof(float)));
    ASSIGN_OR_RETURN(const float* result, model->Forward(input.f32(), count));
    (void)result;
    logits[side].resize(size_t(count) * classes);
    RETURN_IF_ERROR(device->CopyDeviceToHost(model->logits_buffer(), 0, logits[side].data(),
                                             logits[side].size() * sizeof(float)));
  }
  std::vector<std::pair<double, int>> errors;
  int agree = 0;
  for (int i = 0; i < count; ++i) {
    const float* a = logits[0].data() + size_t(i) * classes;
    const float* b = logits[1].data() + size_t(i) * classes;
    double mae = 0;
    for (int j = 0; j < classes; ++j) mae += std::fabs(double(a[j]) - b[j]);
    errors.push_back({mae / classes, i});
    agree += std::max_element(a, a + classes) - a == std::max_element(b, b + classes) - b;
  }
  std::sort(errors.rbegin(), errors.rend());
  double mean = 0;
  for (const auto& [mae, index] : errors) mean += mae;
  out << "align " << options.model << ": " << names[0] << " vs " << names[1] << ", " << count << " samples\n"
      << std::scientific << std::setprecision(3) << "  mean per-sample logit MAE " << mean / count << "\n"
      << std::fixed << std::setprecision(2) << "  top-1 agreement " << 100.0 * agree / count << "%\n"
      << "  worst 5% (sample: MAE):";
  const size_t worst = std::max<size_t>(1, errors.size() / 20);
  for (size_t i = 0; i < worst; ++i) out << " " << errors[i].second << ":" << std::scientific << errors[i].first;
  out << "\n";
  return Status::Ok();
}

}  // namespace tessera
