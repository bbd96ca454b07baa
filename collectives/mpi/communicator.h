// MpiCommunicator: Open MPI behind the Communicator interface, for processes launched by
// mpirun. Built only when TESSERA_HAVE_MPI; viable only when OMPI_COMM_WORLD_SIZE and
// OMPI_COMM_WORLD_RANK match the requested size and rank. Uses a duplicate of
// MPI_COMM_WORLD; initialises MPI (MPI_THREAD_SERIALIZED) if the program has not, and then
// finalises it at exit (MPI allows one init per process).
//
// Native: allreduce (sum, max, min), broadcast, allgather, reduce-scatter (block), barrier,
// send/recv. No float16 (MPI has no standard half type). MPI has no timeouts: each call is
// started nonblocking and polled with MPI_Test until the deadline; a call that misses it
// fails with DEADLINE_EXCEEDED and leaves the communicator unusable (the request cannot be
// cancelled portably). Errors name MPI's error string; MPI_ERRORS_RETURN is set. Tags run up
// to MPI_TAG_UB, read at creation (MpiMaxTag in mpi/factory.h): capabilities().max_tag.
#pragma once

#include <mpi.h>

#include "collectives/communicator.h"

namespace tessera::collectives {

class MpiCommunicator final : public Communicator {
 public:
  static Result<std::unique_ptr<MpiCommunicator>> Create(const CommunicatorOptions& options);
  ~MpiCommunicator() override;

  std::string_view backend_name() const override { return "mpi"; }
  const CommunicatorCapabilities& capabilities() const override { return capabilities_; }

 protected:
  Status DoAllreduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                     Deadline deadline) override;
  Status DoBroadcast(void* buffer, size_t count, DataType type, int root,
                     Deadline deadline) override;
  Status DoAllgather(const void* send, void* recv, size_t count, DataType type,
                     Deadline deadline) override;
  Status DoReduceScatter(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                         Deadline deadline) override;
  Status DoBarrier(Deadline deadline) override;
  Status DoSend(const void* buffer, size_t count, DataType type, int peer, int tag,
                Deadline deadline) override;
  Status DoRecv(void* buffer, size_t count, DataType type, int peer, int tag,
                Deadline deadline) override;

 private:
  MpiCommunicator(MPI_Comm comm, int rank, int size, std::chrono::milliseconds timeout,
                  int max_tag);
  // Polls `request` until done or the deadline; `what` names the call in errors.
  Status Wait(int started, MPI_Request* request, Deadline deadline, const char* what);

  const CommunicatorCapabilities capabilities_;
  MPI_Comm comm_;
  Status broken_;
};

}  // namespace tessera::collectives
