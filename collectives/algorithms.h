// Collective algorithms built only on a MessageChannel's point-to-point messages.
//
//   Allreduce      recursive doubling below `small_allreduce_bytes` (non-power-of-two rank
//                  counts fold the extra ranks in first and out last), otherwise ring
//                  reduce-scatter + ring allgather; received segments are reduced while the
//                  rest of the message is still arriving.
//   Broadcast      binomial tree below `small_broadcast_bytes`, otherwise a pipelined chain
//                  (segments flow root -> ... -> last while the next one is received).
//   Allgather      ring.
//   ReduceScatter  ring, accumulating in two alternating scratch blocks.
//   Barrier        dissemination (ceil(log2 n) rounds of empty messages).
//
// Results are bitwise identical on every rank (each element is reduced in one order and
// then copied). kAvg divides once, at the end.
//
// Scratch memory is kept between calls and only grows: in steady state no call allocates.
// Not thread-safe: one call at a time, like the Communicator that owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/message.h"

namespace tessera::collectives {

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
  std::byte* Scratch(size_t bytes);
  Status BinomialBroadcast(void* buffer, size_t count, DataType type, int root,
                           uint64_t sequence, Deadline deadline);
  Status ChainBroadcast(void* buffer, size_t count, DataType type, int root, uint64_t sequence,
                        Deadline deadline);

  MessageChannel* channel_;
  AlgorithmTuning tuning_;
  std::vector<std::byte> scratch_;
};

}  // namespace tessera::collectives
