// The nccl backend's entry point for the registry (collectives/registry.h). Always declared;
// when the backend is not built, the returned backend says so from Viable().
//
// Loading. NcclCommunicator, NCCL and the CUDA runtime live in the module libtessera_nccl.so
// (module.h), which this factory loads the first time it is asked for device buffers (Viable,
// Create, ProbeNcclEnvironment); asked for host buffers it refuses without loading anything,
// so a process whose communicators move host buffers never maps NCCL
// (base/backend_module.h: where the module is looked for, TESSERA_MODULE_DIR). Without the
// CUDA driver (libcuda.so.1) the module is not loaded at all: FailedPrecondition "no CUDA
// driver: <the dynamic linker's reason>"; a module that cannot be loaded is
// FailedPrecondition "cannot load the nccl backend: <the dynamic linker's reason>". The first
// answer, loaded or not, holds for the process.
#pragma once

#include <memory>
#include <string>

#include "collectives/registry.h"

namespace tessera::collectives {

std::unique_ptr<CommunicatorBackend> MakeNcclBackend();

// What NCCL would run on in this process: the linked library's version ("2.28.9") and the
// CUDA devices visible (a communicator needs one per rank of this process). Unimplemented in
// a build without NCCL; FailedPrecondition when the driver or the module cannot be loaded
// (as above) or no device is visible (the CUDA runtime's reason). Initialises CUDA in the
// calling process: a process that will fork ranks which use CUDA must ask from a child.
struct NcclEnvironment {
  std::string version;
  int devices = 0;
};
Result<NcclEnvironment> ProbeNcclEnvironment();

}  // namespace tessera::collectives
