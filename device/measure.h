// Measured figures of a device, to stand beside its datasheet: square float32 GEMM
// throughput and device-to-device copy bandwidth, eight operations queued per wait (a GPU's
// rate, not its launch latency). Blocks for about 0.3 s, and for at least eight of each.
#pragma once

#include "base/status.h"
#include "device/device.h"

namespace tessera {

struct DeviceMeasurement {
  double gemm_gflops = 0;  // 2 n^3 / time, 1e9 per second
  double copy_gbps = 0;    // bytes read plus written per second, 1e9 per second
};

// The largest n whose n * n fits an int (Gemm's dimensions are ints).
inline constexpr int kMaxMeasureGemmSize = 46340;

// `gemm_size` is n of the n x n GEMM (512 is a fair default); InvalidArgument outside
// [1, kMaxMeasureGemmSize].
Result<DeviceMeasurement> MeasureDevice(Device& device, int gemm_size);

}  // namespace tessera
