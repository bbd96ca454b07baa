// Operator tools over the device layer: `tessera devices` and `tessera align`.
//
// DevicesCommand lists every registered device backend (and any extra names given), viable or
// not and why, with measured GEMM throughput (GFLOP/s) and device-copy bandwidth (GB/s) beside
// an emulated profile's datasheet figures. With `model` set it adds, per device, the migration
// risk list of one training step: for EVERY LAYER (then the loss and the optimiser step) each
// op it issues placed native / host fallback / unsupported, the bytes the fallbacks move
// across the host link, the layer's arithmetic intensity against the device's balance point
// (compute- or bandwidth-bound) and its modelled time; then the per-op account of a real
// training step on the device and the modelled step time. A name given in `devices` or
// `extra_devices` that no backend knows, an emulated profile that does not load, and a `model`
// that is not a built-in model or a job file that reads, are InvalidArgument naming them,
// before any device is measured or anything printed.
//
// AlignCommand runs the same samples with the same weights through two devices and reports the
// per-sample MAE of the logits, top-1 agreement, the worst 5% of samples, each layer's
// relative MAE (mean |a - b| / mean |a| over its outputs) and the first layer whose relative
// MAE exceeds `divergence_threshold`. Unknown device names are InvalidArgument naming them.
//
// Both write a human-readable report to `out` and block until done (seconds).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera {

struct DevicesOptions {
  std::string model;                      // "" (no risk list), a built-in model or a job file (.toml)
  std::vector<std::string> extra_devices; // e.g. "emu:/etc/tessera/npu.toml"
  std::vector<std::string> devices;       // when not empty: only these, instead of every
                                          // registered backend (extra_devices still follow)
  int gemm_size = 512;                    // square GEMM for the throughput figure
  int batch = 64;                         // the risk list's training-step batch
  bool json = false;                      // one JSON object per device (without the risk list)
};
// The options' usage errors, before anything is measured: --json with a model (the JSON has no
// risk list) is InvalidArgument naming both flags.
Status CheckDevicesOptions(const DevicesOptions& options);
Status DevicesCommand(const DevicesOptions& options, std::ostream& out);

struct AlignOptions {
  std::string model = "simplecnn";  // a built-in model or a job file (.toml); inputs are Fashion-MNIST
                                    // for a 1x28x28 model, seeded random values of its shape otherwise
  std::string device_a = "cpu";
  std::string device_b = "emu:ascend-910b";
  int samples = 256;
  std::string data_dir;  // Fashion-MNIST; empty: the default directory
  uint64_t seed = 0;     // the weights
  double divergence_threshold = 1e-3;  // relative MAE past which a layer counts as diverged
  bool json = false;                   // the result as one JSON object
};
Status AlignCommand(const AlignOptions& options, std::ostream& out);

}  // namespace tessera
