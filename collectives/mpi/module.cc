// libtessera_mpi.so's entry point (module.h). Built into the module with communicator.cc,
// never into tessera_collectives.
#include "collectives/mpi/module.h"

#include "collectives/mpi/communicator.h"

namespace tessera::collectives {
namespace {

Result<std::unique_ptr<Communicator>> ModuleCreate(const CommunicatorOptions& options) {
  ASSIGN_OR_RETURN(auto communicator, MpiCommunicator::Create(options));
  return std::unique_ptr<Communicator>(std::move(communicator));
}

constexpr MpiModule kModule{kMpiModuleAbiVersion, sizeof(MpiModule), &ModuleCreate};

}  // namespace
}  // namespace tessera::collectives

extern "C" __attribute__((visibility("default"))) const tessera::collectives::MpiModule* tessera_mpi_module_v1() {
  return &tessera::collectives::kModule;
}
