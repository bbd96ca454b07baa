// The mpi backend's entry point for the registry (collectives/registry.h). Always declared;
// when the backend is not built, the returned backend says so from Viable().
#pragma once

#include <memory>

#include "collectives/registry.h"

namespace tessera::collectives {

std::unique_ptr<CommunicatorBackend> MakeMpiBackend();

// Whether mpirun launched this process as `rank` of `size`, from the values of
// OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_RANK (null when unset). Each is parsed strictly:
// decimal digits only, the whole value, the size from 1 to INT_MAX and the rank below the
// size. FAILED_PRECONDITION naming the variable and its (escaped) value otherwise, or when
// either is unset or they name another rank or size. Pure, so it is tested without mpirun.
Status CheckMpiWorld(const char* world_size, const char* world_rank, int rank, int size);

// The largest tag an mpi communicator's Send/Recv take (its capabilities' max_tag), from the
// MPI_TAG_UB attribute of MPI_COMM_WORLD: `present` says whether MPI_Comm_get_attr found it,
// `tag_upper_bound` is its value. The MPI standard guarantees at least 32767, so an absent
// attribute counts as 32767 and a smaller value (a nonconforming MPI) is FAILED_PRECONDITION
// naming it. Pure, so that it is tested without mpirun; the wrappers then reserve the top tags
// (ReserveTopTag).
Result<int> MpiMaxTag(bool present, int tag_upper_bound);

}  // namespace tessera::collectives
