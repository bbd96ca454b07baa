// The nccl backend as a loadable module: what factory.cc finds in libtessera_nccl.so.
// Internal to collectives/nccl/; everything else goes through factory.h and the registry.
//
// The module holds NcclCommunicator (communicator.cc) and links NCCL and the CUDA runtime, so
// only a process that asks NCCL for device buffers maps them (base/backend_module.h says how
// the module is found and how it resolves Tessera's own symbols). Its one entry point,
// tessera_nccl_module_v<N>, returns the table below. A change to the table or to the
// signature of anything it points to raises kNcclModuleAbiVersion and the entry point's name
// with it.
//
// Thread safety: the table is constant; its functions are as NcclCommunicator's.
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "collectives/communicator.h"
#include "collectives/nccl/factory.h"
#include "collectives/store/store.h"

namespace tessera::collectives {

inline constexpr uint32_t kNcclModuleAbiVersion = 1;
inline constexpr char kNcclModuleFile[] = "libtessera_nccl.so";
inline constexpr char kNcclModuleEntry[] = "tessera_nccl_module_v1";

struct NcclModule {
  uint32_t abi_version;  // kNcclModuleAbiVersion of the module's build
  uint32_t table_bytes;  // sizeof(NcclModule) of the module's build
  // OK when a CUDA device is visible; FailedPrecondition with the runtime's reason otherwise.
  Status (*device_present)();
  // The loaded NCCL's version and the CUDA devices visible (ProbeNcclEnvironment).
  Result<NcclEnvironment> (*probe)();
  // This rank's NCCL communicator, unwrapped, rendezvousing through `store`
  // (NcclCommunicator::Create).
  Result<std::unique_ptr<Communicator>> (*create)(const CommunicatorOptions& options, Store& store);
};

}  // namespace tessera::collectives

extern "C" const tessera::collectives::NcclModule* tessera_nccl_module_v1();
