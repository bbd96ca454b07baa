// Operator tools over the device layer: `tessera devices` and `tessera align`.
//
// DevicesCommand lists every registered device backend (and any extra names given), viable or
// not and why, with measured GEMM throughput (GFLOP/s) and device-copy bandwidth (GB/s) beside
// an emulated profile's datasheet figures. With `model` set it adds, per device, the migration
// risk list: one training step of the model, every op placed native / host fallback /
// unsupported, the bytes the fallbacks move across the host link per step, each op's
// arithmetic intensity against the device's balance point (compute- or bandwidth-bound) and
// the modelled step time.
//
// AlignCommand runs the same samples with the same weights through two devices and reports the
// per-sample MAE of the logits, top-1 agreement and the worst 5% of samples.
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
  std::string model;                      // "" (no risk list), "simplecnn" or "mlp"
  std::vector<std::string> extra_devices; // e.g. "emu:/etc/tessera/npu.toml"
  int gemm_size = 512;                    // square GEMM for the throughput figure
  int batch = 64;                         // the risk list's training-step batch
};
Status DevicesCommand(const DevicesOptions& options, std::ostream& out);

struct AlignOptions {
  std::string model = "simplecnn";
  std::string device_a = "cpu";
  std::string device_b = "emu:ascend-910b";
  int samples = 256;
  std::string data_dir;  // Fashion-MNIST; empty: the default directory
  uint64_t seed = 0;     // the weights
};
Status AlignCommand(const AlignOptions& options, std::ostream& out);

}  // namespace tessera
