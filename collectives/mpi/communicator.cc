#include "collectives/mpi/communicator.h"

#include <climits>
#include <cstdlib>
#include <string>

#include "collectives/mpi/factory.h"

namespace tessera::collectives {
namespace {

MPI_Datatype ToMpi(DataType type) {
  switch (type) {
    case DataType::kUint8: return MPI_UINT8_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kFloat16: break;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op ToMpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
    default: return MPI_SUM;
  }
}

std::string MpiError(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, length);
}

Status CheckCount(size_t count) {
  if (count > static_cast<size_t>(INT_MAX)) {
    return InvalidArgumentError("mpi: count " + std::to_string(count) + " exceeds INT_MAX");
  }
  return Status::Ok();
}

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, int rank, int size,
                                 std::chrono::milliseconds timeout, int max_tag)
    : Communicator(rank, size, timeout),
      capabilities_{AllCollectiveOps(),
                    {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin},
                    {DataType::kUint8, DataType::kInt32, DataType::kInt64, DataType::kFloat32,
                     DataType::kFloat64},
                    {BufferLocation::kHost},
                    /*verifies_calls=*/false,
                    max_tag},
      comm_(comm) {}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && broken_.ok()) MPI_Comm_free(&comm_);
}

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(
    const CommunicatorOptions& options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return UnavailableError("MPI_Init_thread failed: " + MpiError(rc));
    std::atexit(FinalizeAtExit);  // MPI requires a finalize from whoever initialised it
  }
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank != options.rank || size != options.size) {
    return FailedPreconditionError("mpi: MPI_COMM_WORLD is rank " + std::to_string(rank) +
                                   " of " + std::to_string(size) + ", options ask for rank " +
                                   std::to_string(options.rank) + " of " +
                                   std::to_string(options.size));
  }
  // The attribute's value is a pointer to an int that MPI owns; it is the same on every rank.
  int* tag_upper_bound = nullptr;
  int present = 0;
  int rc = MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_upper_bound, &present);
  if (rc != MPI_SUCCESS) {
    return UnavailableError("mpi: MPI_Comm_get_attr(MPI_TAG_UB) failed: " + MpiError(rc));
  }
  ASSIGN_OR_RETURN(const int max_tag,
                   MpiMaxTag(present != 0 && tag_upper_bound != nullptr,
                             present != 0 && tag_upper_bound != nullptr ? *tag_upper_bound : 0));
  MPI_Comm comm;
  rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (rc != MPI_SUCCESS) return UnavailableError("MPI_Comm_dup failed: " + MpiError(rc));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(
      comm, rank, size, std::chrono::milliseconds(options.timeout_ms), max_tag));
}

Status MpiCommunicator::Wait(int started, MPI_Request* request, Deadline deadline,
                             const char* what) {
  if (started != MPI_SUCCESS) {
    return UnavailableError("mpi rank " + std::to_string(rank()) + ": " + what + " failed: " +
                            MpiError(started));
  }
  int done = 0;
  for (uint64_t spins = 0;; ++spins) {
    MPI_Status status;
    const int rc = MPI_Test(request, &done, &status);
    if (rc != MPI_SUCCESS) {
      broken_ = UnavailableError("mpi rank " + std::to_string(rank()) + ": " + what +
                                 " failed: " + MpiError(rc));
      return broken_;
    }
    if (done) return Status::Ok();
    if ((spins & 1023) == 0 && Clock::now() >= deadline) {
      broken_ = DeadlineExceededError("mpi rank " + std::to_string(rank()) + ": " + what +
                                      " did not complete before the deadline");
      return broken_;
    }
  }
}

Status MpiCommunicator::DoAllreduce(const void* send, void* recv, size_t count, DataType type,
                                    ReduceOp op, Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  RETURN_IF_ERROR(CheckCount(count));
  MPI_Request request;
  const int rc = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count),
                                ToMpi(type), ToMpi(op), comm_, &request);
  return Wait(rc, &request, deadline, "allreduce");
}

Status MpiCommunicator::DoBroadcast(void* buffer, size_t count, DataType type, int root,
                                    Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  RETURN_IF_ERROR(CheckCount(count));
  MPI_Request request;
  const int rc = MPI_Ibcast(buffer, static_cast<int>(count), ToMpi(type), root, comm_, &request);
  return Wait(rc, &request, deadline, "broadcast");
}

Status MpiCommunicator::DoAllgather(const void* send, void* recv, size_t count, DataType type,
                                    Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  RETURN_IF_ERROR(CheckCount(count * size()));
  const bool in_place =
      static_cast<const char*>(recv) + rank() * count * DataTypeSize(type) == send;
  MPI_Request request;
  const int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(count),
                                ToMpi(type), recv, static_cast<int>(count), ToMpi(type), comm_,
                                &request);
  return Wait(rc, &request, deadline, "allgather");
}

Status MpiCommunicator::DoReduceScatter(const void* send, void* recv, size_t count,
                                        DataType type, ReduceOp op, Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  RETURN_IF_ERROR(CheckCount(count * size()));
  MPI_Request request;
  const int rc = MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count), ToMpi(type),
                                           ToMpi(op), comm_, &request);
  return Wait(rc, &request, deadline, "reduce_scatter");
}

Status MpiCommunicator::DoBarrier(Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  MPI_Request request;
  return Wait(MPI_Ibarrier(comm_, &request), &request, deadline, "barrier");
}

Status MpiCommunicator::DoSend(const void* buffer, size_t count, DataType type, int peer,
                               int tag, Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  RETURN_IF_ERROR(CheckCount(count));
  MPI_Request request;
  const int rc =
      MPI_Isend(buffer, static_cast<int>(count), ToMpi(type), peer, tag, comm_, &request);
  return Wait(rc, &request, deadline, "send");
}

Status MpiCommunicator::DoRecv(void* buffer, size_t count, DataType type, int peer, int tag,
                               Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  RETURN_IF_ERROR(CheckCount(count));
  MPI_Request request;
  const int rc =
      MPI_Irecv(buffer, static_cast<int>(count), ToMpi(type), peer, tag, comm_, &request);
  return Wait(rc, &request, deadline, "recv");
}

}  // namespace tessera::collectives
