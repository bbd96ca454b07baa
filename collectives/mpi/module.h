// The mpi backend as a loadable module: what factory.cc finds in libtessera_mpi.so.
// Internal to collectives/mpi/; everything else goes through factory.h and the registry.
//
// The module holds MpiCommunicator (communicator.cc) and links Open MPI (libmpi, open-pal,
// open-rte, hwloc, libevent: about 1.2 MB resident), so only a process launched by mpirun that
// builds an mpi communicator maps them. It is loaded with global symbols
// (ModuleSymbols::kGlobal): Open MPI's components, which it opens itself, resolve libmpi's
// symbols at run time. Its one entry point, tessera_mpi_module_v<N>, returns the table below.
// A change to the table or to the signature of anything it points to raises
// kMpiModuleAbiVersion and the entry point's name with it.
//
// Thread safety: the table is constant; its function is as MpiCommunicator::Create.
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "collectives/communicator.h"

namespace tessera::collectives {

inline constexpr uint32_t kMpiModuleAbiVersion = 1;
inline constexpr char kMpiModuleFile[] = "libtessera_mpi.so";
inline constexpr char kMpiModuleEntry[] = "tessera_mpi_module_v1";

struct MpiModule {
  uint32_t abi_version;  // kMpiModuleAbiVersion of the module's build
  uint32_t table_bytes;  // sizeof(MpiModule) of the module's build
  // This rank's MPI communicator over MPI_COMM_WORLD, unwrapped (MpiCommunicator::Create).
  Result<std::unique_ptr<Communicator>> (*create)(const CommunicatorOptions& options);
};

}  // namespace tessera::collectives

extern "C" const tessera::collectives::MpiModule* tessera_mpi_module_v1();
