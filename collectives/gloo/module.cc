// libtessera_gloo.so's entry point (module.h). Built into the module with communicator.cc,
// never into tessera_collectives.
#include "collectives/gloo/module.h"

#include "collectives/gloo/communicator.h"

namespace tessera::collectives {
namespace {

Result<std::unique_ptr<Communicator>> ModuleCreate(const CommunicatorOptions& options, Store& store) {
  ASSIGN_OR_RETURN(auto communicator, GlooCommunicator::Create(options, store));
  return std::unique_ptr<Communicator>(std::move(communicator));
}

constexpr GlooModule kModule{kGlooModuleAbiVersion, sizeof(GlooModule), &ModuleCreate};

}  // namespace
}  // namespace tessera::collectives

extern "C" __attribute__((visibility("default"))) const tessera::collectives::GlooModule* tessera_gloo_module_v1() {
  return &tessera::collectives::kModule;
}
