// FallbackCommunicator: composes the ops a backend lacks from the ops it has.
//
// For each call it takes the first route the wrapped backend's capabilities allow:
//   Allreduce      native op | avg = native sum then divide | reduce-scatter + allgather
//                  (padding to a multiple of size) | send/recv algorithms
//   ReduceScatter  native | allreduce into scratch, keep own block | send/recv
//   Allgather      native | allreduce(sum) of zero-padded blocks | send/recv
//   Broadcast      native | send/recv (binomial tree or pipelined chain)
//   Barrier        native | one-element allreduce | send/recv (dissemination)
//   Send/Recv      native only
// The send/recv route runs CollectiveAlgorithms over the backend's own Send/Recv, framing
// each message as a 40-byte header message plus a payload message (uint8), so call
// mismatches are detected there too. The framing uses the backend's top tag
// (ReserveTopTag): capabilities().max_tag is one less, so a caller's Send/Recv never shares
// a tag with it. A payload's length is always the one this rank expects; a peer's header that
// says otherwise is a mismatch (FAILED_PRECONDITION), never a size to receive.
//
// Sends run on one helper thread while the calling thread receives, so ring steps cannot
// deadlock on a backend whose Send blocks. Every wait is bounded by the call's deadline (its
// CallOptions::timeout, or CommunicatorOptions::timeout_ms): the backend's Send and Recv are
// given it, and the wait for the helper's send ends at it even if the backend's send has not
// returned. A peer that never sends, or never takes what is sent, gives DEADLINE_EXCEEDED
// naming this rank, the peer, the message (op, call number, count, dtype) and the deadline:
//   "rank 0: timed out waiting for rank 1 to send allreduce #0 (count 100, int32, sum,
//    400-byte message) before the call's deadline, 1000 ms after it began (backend local:
//    ...)"
// Other failures of the backend keep their code and gain the same context. A send abandoned
// at the deadline leaves the communicator out of step with its peers: every later call
// returns that error, and destroying the communicator waits for the backend's send, which
// may read the caller's buffer until it returns.
//
// Host arithmetic (divide, pad, copy) only happens for host buffers: a route that needs it
// is refused for device buffers (UNIMPLEMENTED naming the op). Scratch a route needs beyond
// the caller's buffers (padding, a float16 average's float32 copy) is sized with checked
// arithmetic: more than an object can hold, or than can be allocated, is RESOURCE_EXHAUSTED
// naming the route, before any data moves. A float16 average the backend
// lacks natively runs as a float32 average (when the backend has float32) and is rounded to
// float16 once: a float16 sum overflows at 65504 long before the average does.
//
// Every composed call is counted per route (fallback_counts()), so fallbacks are accounted.
// Scratch buffers are kept between calls. Thread safety: as Communicator.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/communicator.h"

namespace tessera::collectives {

class FallbackCommunicator final : public Communicator {
 public:
  FallbackCommunicator(std::unique_ptr<Communicator> base, BufferLocation location,
                       AlgorithmTuning tuning = {});
  ~FallbackCommunicator() override;

  std::string_view backend_name() const override { return base_->backend_name(); }
  // The wrapped backend's native capabilities (what is composed is exactly what is absent),
  // but for max_tag: one less, the top tag carrying the framing.
  const CommunicatorCapabilities& capabilities() const override { return capabilities_; }
  Communicator& base() { return *base_; }
  // Route description ("allreduce(avg) <- allreduce(sum) + divide") -> calls composed so far.
  const std::map<std::string, uint64_t>& fallback_counts() const { return fallback_counts_; }

  // True when `base` lacks any op or reduce op, i.e. wrapping it changes something.
  static bool Needed(const CommunicatorCapabilities& base);

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
  // The backend's own, when it has the op natively; otherwise composed as above.
  Status DoHostAllreduce(int64_t* values, size_t count, ReduceOp op, Deadline deadline) override;
  Status DoHostSend(const void* bytes, size_t size, int peer, int tag,
                    Deadline deadline) override;
  Status DoHostRecv(void* bytes, size_t size, int peer, int tag, Deadline deadline) override;

 private:
  class SendRecvChannel;

  bool Has(CollectiveOp op) const { return base_->capabilities().HasOp(op); }
  bool HasReduce(ReduceOp op) const { return base_->capabilities().HasReduceOp(op); }
  bool HasSendRecv() const { return Has(CollectiveOp::kSend) && Has(CollectiveOp::kRecv); }
  void Count(const char* route) { ++fallback_counts_[route]; }
  Status NoRoute(CollectiveOp op, ReduceOp reduce_op) const;
  // Scratch of `elements` x `element_bytes` bytes, kept between calls; RESOURCE_EXHAUSTED
  // naming `route` when the bytes exceed PTRDIFF_MAX or cannot be allocated (scratch.h).
  Result<std::byte*> Scratch(size_t elements, size_t element_bytes, const char* route);
  // The send/recv algorithms, told that a call with this deadline begins (for its errors).
  CollectiveAlgorithms& SendRecvRoute(Deadline deadline);
  // True when a float16 average of `collective` runs widened to float32 (see above).
  bool WidensHalfAverage(CollectiveOp collective, DataType type, ReduceOp op) const;

  std::unique_ptr<Communicator> base_;
  int framing_tag_ = 0;  // base_'s max_tag
  CommunicatorCapabilities capabilities_;
  BufferLocation location_;
  std::unique_ptr<SendRecvChannel> channel_;
  std::unique_ptr<CollectiveAlgorithms> algorithms_;
  uint64_t sequence_ = 0;
  std::vector<std::byte> scratch_;
  std::vector<float> wide_;  // a float16 average's float32 buffers
  std::map<std::string, uint64_t> fallback_counts_;
};

}  // namespace tessera::collectives
