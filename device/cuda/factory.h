// The CUDA backend's only public entry: a Device on one NVIDIA GPU through the CUDA runtime and
// cuBLAS.
//
// What runs where. Every op is native: GEMMs and the convolutions' GEMMs on cuBLAS (float32;
// TF32 tensor cores only when `allow_tf32`), everything else on the backend's own kernels
// (cuda_kernels.cu). Ops and copies are queued on one non-blocking stream per device;
// CopyDeviceToHost and Synchronize wait for it, as device.h says.
//
// Memory. Buffers come from a MemoryPool over cudaMalloc / cudaFree; convolution and reduction
// scratch is pooled and only grows, so a steady training step takes nothing from the driver.
//
// Loading. The device, its kernels, the CUDA runtime and cuBLAS live in the module
// libtessera_cuda.so (module.h), which this factory loads on the first viability check or
// creation; a process that never asks for CUDA never maps them (base/backend_module.h: where
// the module is looked for, TESSERA_MODULE_DIR). Without the CUDA driver (libcuda.so.1) the
// module is not loaded at all.
//
// Viability. Built only when the CUDA toolkit was found (TESSERA_HAVE_CUDA); at run time it
// needs the driver, the module and cudaGetDeviceCount() > 0. Otherwise viability() says why:
// "built without CUDA", "no CUDA driver: <the dynamic linker's reason>", "cannot load the
// CUDA backend: <the dynamic linker's reason>" (a missing cuBLAS, say) or "no CUDA device:
// <the CUDA runtime's error>". The first answer, loaded or not, holds for the process.
//
// Errors. A failed kernel launch or cuBLAS call, or scratch memory the device could not give
// an op, is kept (the first one) and reported by the next copy or Synchronize, naming the op
// (ResourceExhausted for memory, Internal otherwise); the op that failed does nothing more.
//
// Threads. Every call makes the device current (cudaSetDevice) first, so a device other than
// #0 works from any thread; capabilities().device_index says which one, for NCCL to use the
// same (collectives::CommunicatorOptions::device_index).
//
// Thread safety: as Device.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"
#include "device/device.h"
#include "device/registry.h"

namespace tessera {

struct CudaDeviceOptions {
  int device_index = 0;
  bool allow_tf32 = false;  // let cuBLAS round GEMM inputs to TF32 (Hopper/Ampere tensor cores)
};

Viability CudaViability(const CudaDeviceOptions& options = {});
// Unavailable with the CUDA runtime's error when the device cannot be opened; Unimplemented in
// a build without CUDA.
Result<std::unique_ptr<Device>> CreateCudaDevice(const CudaDeviceOptions& options = {});
// OK when this host has no CUDA driver (libcuda.so.1), in a build without CUDA, or when the
// driver and the module both load; otherwise FailedPrecondition with the loader's reason
// ("cannot load the CUDA backend: libtessera_cuda.so is in none of ..."): the driver is here
// but the module is missing, needs a library that is missing (cuBLAS) or is another build's.
// That is an install to fix, not a GPU missing here to fall back from: a worker asked for
// "cuda" checks it at start. Loads the driver and the module as the first question does.
Status CheckCudaModule();

// The name capabilities() shows: "NVIDIA H200 #0", "(TF32 GEMM)" appended when allowed. The
// runtime's device names mostly carry the vendor already ("NVIDIA H200"); it is added only
// when missing ("Tesla V100-SXM2-16GB" becomes "NVIDIA Tesla V100-SXM2-16GB #0").
std::string CudaDeviceName(std::string_view reported, int device_index, bool allow_tf32);

// The registry's entry for "cuda": priority 10 (preferred to xrt and cpu when viable).
DeviceBackend CudaDeviceBackend();

}  // namespace tessera
