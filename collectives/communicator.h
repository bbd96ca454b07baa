// Communicator: collective and point-to-point operations among `size` ranks.
//
// Every call is blocking and returns a Status; none waits forever: each call has a timeout
// (CallOptions::timeout, or the communicator's default from CommunicatorOptions::timeout_ms)
// and fails with DEADLINE_EXCEEDED or UNAVAILABLE naming the peer it was waiting for.
//
// Buffer conventions (counts are elements, never bytes):
//   Allreduce(send, recv, count)       send and recv hold `count` elements; send == recv is
//                                      the in-place form.
//   Broadcast(buffer, count, root)     the root's buffer is copied into everyone's.
//   Allgather(send, recv, count)       send holds `count`, recv holds size*count, rank i's
//                                      block at recv + i*count.
//   ReduceScatter(send, recv, count)   send holds size*count, recv holds `count`: block
//                                      `rank` of the reduction.
//   Send/Recv(buffer, count, peer, tag) ordered per pair of ranks: a Recv takes the next
//                                      message from `peer`, and a different tag, dtype or
//                                      count is an error, not a match against a later one.
//
// Every rank must issue the same collectives in the same order with the same count, dtype,
// reduce op and root. A mismatch is detected and reported on every backend: p2p and the
// send/recv fallback see it in their message headers (FAILED_PRECONDITION naming the peer
// and both sides' calls); the others are wrapped by CreateCommunicator in
// VerifiedCommunicator (collectives/verified.h), which compares every collective before any
// data moves (INVALID_ARGUMENT on every rank, naming this rank's call and the ranks whose
// call differs; the communicator stays usable) and checks each Send/Recv pair by a header
// message (FAILED_PRECONDITION at the receiver). CommunicatorOptions::verify_calls turns
// the wrapper off.
//
// After any error other than INVALID_ARGUMENT the communicator may be unusable: later calls
// can fail with the same error. Contents of output buffers after an error are unspecified.
//
// Thread safety: one call at a time per Communicator. Different Communicators are
// independent.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"
#include "collectives/types.h"

namespace tessera::collectives {

class Store;

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// How to create a communicator (see collectives/registry.h).
struct CommunicatorOptions {
  std::string backend = "auto";   // "auto", "p2p", "gloo", "mpi", "nccl", "local"
  int rank = 0;
  int size = 1;
  // Namespace for this communicator's keys in the Store, and the job/cohort identity checked
  // in the p2p handshake: ranks of different cohorts never connect to each other.
  std::string prefix = "tessera";
  int timeout_ms = 30000;          // default per-call timeout; also bounds rendezvous
  std::string bind_address = "127.0.0.1";  // address p2p and gloo listen on and publish
  BufferLocation location = BufferLocation::kHost;  // where the caller's buffers live
  // For device buffers (nccl): the CUDA device they live on, the same index the caller's
  // Device reports (DeviceCapabilities::device_index). Every call of the communicator runs
  // on it, whatever device the calling thread had current. Ignored for host buffers.
  int device_index = 0;
  // Wrap backends that cannot detect mismatched calls themselves (gloo, mpi, nccl) in
  // VerifiedCommunicator. Costs one small allreduce per collective and one header message
  // per send (see docs/COLLECTIVES.md for measurements); turn off only after measuring, and
  // then a mismatched call may compute garbage or hang until the timeout.
  bool verify_calls = true;
};

// Per-call options.
struct CallOptions {
  // 0 means the communicator's default (CommunicatorOptions::timeout_ms). At most
  // kMaxCallTimeout: a longer one is taken as that.
  std::chrono::milliseconds timeout{0};
};

// The longest wait a call takes. now() plus std::chrono::milliseconds::max() wraps the
// clock's nanoseconds into the past (a call meant to wait for ever would fail at once), and
// backends add what is left to now() again (Gloo), so a year is the bound.
inline constexpr std::chrono::milliseconds kMaxCallTimeout = std::chrono::hours(24 * 365);

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds default_timeout() const { return default_timeout_; }
  virtual std::string_view backend_name() const = 0;
  virtual const CommunicatorCapabilities& capabilities() const = 0;

  // The public calls validate their arguments (INVALID_ARGUMENT for a null buffer with
  // count > 0, a count whose buffers' bytes overflow, a root, peer or tag out of range, a
  // dtype the backend lacks, a reduce op outside ReduceOp) and turn the timeout into a deadline before calling the backend.
  Status Allreduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                   const CallOptions& options = {});
  Status Broadcast(void* buffer, size_t count, DataType type, int root,
                   const CallOptions& options = {});
  Status Allgather(const void* send, void* recv, size_t count, DataType type,
                   const CallOptions& options = {});
  Status ReduceScatter(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                       const CallOptions& options = {});
  Status Barrier(const CallOptions& options = {});
  // May block until the peer receives (like MPI_Send). Tags run from 0 to
  // capabilities().max_tag (INT_MAX but for the few top tags this layer's own messages use,
  // and on mpi below MPI_TAG_UB); another is INVALID_ARGUMENT naming the tag and the bound.
  Status Send(const void* buffer, size_t count, DataType type, int peer, int tag,
              const CallOptions& options = {});
  Status Recv(void* buffer, size_t count, DataType type, int peer, int tag,
              const CallOptions& options = {});

 protected:
  Communicator(int rank, int size, std::chrono::milliseconds default_timeout);

  // Backends implement the ops they declare in capabilities().native_ops (and the reduce
  // ops in native_reduce_ops). Arguments arrive validated. The defaults return
  // UNIMPLEMENTED; CreateCommunicator never exposes a backend whose missing ops are not
  // composed by FallbackCommunicator.
  virtual Status DoAllreduce(const void* send, void* recv, size_t count, DataType type,
                             ReduceOp op, Deadline deadline);
  virtual Status DoBroadcast(void* buffer, size_t count, DataType type, int root,
                             Deadline deadline);
  virtual Status DoAllgather(const void* send, void* recv, size_t count, DataType type,
                             Deadline deadline);
  virtual Status DoReduceScatter(const void* send, void* recv, size_t count, DataType type,
                                 ReduceOp op, Deadline deadline);
  virtual Status DoBarrier(Deadline deadline);
  virtual Status DoSend(const void* buffer, size_t count, DataType type, int peer, int tag,
                        Deadline deadline);
  virtual Status DoRecv(void* buffer, size_t count, DataType type, int peer, int tag,
                        Deadline deadline);

  // Control traffic of a few bytes in host memory, whatever options.location says, for
  // wrappers that coordinate ranks (VerifiedCommunicator). The defaults call DoAllreduce
  // (int64), DoSend and DoRecv (uint8) directly, which is right for backends that take host
  // buffers; a device-buffer backend overrides them to stage through its own memory.
  virtual Status DoHostAllreduce(int64_t* values, size_t count, ReduceOp op, Deadline deadline);
  virtual Status DoHostSend(const void* bytes, size_t size, int peer, int tag,
                            Deadline deadline);
  virtual Status DoHostRecv(void* bytes, size_t size, int peer, int tag, Deadline deadline);

  Deadline DeadlineFor(const CallOptions& options) const;
  // Lets a wrapping communicator call another communicator's backend entry points.
  static Status CallAllreduce(Communicator& c, const void* send, void* recv, size_t count,
                              DataType type, ReduceOp op, Deadline deadline) {
    return c.DoAllreduce(send, recv, count, type, op, deadline);
  }
  static Status CallBroadcast(Communicator& c, void* buffer, size_t count, DataType type,
                              int root, Deadline deadline) {
    return c.DoBroadcast(buffer, count, type, root, deadline);
  }
  static Status CallAllgather(Communicator& c, const void* send, void* recv, size_t count,
                              DataType type, Deadline deadline) {
    return c.DoAllgather(send, recv, count, type, deadline);
  }
  static Status CallReduceScatter(Communicator& c, const void* send, void* recv, size_t count,
                                  DataType type, ReduceOp op, Deadline deadline) {
    return c.DoReduceScatter(send, recv, count, type, op, deadline);
  }
  static Status CallBarrier(Communicator& c, Deadline deadline) { return c.DoBarrier(deadline); }
  static Status CallSend(Communicator& c, const void* buffer, size_t count, DataType type,
                         int peer, int tag, Deadline deadline) {
    return c.DoSend(buffer, count, type, peer, tag, deadline);
  }
  static Status CallRecv(Communicator& c, void* buffer, size_t count, DataType type, int peer,
                         int tag, Deadline deadline) {
    return c.DoRecv(buffer, count, type, peer, tag, deadline);
  }
  static Status CallHostAllreduce(Communicator& c, int64_t* values, size_t count, ReduceOp op,
                                  Deadline deadline) {
    return c.DoHostAllreduce(values, count, op, deadline);
  }
  static Status CallHostSend(Communicator& c, const void* bytes, size_t size, int peer, int tag,
                             Deadline deadline) {
    return c.DoHostSend(bytes, size, peer, tag, deadline);
  }
  static Status CallHostRecv(Communicator& c, void* bytes, size_t size, int peer, int tag,
                             Deadline deadline) {
    return c.DoHostRecv(bytes, size, peer, tag, deadline);
  }

 private:
  Status CheckBuffer(const void* buffer, size_t count, std::string_view what) const;
  // INVALID_ARGUMENT naming the rank, the call and its count unless capabilities() has `type`.
  Status CheckType(DataType type, size_t count, std::string_view what) const;
  // INVALID_ARGUMENT when blocks * count elements of `type` overflow or exceed PTRDIFF_MAX bytes.
  Status CheckBytes(size_t count, DataType type, size_t blocks, std::string_view what) const;
  Status CheckPeer(int peer, std::string_view what) const;
  // INVALID_ARGUMENT naming the rank, the call and the value unless `op` is one of ReduceOp's.
  Status CheckReduceOp(ReduceOp op, size_t count, std::string_view what) const;
  // INVALID_ARGUMENT naming the tag and the bound unless 0 <= tag <= capabilities().max_tag.
  Status CheckTag(int tag, std::string_view what) const;

  // Gives a backend's Create only what is left of options.timeout_ms, then sets the
  // communicator's default back to the whole of it.
  friend Result<std::unique_ptr<Communicator>> CreateCommunicator(
      const CommunicatorOptions& options, std::shared_ptr<Store> store);

  const int rank_;
  const int size_;
  std::chrono::milliseconds default_timeout_;
};

// Milliseconds left until `deadline` (0 when past), for messages and poll().
int64_t MillisecondsLeft(Deadline deadline);
// MillisecondsLeft for poll(), which takes an int: capped at INT_MAX (24.8 days), so that a
// longer wait is taken in pieces instead of wrapping to a negative value, which poll() reads
// as "wait for ever". A poll that returns 0 before the deadline waits again.
int PollTimeoutMs(Deadline deadline);

}  // namespace tessera::collectives
