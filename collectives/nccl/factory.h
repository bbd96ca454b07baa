// The nccl backend's entry point for the registry (collectives/registry.h). Always declared;
// when the backend is not built, the returned backend says so from Viable().
#pragma once

#include <memory>
#include <string>

#include "collectives/registry.h"

namespace tessera::collectives {

std::unique_ptr<CommunicatorBackend> MakeNcclBackend();

// What NCCL would run on in this process: the linked library's version ("2.28.9") and the
// CUDA devices visible (a communicator needs one per rank of this process). Unimplemented in
// a build without NCCL; FailedPrecondition (the CUDA runtime's reason) when no device is
// visible. Initialises CUDA in the calling process: a process that will fork ranks which use
// CUDA must ask from a child.
struct NcclEnvironment {
  std::string version;
  int devices = 0;
};
Result<NcclEnvironment> ProbeNcclEnvironment();

}  // namespace tessera::collectives
