// The gloo backend as a loadable module: what factory.cc finds in libtessera_gloo.so.
// Internal to collectives/gloo/; everything else goes through factory.h and the registry.
//
// The module holds GlooCommunicator (communicator.cc) and links Gloo, which brings ibverbs
// and libnl with it (about 1 MB resident), so only a process that builds a gloo communicator
// maps them: a worker outside a cohort never does (base/backend_module.h says how the module
// is found and how it resolves Tessera's own symbols). Its one entry point,
// tessera_gloo_module_v<N>, returns the table below. A change to the table or to the
// signature of anything it points to raises kGlooModuleAbiVersion and the entry point's name
// with it.
//
// Thread safety: the table is constant; its function is as GlooCommunicator::Create.
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "collectives/communicator.h"
#include "collectives/store/store.h"

namespace tessera::collectives {

inline constexpr uint32_t kGlooModuleAbiVersion = 1;
inline constexpr char kGlooModuleFile[] = "libtessera_gloo.so";
inline constexpr char kGlooModuleEntry[] = "tessera_gloo_module_v1";

struct GlooModule {
  uint32_t abi_version;  // kGlooModuleAbiVersion of the module's build
  uint32_t table_bytes;  // sizeof(GlooModule) of the module's build
  // This rank's Gloo communicator, unwrapped, rendezvousing through `store`
  // (GlooCommunicator::Create).
  Result<std::unique_ptr<Communicator>> (*create)(const CommunicatorOptions& options, Store& store);
};

}  // namespace tessera::collectives

extern "C" const tessera::collectives::GlooModule* tessera_gloo_module_v1();
