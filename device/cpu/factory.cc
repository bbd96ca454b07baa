#include "device/cpu/factory.h"

#include "device/cpu/cpu_device.h"

namespace tessera {

std::unique_ptr<Device> CreateCpuDevice(const CpuDeviceOptions& options) {
  return std::make_unique<CpuDevice>(options);
}

DeviceBackend CpuDeviceBackend() {
  DeviceBackend backend;
  backend.name = "cpu";
  backend.priority = 0;
  backend.viability = [] { return Viability{true, ""}; };
  backend.create = []() -> Result<std::unique_ptr<Device>> { return CreateCpuDevice(); };
  return backend;
}

}  // namespace tessera
