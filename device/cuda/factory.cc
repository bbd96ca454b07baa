#include "device/cuda/factory.h"

#include <string>

#include "tessera/config.h"

#if TESSERA_HAVE_CUDA
#include <cuda_runtime.h>

#include "device/cuda/cuda_device.h"
#endif

namespace tessera {

#if TESSERA_HAVE_CUDA

Viability CudaViability(const CudaDeviceOptions& options) {
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

Result<std::unique_ptr<Device>> CreateCudaDevice(const CudaDeviceOptions& options) {
  Viability viability = CudaViability(options);
  if (!viability.viable) return UnavailableError("CUDA device: " + viability.reason);
  return CudaDevice::Create(options);
}

#else

Viability CudaViability(const CudaDeviceOptions&) { return {false, "built without CUDA (TESSERA_HAVE_CUDA=0)"}; }

Result<std::unique_ptr<Device>> CreateCudaDevice(const CudaDeviceOptions&) {
  return UnimplementedError("this build of Tessera has no CUDA backend (TESSERA_HAVE_CUDA=0)");
}

#endif

std::string CudaDeviceName(std::string_view reported, int device_index, bool allow_tf32) {
  std::string name(reported);
  if (name.rfind("NVIDIA", 0) != 0) name = "NVIDIA " + name;
  name += " #" + std::to_string(device_index);
  if (allow_tf32) name += " (TF32 GEMM)";
  return name;
}

DeviceBackend CudaDeviceBackend() {
  DeviceBackend backend;
  backend.name = "cuda";
  backend.priority = 10;
  backend.viability = [] { return CudaViability(); };
  backend.create = [] { return CreateCudaDevice(); };
  return backend;
}

}  // namespace tessera
