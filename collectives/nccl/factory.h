// The nccl backend's entry point for the registry (collectives/registry.h). Always declared;
// when the backend is not built, the returned backend says so from Viable().
#pragma once

#include <memory>

#include "collectives/registry.h"

namespace tessera::collectives {

std::unique_ptr<CommunicatorBackend> MakeNcclBackend();

}  // namespace tessera::collectives
