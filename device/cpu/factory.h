// The CPU backend's only public entry: a Device over host memory whose GEMMs go to OpenBLAS
// and whose other ops are vectorised loops.
#pragma once

#include <memory>

#include "device/device.h"
#include "device/registry.h"

namespace tessera {

struct CpuDeviceOptions {
  // OpenBLAS threads; 0 leaves OpenBLAS's default. The setting is process-wide (OpenBLAS has
  // one thread pool), so the last CPU device created with a non-zero value wins.
  int num_threads = 0;
};

std::unique_ptr<Device> CreateCpuDevice(const CpuDeviceOptions& options = {});

// The registry's entry for "cpu": always viable, priority 0.
DeviceBackend CpuDeviceBackend();

}  // namespace tessera
