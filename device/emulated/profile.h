// DeviceProfile: the datasheet of an accelerator that an emulated device models. Figures are
// the vendors' or the seed texts' claims, not measurements; `tessera devices` prints measured
// figures beside them.
//
// Profiles come built in ("a100", "ascend-910b", "alveo-u55c", "edge-npu", "generic") or
// from a TOML file. File format: one table per profile, named by the table:
//
//   [my-npu]
//   peak_tflops_fp32 = 8.0          # required, >= 0; the peak of the compute precision > 0
//   peak_tflops_fp16 = 64.0         # required, >= 0
//   peak_tflops_bf16 = 64.0         # optional (default: fp16's)
//   peak_tops_int8 = 128.0          # optional (default: twice fp16's)
//   memory_bandwidth_gbps = 400.0   # required, > 0 (GB/s, 1e9 bytes)
//   memory_bytes = 17179869184      # required, > 0
//   host_link_gbps = 16.0           # required, > 0 (GB/s each way)
//   power_watts = 75.0              # required, >= 0
//   precision = "fp16"              # optional: fp32 (default) | fp16 | bf16 | int8
//   native_ops = ["gemm", "relu"]   # required: Op names (device.h OpName) or ["all"]
//   dtypes = ["float32", "float16"] # optional (default: float32, int32 and the precision's)
//
// A profile's name is 1 to 64 letters, digits, '-', '_' or '.' (one with a '.' is a quoted key:
// ["npu.v2"]). Rates (peaks, power, bandwidths) are at most 1e9; the bandwidths at least 1e-6;
// memory_bytes below 2^63. The file must be a regular file (a FIFO or a device is refused
// without waiting for it); one over 1 MiB is refused unparsed. Every error names the file, the
// profile and the field, and shows what the file holds escaped and bounded.
//
// Thread safety: the functions share no mutable state.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "device/device.h"

namespace tessera {

struct DeviceProfile {
  std::string name;                 // "a100"
  double peak_tflops_fp32 = 0;      // dense peaks, 1e12 operations per second
  double peak_tflops_fp16 = 0;
  double peak_tflops_bf16 = 0;
  double peak_tops_int8 = 0;
  double memory_bandwidth_gbps = 0; // device memory, 1e9 bytes per second
  uint64_t memory_bytes = 0;        // device memory capacity
  double host_link_gbps = 0;        // host <-> device link, 1e9 bytes per second each way
  double power_watts = 0;
  std::set<Op> native_ops;          // ops the chip runs itself; the rest fall back to the host
  std::set<DType> dtypes;           // element types its buffers hold
  // Native op results are rounded to this (kFloat32: no rounding).
  DType precision = DType::kFloat32;
  std::string notes;                // where the figures come from and what is assumed

  // The peak of `dtype` in FLOP/s (int8: OP/s); kInt32 counts as float32.
  double PeakFlops(DType dtype) const;
  // The compute precision's peak divided by the memory bandwidth: FLOPs per byte above which
  // an op is compute-bound on this chip.
  double BalancePoint() const;
};

// The built-in profiles, in a fixed order.
const std::vector<DeviceProfile>& BuiltinProfiles();
// A built-in profile by name; InvalidArgument listing the known names when there is none.
Result<DeviceProfile> FindBuiltinProfile(const std::string& name);

// Every profile in a TOML file, sorted by name. NotFound when the file cannot be read;
// InvalidArgument for a file that is not a regular one, a parse error, a malformed profile
// name, or a missing, negative or malformed field (naming the file, the profile and the field).
Result<std::vector<DeviceProfile>> LoadProfiles(const std::string& path);
// Checks the figures of one profile; `origin` prefixes the message ("file.toml: ").
Status ValidateProfile(const DeviceProfile& profile, const std::string& origin);

// "fp32", "fp16", "bf16", "int8" for the compute precisions.
std::string_view PrecisionName(DType precision);

}  // namespace tessera
