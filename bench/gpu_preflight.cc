// gpu_preflight: what this machine offers a CUDA build of Tessera, checked in seconds before
// anything longer runs on it (scripts/gpu-check.sh's first step). It prints the CUDA driver's
// version beside the runtime this build was made with (the driver must be of the same major
// version or newer), every visible device (name, compute capability, memory) against the
// architectures this build holds machine code for, cuBLAS's and NCCL's versions; then it runs
// one fill, one reduction and one GEMM through the Device interface and a one-rank NCCL
// allreduce on device buffers, and checks their results.
//
// Its last line is "preflight: PASS", "preflight: FAIL (<what>)" or "preflight: NO GPU
// (<why>)". Exit status: 0 passed, 1 failed, 2 no usable GPU here (nothing was checked: not a
// pass).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "collectives/nccl/factory.h"
#include "collectives/registry.h"
#include "collectives/store/hash_store.h"
#include "device/cuda/factory.h"
#include "device/device.h"

namespace {

std::string Version(int code) {  // CUDA's 13000 -> "13.0"
  return std::to_string(code / 1000) + "." + std::to_string(code % 1000 / 10);
}

int NoGpu(const std::string& why) {
  std::cout << "preflight: NO GPU (" << why << ")\n";
  return 2;
}

int Fail(const std::string& what) {
  std::cout << "preflight: FAIL (" << what << ")\n";
  return 1;
}

// The lowest architecture this build has code for: "90", or "90,100", from CMake.
int LowestArchitecture() {
  int lowest = 0;
  std::stringstream list(TESSERA_CUDA_ARCHITECTURES);
  std::string item;
  while (std::getline(list, item, ',')) {
    const int value = std::atoi(item.c_str());
    if (value > 0 && (lowest == 0 || value < lowest)) lowest = value;
  }
  return lowest;
}

}  // namespace

int main() {
  using namespace tessera;
  int driver = 0;
  (void)cudaDriverGetVersion(&driver);
  std::cout << "CUDA runtime of this build: " << Version(CUDART_VERSION) << "\n";
  if (driver == 0) return NoGpu("no CUDA driver is installed");
  std::cout << "CUDA driver: " << Version(driver) << "\n";
  if (driver / 1000 < CUDART_VERSION / 1000) {
    return Fail("the CUDA driver " + Version(driver) + " is older than this build's runtime " +
                Version(CUDART_VERSION) + " (major versions differ)");
  }
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted == cudaErrorNoDevice || (counted == cudaSuccess && count == 0)) {
    (void)cudaGetLastError();
    return NoGpu("the driver sees no CUDA device");
  }
  if (counted != cudaSuccess) return Fail(std::string("cudaGetDeviceCount: ") + cudaGetErrorString(counted));
  const int lowest = LowestArchitecture();
  std::cout << "devices: " << count << "; this build has code for sm_" << TESSERA_CUDA_ARCHITECTURES << "\n";
  for (int index = 0; index < count; ++index) {
    cudaDeviceProp properties{};
    const cudaError_t got = cudaGetDeviceProperties(&properties, index);
    if (got != cudaSuccess) return Fail(std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(got));
    const int capability = properties.major * 10 + properties.minor;
    std::cout << "  #" << index << ": " << properties.name << ", compute capability " << properties.major << "."
              << properties.minor << ", " << properties.totalGlobalMem / (1ull << 20) << " MiB, "
              << properties.multiProcessorCount << " multiprocessors\n";
    if (capability < lowest) {
      return Fail("device #" + std::to_string(index) + " has compute capability " + std::to_string(capability) +
                  ", below the sm_" + std::to_string(lowest) + " this build targets");
    }
  }
  int blas_major = 0, blas_minor = 0, blas_patch = 0;
  cublasGetProperty(MAJOR_VERSION, &blas_major);
  cublasGetProperty(MINOR_VERSION, &blas_minor);
  cublasGetProperty(PATCH_LEVEL, &blas_patch);
  std::cout << "cuBLAS: " << blas_major << "." << blas_minor << "." << blas_patch << "\n";
  auto nccl = collectives::ProbeNcclEnvironment();
  if (!nccl.ok()) return Fail("NCCL: " + nccl.status().ToString());
  std::cout << "NCCL: " << nccl->version << " (" << nccl->devices << " devices)\n";

  // One kernel, one reduction and one GEMM through the Device interface.
  const Viability viability = CudaViability();
  if (!viability.viable) return Fail("CudaViability: " + viability.reason);
  auto created = CreateCudaDevice();
  if (!created.ok()) return Fail(created.status().ToString());
  Device& device = **created;
  std::cout << "Device: " << device.capabilities().name << "\n";
  const int n = 64;
  auto a = device.Allocate(n * n * sizeof(float)), c = device.Allocate(n * n * sizeof(float));
  auto sum = device.Allocate(sizeof(float));
  if (!a.ok() || !c.ok() || !sum.ok()) return Fail("cannot allocate 32 KiB on the device");
  device.Fill(n * n, 0.5f, a->f32());
  device.Gemm(false, true, n, n, n, 1.0f, a->f32(), a->f32(), 0.0f, c->f32());
  device.ReduceSum(n * n, c->f32(), sum->f32());
  float total = 0;
  Status copied = device.CopyDeviceToHost(*sum, 0, &total, sizeof(total));
  if (!copied.ok()) return Fail(copied.ToString());
  const float expected = 0.25f * n * n * n;  // every entry of a a^T is n / 4
  std::cout << "fill + gemm + reduce_sum: " << total << " (expected " << expected << ")\n";
  if (total != expected) return Fail("fill + gemm + reduce_sum gave " + std::to_string(total));

  // A one-rank NCCL allreduce on that device's memory.
  collectives::CommunicatorOptions options;
  options.backend = "nccl";
  options.location = collectives::BufferLocation::kDevice;
  options.device_index = device.capabilities().device_index;
  options.timeout_ms = 20000;
  auto communicator = collectives::CreateCommunicator(options, std::make_shared<collectives::HashStore>());
  if (!communicator.ok()) return Fail("NCCL communicator: " + communicator.status().ToString());
  Status reduced = (*communicator)->Allreduce(c->data(), a->data(), n * n, collectives::DataType::kFloat32,
                                              collectives::ReduceOp::kSum);
  if (!reduced.ok()) return Fail("NCCL allreduce: " + reduced.ToString());
  device.ReduceSum(n * n, a->f32(), sum->f32());
  copied = device.CopyDeviceToHost(*sum, 0, &total, sizeof(total));
  if (!copied.ok()) return Fail(copied.ToString());
  std::cout << "nccl allreduce (1 rank): " << total << " (expected " << expected << ")\n";
  if (total != expected) return Fail("the one-rank NCCL allreduce gave " + std::to_string(total));
  std::cout << "preflight: PASS\n";
  return 0;
}
