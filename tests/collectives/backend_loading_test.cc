// NCCL and CUDA are modules loaded on first use (base/backend_module.h): a process that trains
// on the CPU and talks over host buffers never maps them, and the NCCL module, once loaded,
// resolves everything it takes from this executable.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "base/backend_module.h"
#include "collectives/nccl/module.h"
#include "device/registry.h"
#include "test_backends.h"

namespace tessera::collectives::testing {
namespace {

// The lines of /proc/self/maps naming a CUDA, cuBLAS or NCCL library (the modules included).
std::vector<std::string> CudaMappings() {
  static const std::regex cuda("cublas|cudart|libcuda\\.|nccl|libtessera_cuda");
  std::vector<std::string> found;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (std::regex_search(line, cuda)) found.push_back(line);
  }
  return found;
}

TEST(BackendLoadingTest, ACpuDeviceAndHostCommunicatorsMapNoCudaLibrary) {
  if (!CudaMappings().empty()) {
    GTEST_SKIP() << "an earlier test loaded CUDA into this process (" << CudaMappings().front()
                 << "); run this test in a process of its own, as ctest does";
  }
  auto device = CreateDevice("cpu");
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  // "auto" over host buffers asks every backend, nccl first, whether it can serve.
  World world(2, RankMode::kThreads);
  std::vector<std::string> chosen(2);
  auto results = RunRanks(2, RankMode::kThreads, [&](int rank) -> Status {
    ASSIGN_OR_RETURN(auto c, world.Create("auto", rank, 10000));
    float x[4] = {1, 2, 3, 4};
    RETURN_IF_ERROR(c->Allreduce(x, x, 4, DataType::kFloat32, ReduceOp::kSum));
    if (x[3] != 8) return InternalError("wrong allreduce result: " + std::to_string(x[3]));
    chosen[rank] = std::string(c->backend_name());
    return Status::Ok();
  });
  ASSERT_TRUE(results[0].ok()) << results[0].ToString();
  ASSERT_TRUE(results[1].ok()) << results[1].ToString();
  const std::vector<std::string> mapped = CudaMappings();
  EXPECT_TRUE(mapped.empty()) << "mapped after a cpu device and a host-buffer communicator (" << chosen[0]
                              << "): " << mapped.front();
}

TEST(BackendLoadingTest, NcclAskedForHostBuffersSaysSoWithoutLoadingAnything) {
  const CommunicatorBackend* nccl = CommunicatorRegistry::Global().Find("nccl");
  ASSERT_NE(nccl, nullptr);
  const bool clean_before = CudaMappings().empty();
  CommunicatorOptions options;
  options.location = BufferLocation::kHost;
  Status viable = nccl->Viable(options);
  ASSERT_FALSE(viable.ok());
  if (viable.code() == StatusCode::kUnimplemented) GTEST_SKIP() << viable.ToString();
  EXPECT_NE(viable.message().find("device buffers only"), std::string::npos) << viable.ToString();
  if (clean_before) {
    EXPECT_TRUE(CudaMappings().empty()) << CudaMappings().front();
  }
}

// The module itself, loaded here whether or not a driver is present: every symbol it takes
// from this executable resolves and its table is the version this build expects. Its probe
// initialises CUDA where there is a GPU, so forked NCCL ranks are skipped afterwards.
TEST(NcclModuleTest, TheModuleLoadsIntoThisExecutableAndAnswers) {
  CommunicatorOptions device_buffers;
  device_buffers.location = BufferLocation::kDevice;
  const Status viable = MakeNcclBackend()->Viable(device_buffers);
  if (viable.code() == StatusCode::kUnimplemented) GTEST_SKIP() << viable.ToString();
  auto entry = LoadBackendModule(kNcclModuleFile, kNcclModuleEntry);
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  const NcclModule* module = reinterpret_cast<const NcclModule* (*)()>(*entry)();
  ASSERT_NE(module, nullptr);
  EXPECT_EQ(module->abi_version, kNcclModuleAbiVersion);
  EXPECT_EQ(module->table_bytes, sizeof(NcclModule));
  CudaInitialisedHere() = true;
  auto environment = module->probe();
  if (environment.ok()) {
    EXPECT_GE(environment->devices, 1);
    EXPECT_FALSE(environment->version.empty());
  } else {
    EXPECT_EQ(environment.status().code(), StatusCode::kFailedPrecondition) << environment.status().ToString();
    EXPECT_NE(environment.status().message().find("CUDA"), std::string::npos) << environment.status().ToString();
  }
}

}  // namespace
}  // namespace tessera::collectives::testing
