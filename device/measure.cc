#include "device/measure.h"

#include <chrono>
#include <string>

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

Result<DeviceMeasurement> MeasureDevice(Device& device, int size) {
  // n x n must stay an int for Gemm's m * n, and a negative n would turn into a huge size_t
  // (size_t(-1) * -1 is 1: a one-float buffer for a GEMM of "n = -1").
  if (size < 1 || size > kMaxMeasureGemmSize) {
    return InvalidArgumentError("the measuring GEMM's size must be in [1, " + std::to_string(kMaxMeasureGemmSize) +
                                "], got " + std::to_string(size));
  }
  const size_t floats = size_t(size) * size;
  ASSIGN_OR_RETURN(DeviceBuffer a, device.Allocate(floats * sizeof(float)));
  ASSIGN_OR_RETURN(DeviceBuffer c, device.Allocate(floats * sizeof(float)));
  device.Fill(int64_t(floats), 0.5f, a.f32());
  device.Gemm(false, false, size, size, size, 1.0f, a.f32(), a.f32(), 0.0f, c.f32());  // warm-up
  RETURN_IF_ERROR(device.Synchronize());
  DeviceMeasurement measured;
  // Eight GEMMs queued per wait: a GPU's rate, not its launch-and-wait latency (a 256^3 GEMM
  // takes microseconds on one, about what a synchronise costs). The CPU runs them as queued.
  constexpr int kQueued = 8;
  int repeats = 0;
  auto start = Clock::now();
  do {
    for (int i = 0; i < kQueued; ++i) {
      device.Gemm(false, false, size, size, size, 1.0f, a.f32(), a.f32(), 0.0f, c.f32());
    }
    RETURN_IF_ERROR(device.Synchronize());
    repeats += kQueued;
  } while (SecondsSince(start) < 0.2);
  measured.gemm_gflops = 2.0 * size * size * size * repeats / SecondsSince(start) / 1e9;
  repeats = 0;
  start = Clock::now();
  do {
    for (int i = 0; i < kQueued; ++i) RETURN_IF_ERROR(device.CopyDeviceToDevice(a, 0, c, 0, floats * sizeof(float)));
    RETURN_IF_ERROR(device.Synchronize());
    repeats += kQueued;
  } while (SecondsSince(start) < 0.1);
  measured.copy_gbps = 2.0 * floats * sizeof(float) * repeats / SecondsSince(start) / 1e9;  // read + write
  return measured;
}

}  // namespace tessera
