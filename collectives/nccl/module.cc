// libtessera_nccl.so's entry point (module.h). Built into the module with communicator.cc,
// never into tessera_collectives.
#include "collectives/nccl/module.h"

#include "collectives/nccl/communicator.h"

namespace tessera::collectives {
namespace {

Result<std::unique_ptr<Communicator>> ModuleCreate(const CommunicatorOptions& options, Store& store) {
  ASSIGN_OR_RETURN(auto communicator, NcclCommunicator::Create(options, store));
  return std::unique_ptr<Communicator>(std::move(communicator));
}

constexpr NcclModule kModule{kNcclModuleAbiVersion, sizeof(NcclModule), &NcclCommunicator::DevicePresent,
                             &NcclCommunicator::Probe, &ModuleCreate};

}  // namespace
}  // namespace tessera::collectives

extern "C" __attribute__((visibility("default"))) const tessera::collectives::NcclModule* tessera_nccl_module_v1() {
  return &tessera::collectives::kModule;
}
