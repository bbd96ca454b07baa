#include "collectives/communicator.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

namespace tessera::collectives {

Communicator::Communicator(int rank, int size, std::chrono::milliseconds default_timeout)
    : rank_(rank), size_(size), default_timeout_(default_timeout) {}

int64_t MillisecondsLeft(Deadline deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? left : 0;
}

Deadline Communicator::DeadlineFor(const CallOptions& options) const {
  const auto timeout =
      std::min(options.timeout.count() > 0 ? options.timeout : default_timeout_, kMaxCallTimeout);
  return Clock::now() + timeout;
}

int PollTimeoutMs(Deadline deadline) {
  return static_cast<int>(std::min<int64_t>(MillisecondsLeft(deadline), INT_MAX));
}

Status Communicator::CheckBuffer(const void* buffer, size_t count, std::string_view what) const {
  if (buffer == nullptr && count > 0) {
    return InvalidArgumentError("rank " + std::to_string(rank_) + ": " + std::string(what) +
                                " buffer is null with count " + std::to_string(count));
  }
  return Status::Ok();
}

Status Communicator::CheckBytes(size_t count, DataType type, size_t blocks,
                                std::string_view what) const {
  // The largest buffer the call touches is blocks * count elements; no object is larger than
  // PTRDIFF_MAX bytes, and a product that wraps would make every size below it a lie.
  size_t bytes = 0;
  if (__builtin_mul_overflow(count, DataTypeSize(type), &bytes) ||
      __builtin_mul_overflow(bytes, blocks, &bytes) ||
      bytes > static_cast<size_t>(PTRDIFF_MAX)) {
    return InvalidArgumentError("rank " + std::to_string(rank_) + ": " + std::string(what) +
                                " count " + std::to_string(count) + " of " +
                                std::string(DataTypeName(type)) +
                                (blocks > 1 ? " times " + std::to_string(blocks) + " ranks" : "") +
                                " is more bytes than a buffer can hold");
  }
  return Status::Ok();
}

Status Communicator::CheckType(DataType type, size_t count, std::string_view what) const {
  if (!capabilities().HasDataType(type)) {
    // A value outside the enum is named by its number, not as "unknown-dtype".
    const bool known = AllDataTypes().count(type) != 0;
    const std::string number = "dtype " + std::to_string(static_cast<int>(type));
    return InvalidArgumentError(
        "rank " + std::to_string(rank_) + ": " + std::string(what) + " count " +
        std::to_string(count) + " of " + (known ? std::string(DataTypeName(type)) : number) +
        ": backend " + std::string(backend_name()) + " does not support " +
        (known ? "dtype " + std::string(DataTypeName(type)) : number) + " (it has " +
        capabilities().ToString() + ")");
  }
  return Status::Ok();
}

Status Communicator::CheckPeer(int peer, std::string_view what) const {
  if (peer < 0 || peer >= size_) {
    return InvalidArgumentError("rank " + std::to_string(rank_) + ": " + std::string(what) +
                                " " + std::to_string(peer) + " is out of range [0, " +
                                std::to_string(size_) + ")");
  }
  return Status::Ok();
}

Status Communicator::CheckReduceOp(ReduceOp op, size_t count, std::string_view what) const {
  if (AllReduceOps().count(op) != 0) return Status::Ok();
  // A value outside the enum reached the backends' arithmetic, which reduces none of it: the
  // call returned OK with its output unwritten.
  return InvalidArgumentError("rank " + std::to_string(rank_) + ": " + std::string(what) +
                              " count " + std::to_string(count) + ": reduce op " +
                              std::to_string(static_cast<int>(op)) +
                              " is not one of sum, avg, max, min");
}

Status Communicator::CheckTag(int tag, std::string_view what) const {
  const int max_tag = capabilities().max_tag;
  if (tag >= 0 && tag <= max_tag) return Status::Ok();
  std::string message = "rank " + std::to_string(rank_) + ": " + std::string(what) + " tag " +
                        std::to_string(tag) + " is out of range [0, " + std::to_string(max_tag) +
                        "]";
  if (tag > max_tag) {
    message += ": backend " + std::string(backend_name()) + " takes tags up to " +
               std::to_string(max_tag) +
               " (its transport's bound, such as MPI's MPI_TAG_UB, less the tags above it that "
               "carry this layer's own headers)";
  }
  return InvalidArgumentError(message);
}

Status Communicator::Allreduce(const void* send, void* recv, size_t count, DataType type,
                               ReduceOp op, const CallOptions& options) {
  RETURN_IF_ERROR(CheckType(type, count, "allreduce"));
  RETURN_IF_ERROR(CheckReduceOp(op, count, "allreduce"));
  RETURN_IF_ERROR(CheckBytes(count, type, 1, "allreduce"));
  RETURN_IF_ERROR(CheckBuffer(send, count, "allreduce send"));
  RETURN_IF_ERROR(CheckBuffer(recv, count, "allreduce recv"));
  return DoAllreduce(send, recv, count, type, op, DeadlineFor(options));
}

Status Communicator::Broadcast(void* buffer, size_t count, DataType type, int root,
                               const CallOptions& options) {
  RETURN_IF_ERROR(CheckType(type, count, "broadcast"));
  RETURN_IF_ERROR(CheckBytes(count, type, 1, "broadcast"));
  RETURN_IF_ERROR(CheckBuffer(buffer, count, "broadcast"));
  RETURN_IF_ERROR(CheckPeer(root, "broadcast root"));
  return DoBroadcast(buffer, count, type, root, DeadlineFor(options));
}

Status Communicator::Allgather(const void* send, void* recv, size_t count, DataType type,
                               const CallOptions& options) {
  RETURN_IF_ERROR(CheckType(type, count, "allgather"));
  RETURN_IF_ERROR(CheckBytes(count, type, static_cast<size_t>(size_), "allgather"));
  RETURN_IF_ERROR(CheckBuffer(send, count, "allgather send"));
  RETURN_IF_ERROR(CheckBuffer(recv, count, "allgather recv"));
  return DoAllgather(send, recv, count, type, DeadlineFor(options));
}

Status Communicator::ReduceScatter(const void* send, void* recv, size_t count, DataType type,
                                   ReduceOp op, const CallOptions& options) {
  RETURN_IF_ERROR(CheckType(type, count, "reduce_scatter"));
  RETURN_IF_ERROR(CheckReduceOp(op, count, "reduce_scatter"));
  RETURN_IF_ERROR(CheckBytes(count, type, static_cast<size_t>(size_), "reduce_scatter"));
  RETURN_IF_ERROR(CheckBuffer(send, count, "reduce_scatter send"));
  RETURN_IF_ERROR(CheckBuffer(recv, count, "reduce_scatter recv"));
  return DoReduceScatter(send, recv, count, type, op, DeadlineFor(options));
}

Status Communicator::Barrier(const CallOptions& options) {
  return DoBarrier(DeadlineFor(options));
}

Status Communicator::Send(const void* buffer, size_t count, DataType type, int peer, int tag,
                          const CallOptions& options) {
  RETURN_IF_ERROR(CheckType(type, count, "send"));
  RETURN_IF_ERROR(CheckBytes(count, type, 1, "send"));
  RETURN_IF_ERROR(CheckBuffer(buffer, count, "send"));
  RETURN_IF_ERROR(CheckPeer(peer, "send peer"));
  if (peer == rank_) return InvalidArgumentError("rank " + std::to_string(rank_) + ": send to self");
  RETURN_IF_ERROR(CheckTag(tag, "send"));
  return DoSend(buffer, count, type, peer, tag, DeadlineFor(options));
}

Status Communicator::Recv(void* buffer, size_t count, DataType type, int peer, int tag,
                          const CallOptions& options) {
  RETURN_IF_ERROR(CheckType(type, count, "recv"));
  RETURN_IF_ERROR(CheckBytes(count, type, 1, "recv"));
  RETURN_IF_ERROR(CheckBuffer(buffer, count, "recv"));
  RETURN_IF_ERROR(CheckPeer(peer, "recv peer"));
  if (peer == rank_) return InvalidArgumentError("rank " + std::to_string(rank_) + ": recv from self");
  RETURN_IF_ERROR(CheckTag(tag, "recv"));
  return DoRecv(buffer, count, type, peer, tag, DeadlineFor(options));
}

namespace {
Status NotNative(std::string_view backend, CollectiveOp op) {
  return UnimplementedError("backend " + std::string(backend) + " has no native " +
                            std::string(CollectiveOpName(op)) +
                            "; create it through CreateCommunicator to get the fallback");
}
}  // namespace

Status Communicator::DoAllreduce(const void*, void*, size_t, DataType, ReduceOp, Deadline) {
  return NotNative(backend_name(), CollectiveOp::kAllreduce);
}
Status Communicator::DoBroadcast(void*, size_t, DataType, int, Deadline) {
  return NotNative(backend_name(), CollectiveOp::kBroadcast);
}
Status Communicator::DoAllgather(const void*, void*, size_t, DataType, Deadline) {
  return NotNative(backend_name(), CollectiveOp::kAllgather);
}
Status Communicator::DoReduceScatter(const void*, void*, size_t, DataType, ReduceOp, Deadline) {
  return NotNative(backend_name(), CollectiveOp::kReduceScatter);
}
Status Communicator::DoBarrier(Deadline) { return NotNative(backend_name(), CollectiveOp::kBarrier); }
Status Communicator::DoSend(const void*, size_t, DataType, int, int, Deadline) {
  return NotNative(backend_name(), CollectiveOp::kSend);
}
Status Communicator::DoRecv(void*, size_t, DataType, int, int, Deadline) {
  return NotNative(backend_name(), CollectiveOp::kRecv);
}

Status Communicator::DoHostAllreduce(int64_t* values, size_t count, ReduceOp op,
                                     Deadline deadline) {
  return DoAllreduce(values, values, count, DataType::kInt64, op, deadline);
}
Status Communicator::DoHostSend(const void* bytes, size_t size, int peer, int tag,
                                Deadline deadline) {
  return DoSend(bytes, size, DataType::kUint8, peer, tag, deadline);
}
Status Communicator::DoHostRecv(void* bytes, size_t size, int peer, int tag, Deadline deadline) {
  return DoRecv(bytes, size, DataType::kUint8, peer, tag, deadline);
}

}  // namespace tessera::collectives
