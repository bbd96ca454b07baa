// Collective algorithms built only on a MessageChannel's point-to-point messages.
//
//   Allreduce      recursive doubling below `small_allreduce_bytes` (non-power-of-two rank
//                  counts fold the extra ranks in first and out last), otherwise ring
//                  reduce-scatter + ring allgather as one MessageChannel::ExchangeChain of
//                  2(n-1) steps: each received segment is reduced (or lands) and is forwarded
//                  to the next rank at once, so on a transport that overlaps the steps the
//                  ring streams instead of stopping at each step.
//   Broadcast      binomial tree below `small_broadcast_bytes`, otherwise a pipelined chain
//                  (segments flow root -> ... -> last while the next one is received).
//   Allgather      ring, as one ExchangeChain (blocks forwarded segment by segment).
//   ReduceScatter  ring, accumulating in two alternating scratch blocks.
//   Barrier        dissemination (ceil(log2 n) rounds of empty messages).
//
// Results are bitwise identical on every rank (each element is reduced in one order and
// then copied; recursive doubling's op(own, peer) is commutative bit for bit, reduce.h).
// kAvg divides once, at the end; a float16 average runs in float32 (widened on every rank,
// so the messages are float32) and is rounded to float16 once.
//
// Scratch memory is kept between calls and only grows: in steady state no call allocates.
// It is sized with checked arithmetic before any data moves: scratch beyond what an object can
// hold (reduce-scatter's three blocks, a float16 average's float32 copy), or that cannot be
// allocated, is RESOURCE_EXHAUSTED naming the rank and the call ("rank 0: reduce_scatter #3
// (count 10, float32, sum) needs scratch of ... bytes for ...", scratch.h), never an
// exception. Every rank that refuses stays in step with the others; one that refuses alone
// leaves its peers to fail at their deadline.
// Not thread-safe: one call at a time, like the Communicator that owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/message.h"

namespace tessera::collectives {

// dst[offset..] = reduce(a[offset..], b[offset..]) as the bytes of a message arrive (b is
// where they land). Sums of float32/float64/int32/int64 use a vectorised loop.
class ReducingSink final : public SegmentSink {
 public:
  ReducingSink() = default;
  ReducingSink(void* dst, const void* a, const void* b, DataType type, ReduceOp op)
      : dst_(static_cast<std::byte*>(dst)),
        a_(static_cast<const std::byte*>(a)),
        b_(static_cast<const std::byte*>(b)),
        type_(type),
        op_(op) {}
  void OnReceived(size_t offset, size_t bytes) override;

 private:
  std::byte* dst_ = nullptr;
  const std::byte* a_ = nullptr;
  const std::byte* b_ = nullptr;
  DataType type_ = DataType::kUint8;
  ReduceOp op_ = ReduceOp::kSum;
};

struct AlgorithmTuning {
  size_t small_allreduce_bytes = 64 << 10;
  size_t small_broadcast_bytes = 256 << 10;
  size_t segment_bytes = 256 << 10;  // reduce / pipeline granularity (multiple of 8)
};

class CollectiveAlgorithms {
 public:
  // `channel` must outlive this object.
  explicit CollectiveAlgorithms(MessageChannel* channel, AlgorithmTuning tuning = {});

  // `sequence` is the caller's collective call number, carried in every message header.
  Status Allreduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                   uint64_t sequence, Deadline deadline);
  Status RingAllreduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                       uint64_t sequence, Deadline deadline);
  Status RecursiveDoublingAllreduce(const void* send, void* recv, size_t count, DataType type,
                                    ReduceOp op, uint64_t sequence, Deadline deadline);
  Status Broadcast(void* buffer, size_t count, DataType type, int root, uint64_t sequence,
                   Deadline deadline);
  Status Allgather(const void* send, void* recv, size_t count, DataType type, uint64_t sequence,
                   Deadline deadline);
  Status ReduceScatter(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                       uint64_t sequence, Deadline deadline);
  Status Barrier(uint64_t sequence, Deadline deadline);

  // Bytes of scratch currently held (for tests that check steady-state reuse).
  size_t scratch_bytes() const { return scratch_.size(); }

 private:
  Status BinomialBroadcast(void* buffer, size_t count, DataType type, int root,
                           uint64_t sequence, Deadline deadline);
  Status ChainBroadcast(void* buffer, size_t count, DataType type, int root, uint64_t sequence,
                        Deadline deadline);

  MessageChannel* channel_;
  AlgorithmTuning tuning_;
  std::vector<std::byte> scratch_;
  std::vector<float> wide_;  // a float16 average's float32 buffers
  // The steps of a chained ring, kept to avoid allocating per call.
  std::vector<OutgoingMessage> chain_out_;
  std::vector<IncomingMessage> chain_in_;
  std::vector<ReducingSink> chain_sinks_;
};

}  // namespace tessera::collectives
