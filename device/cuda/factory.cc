#include "device/cuda/factory.h"

#include <string>

#include "tessera/config.h"

#if TESSERA_HAVE_CUDA
#include "base/backend_module.h"
#include "device/cuda/module.h"
#endif

namespace tessera {

#if TESSERA_HAVE_CUDA

namespace {

// libtessera_cuda.so, loaded once on first use; the reason when it cannot be, and whether
// the driver was there. Without the driver no device can open, so the module (and cuBLAS with
// it) is not even mapped.
struct LoadedModule {
  Result<const CudaModule*> module;
  bool driver = false;  // libcuda.so.1 loaded: a failure is then the module's
};

const LoadedModule& LoadedCudaModule() {
  static const LoadedModule loaded = []() -> LoadedModule {
    if (Status driver = LoadSystemLibrary("libcuda.so.1"); !driver.ok()) {
      return {FailedPreconditionError("no CUDA driver: " + driver.message()), false};
    }
    return {LoadModuleTable<CudaModule>("CUDA", kCudaModuleFile, kCudaModuleEntry, kCudaModuleAbiVersion), true};
  }();
  return loaded;
}

}  // namespace

Viability CudaViability(const CudaDeviceOptions& options) {
  const Result<const CudaModule*>& module = LoadedCudaModule().module;
  if (!module.ok()) return {false, module.status().message()};
  return (*module)->viability(options);
}

Result<std::unique_ptr<Device>> CreateCudaDevice(const CudaDeviceOptions& options) {
  const Result<const CudaModule*>& module = LoadedCudaModule().module;
  if (!module.ok()) return UnavailableError("CUDA device: " + module.status().message());
  return (*module)->create(options);
}

Status CheckCudaModule() {
  const LoadedModule& loaded = LoadedCudaModule();
  if (!loaded.driver || loaded.module.ok()) return Status::Ok();
  return loaded.module.status();
}

#else

Viability CudaViability(const CudaDeviceOptions&) { return {false, "built without CUDA (TESSERA_HAVE_CUDA=0)"}; }

Result<std::unique_ptr<Device>> CreateCudaDevice(const CudaDeviceOptions&) {
  return UnimplementedError("this build of Tessera has no CUDA backend (TESSERA_HAVE_CUDA=0)");
}

Status CheckCudaModule() { return Status::Ok(); }

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
