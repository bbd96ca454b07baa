// libtessera_cuda.so's entry point (module.h). Built into the module with cuda_device.cc and
// the kernels, never into tessera_device.
#include "device/cuda/module.h"

#include <cuda_runtime.h>

#include <string>

#include "device/cuda/cuda_device.h"

namespace tessera {
namespace {

Viability ModuleViability(const CudaDeviceOptions& options) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // clear it so later calls do not report it again
    return {false, std::string("no CUDA device: ") + cudaGetErrorString(error)};
  }
  if (count == 0) return {false, "no CUDA device: cudaGetDeviceCount found 0 devices"};
  if (options.device_index < 0 || options.device_index >= count) {
    return {false, "no CUDA device #" + std::to_string(options.device_index) + ": " + std::to_string(count) +
                       " visible"};
  }
  return {true, ""};
}

Result<std::unique_ptr<Device>> ModuleCreate(const CudaDeviceOptions& options) {
  Viability viability = ModuleViability(options);
  if (!viability.viable) return UnavailableError("CUDA device: " + viability.reason);
  return CudaDevice::Create(options);
}

constexpr CudaModule kModule{kCudaModuleAbiVersion, sizeof(CudaModule), &ModuleViability, &ModuleCreate};

}  // namespace
}  // namespace tessera

extern "C" __attribute__((visibility("default"))) const tessera::CudaModule* tessera_cuda_module_v1() {
  return &tessera::kModule;
}
