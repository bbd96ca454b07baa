// The CUDA backend as a loadable module: what factory.cc finds in libtessera_cuda.so.
// Internal to device/cuda/; everything else goes through factory.h.
//
// The module holds the device (cuda_device.cc) and its kernels and links the CUDA runtime and
// cuBLAS, so only a process that asks for CUDA maps them (base/backend_module.h says how the
// module is found and how it resolves Tessera's own symbols). Its one entry point,
// tessera_cuda_module_v<N>, returns the table below. A change to the table or to the
// signature of anything it points to raises kCudaModuleAbiVersion and the entry point's name
// with it.
//
// Thread safety: the table is constant; its functions are as CudaViability and
// CreateCudaDevice in factory.h.
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "device/cuda/factory.h"
#include "device/device.h"
#include "device/registry.h"

namespace tessera {

inline constexpr uint32_t kCudaModuleAbiVersion = 1;
inline constexpr char kCudaModuleFile[] = "libtessera_cuda.so";
inline constexpr char kCudaModuleEntry[] = "tessera_cuda_module_v1";

struct CudaModule {
  uint32_t abi_version;  // kCudaModuleAbiVersion of the module's build
  uint32_t table_bytes;  // sizeof(CudaModule) of the module's build
  // Whether options.device_index is a visible CUDA device; why not otherwise ("no CUDA
  // device: <the runtime's error>").
  Viability (*viability)(const CudaDeviceOptions& options);
  // Opens the device; Unavailable with the runtime's reason when it cannot.
  Result<std::unique_ptr<Device>> (*create)(const CudaDeviceOptions& options);
};

}  // namespace tessera

extern "C" const tessera::CudaModule* tessera_cuda_module_v1();
