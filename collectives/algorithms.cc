#include "collectives/algorithms.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "collectives/reduce.h"
#include "collectives/scratch.h"

namespace tessera::collectives {
namespace {

// dst[i] = a[i] + b[i], where dst is a or does not overlap it, and b overlaps neither: the
// loop works on 32-byte vectors (GCC/Clang vector extensions, lowered to what the target
// has). Per element it is the same IEEE addition as the scalar loop, so results do not
// change.
template <typename T>
void AddVectorised(T* dst, const T* a, const T* b, size_t count) {
  typedef T Vector __attribute__((vector_size(32)));
  constexpr size_t kLanes = sizeof(Vector) / sizeof(T);
  size_t i = 0;
  for (; i + 2 * kLanes <= count; i += 2 * kLanes) {
    Vector x0, x1, y0, y1;
    std::memcpy(&x0, a + i, sizeof(Vector));
    std::memcpy(&x1, a + i + kLanes, sizeof(Vector));
    std::memcpy(&y0, b + i, sizeof(Vector));
    std::memcpy(&y1, b + i + kLanes, sizeof(Vector));
    x0 += y0;
    x1 += y1;
    std::memcpy(dst + i, &x0, sizeof(Vector));
    std::memcpy(dst + i + kLanes, &x1, sizeof(Vector));
  }
  for (; i < count; ++i) dst[i] = static_cast<T>(a[i] + b[i]);
}

// First element of chunk i when `count` elements are split as evenly as possible in n.
size_t ChunkStart(size_t count, int n, int i) {
  return static_cast<size_t>((static_cast<unsigned __int128>(count) * i) / n);
}

int Mod(int a, int n) { return ((a % n) + n) % n; }

// The call a scratch buffer is for, named in its errors (GrowScratch, scratch.h):
// "rank 1: reduce_scatter #4 (count 10, float32, sum)".
struct ScratchFor {
  int rank;
  CollectiveOp op;
  uint64_t sequence;
  size_t count;
  DataType type;
  ReduceOp reduce_op;
  std::string operator()() const {
    return "rank " + std::to_string(rank) + ": " + std::string(CollectiveOpName(op)) + " #" +
           std::to_string(sequence) + " (count " + std::to_string(count) + ", " +
           std::string(DataTypeName(type)) + ", " + std::string(ReduceOpName(reduce_op)) + ")";
  }
};

}  // namespace

void ReducingSink::OnReceived(size_t offset, size_t bytes) {
  std::byte* dst = dst_ + offset;
  const std::byte* a = a_ + offset;
  const std::byte* b = b_ + offset;
  if (op_ == ReduceOp::kSum || op_ == ReduceOp::kAvg) {
    switch (type_) {
      case DataType::kFloat32:
        return AddVectorised(reinterpret_cast<float*>(dst), reinterpret_cast<const float*>(a),
                             reinterpret_cast<const float*>(b), bytes / sizeof(float));
      case DataType::kFloat64:
        return AddVectorised(reinterpret_cast<double*>(dst), reinterpret_cast<const double*>(a),
                             reinterpret_cast<const double*>(b), bytes / sizeof(double));
      // Signed integers are added as their unsigned type: the same bits, wrapping modulo
      // 2^bits where a signed overflow would be undefined.
      case DataType::kInt32:
        return AddVectorised(reinterpret_cast<uint32_t*>(dst), reinterpret_cast<const uint32_t*>(a),
                             reinterpret_cast<const uint32_t*>(b), bytes / sizeof(uint32_t));
      case DataType::kInt64:
        return AddVectorised(reinterpret_cast<uint64_t*>(dst), reinterpret_cast<const uint64_t*>(a),
                             reinterpret_cast<const uint64_t*>(b), bytes / sizeof(uint64_t));
      default:
        break;
    }
  }
  ReduceElements(dst, a, b, bytes / DataTypeSize(type_), type_, op_);
}

CollectiveAlgorithms::CollectiveAlgorithms(MessageChannel* channel, AlgorithmTuning tuning)
    : channel_(channel), tuning_(tuning) {
  tuning_.segment_bytes = std::max<size_t>(8, tuning_.segment_bytes / 8 * 8);
}

Status CollectiveAlgorithms::Allreduce(const void* send, void* recv, size_t count,
                                       DataType type, ReduceOp op, uint64_t sequence,
                                       Deadline deadline) {
  if (type == DataType::kFloat16 && op == ReduceOp::kAvg) {
    ASSIGN_OR_RETURN(float* wide,
                     GrowScratch(wide_, 1, count,
                         ScratchFor{channel_->rank(), CollectiveOp::kAllreduce, sequence, count, type, op},
                         "the float32 copy of a float16 average"));
    HalfToFloatElements(static_cast<const uint16_t*>(send), wide, count);
    RETURN_IF_ERROR(Allreduce(wide, wide, count, DataType::kFloat32, op, sequence, deadline));
    FloatToHalfElements(wide, static_cast<uint16_t*>(recv), count);
    return Status::Ok();
  }
  const size_t bytes = count * DataTypeSize(type);
  if (bytes < tuning_.small_allreduce_bytes || count < static_cast<size_t>(channel_->size())) {
    return RecursiveDoublingAllreduce(send, recv, count, type, op, sequence, deadline);
  }
  return RingAllreduce(send, recv, count, type, op, sequence, deadline);
}

Status CollectiveAlgorithms::RingAllreduce(const void* send, void* recv, size_t count,
                                           DataType type, ReduceOp op, uint64_t sequence,
                                           Deadline deadline) {
  const int n = channel_->size();
  const int r = channel_->rank();
  const size_t element = DataTypeSize(type);
  auto* buffer = static_cast<std::byte*>(recv);
  // Out of place, the ring reads `send` where it first touches a chunk (step 0 sends it,
  // reduce-scatter reduces into `recv` from it) and writes every chunk of `recv`, so there is
  // no copy; buffers that partly overlap are copied first and run in place.
  const auto* input = static_cast<const std::byte*>(send);
  const size_t bytes = count * element;
  std::byte* incoming = nullptr;
  if (n > 1) {
    size_t largest_chunk = 0;
    for (int i = 0; i < n; ++i) {
      largest_chunk = std::max(largest_chunk, ChunkStart(count, n, i + 1) - ChunkStart(count, n, i));
    }
    ASSIGN_OR_RETURN(incoming, GrowScratch(scratch_, 1, largest_chunk * element,
        ScratchFor{r, CollectiveOp::kAllreduce, sequence, count, type, op},
        "a received chunk"));
  }
  if (input != buffer && n > 1 && input < buffer + bytes && buffer < input + bytes) {
    std::memmove(buffer, input, bytes);
    input = buffer;
  }
  if (n == 1 && input != buffer && bytes > 0) std::memmove(buffer, input, bytes);
  if (n > 1) {
    const int right = Mod(r + 1, n);
    const int left = Mod(r - 1, n);
    auto chunk_bytes = [&](int i) {
      return (ChunkStart(count, n, i + 1) - ChunkStart(count, n, i)) * element;
    };
    auto chunk_data = [&](int i) { return buffer + ChunkStart(count, n, i) * element; };
    auto chunk_input = [&](int i) { return input + ChunkStart(count, n, i) * element; };

    // Steps 0..n-2 reduce-scatter (afterwards this rank holds chunk r+1 fully reduced),
    // steps n-1..2n-3 allgather it. Step s sends the chunk step s-1 received, so the steps
    // form one chain. Reduce-scatter steps land in `incoming` (one chunk, reused: a step's
    // bytes are reduced as they arrive, before the next step's bytes can land), allgather
    // steps straight into place. The allgather results that overwrite chunks this rank sent
    // earlier cannot arrive before those chunks left: they contain this rank's contribution.
    const int steps = 2 * (n - 1);
    chain_out_.resize(steps);
    chain_in_.resize(steps);
    chain_sinks_.resize(n - 1);
    for (int step = 0; step < steps; ++step) {
      const bool reducing = step < n - 1;
      const int send_chunk = reducing ? Mod(r - step, n) : Mod(r + 1 - (step - (n - 1)), n);
      const int recv_chunk = reducing ? Mod(r - step - 1, n) : Mod(r - (step - (n - 1)), n);
      chain_out_[step] = OutgoingMessage{
          right,
          MakeHeader(CollectiveOp::kAllreduce, type, op, -1, sequence, count,
                     chunk_bytes(send_chunk)),
          step == 0 ? static_cast<const void*>(chunk_input(send_chunk)) : chunk_data(send_chunk)};
      SegmentSink* sink = nullptr;
      if (reducing) {
        chain_sinks_[step] =
            ReducingSink(chunk_data(recv_chunk), chunk_input(recv_chunk), incoming, type, op);
        sink = &chain_sinks_[step];
      }
      chain_in_[step] = IncomingMessage{
          left,
          MakeHeader(CollectiveOp::kAllreduce, type, op, -1, sequence, count,
                     chunk_bytes(recv_chunk)),
          reducing ? static_cast<void*>(incoming) : chunk_data(recv_chunk), sink,
          tuning_.segment_bytes};
    }
    RETURN_IF_ERROR(channel_->ExchangeChain(
        std::span<const OutgoingMessage>(chain_out_.data(), steps),
        std::span<const IncomingMessage>(chain_in_.data(), steps), deadline));
  }
  if (op == ReduceOp::kAvg) DivideElements(buffer, count, type, n);
  return Status::Ok();
}

Status CollectiveAlgorithms::RecursiveDoublingAllreduce(const void* send, void* recv,
                                                        size_t count, DataType type,
                                                        ReduceOp op, uint64_t sequence,
                                                        Deadline deadline) {
  const int n = channel_->size();
  const int r = channel_->rank();
  const size_t bytes = count * DataTypeSize(type);
  auto* buffer = static_cast<std::byte*>(recv);
  std::byte* incoming = nullptr;
  if (n > 1) {
    ASSIGN_OR_RETURN(incoming, GrowScratch(scratch_, 1, bytes,
        ScratchFor{r, CollectiveOp::kAllreduce, sequence, count, type, op},
        "a received copy of the buffer"));
  }
  if (send != recv && bytes > 0) std::memmove(buffer, send, bytes);
  if (n > 1) {
    const MessageHeader header =
        MakeHeader(CollectiveOp::kAllreduce, type, op, -1, sequence, count, bytes);
    int power = 1;
    while (power * 2 <= n) power *= 2;
    const int extra = n - power;  // ranks below 2*extra pair up: evens fold into odds
    int virtual_rank;
    if (r < 2 * extra) {
      if (r % 2 == 0) {
        OutgoingMessage out{r + 1, header, buffer};
        RETURN_IF_ERROR(channel_->Exchange(&out, nullptr, deadline));
        virtual_rank = -1;
      } else {
        ReducingSink sink(buffer, buffer, incoming, type, op);
        IncomingMessage in{r - 1, header, incoming, &sink, 0};
        RETURN_IF_ERROR(channel_->Exchange(nullptr, &in, deadline));
        virtual_rank = r / 2;
      }
    } else {
      virtual_rank = r - extra;
    }
    if (virtual_rank >= 0) {
      for (int mask = 1; mask < power; mask <<= 1) {
        const int virtual_peer = virtual_rank ^ mask;
        const int peer = virtual_peer < extra ? virtual_peer * 2 + 1 : virtual_peer + extra;
        OutgoingMessage out{peer, header, buffer};
        IncomingMessage in{peer, header, incoming};
        RETURN_IF_ERROR(channel_->Exchange(&out, &in, deadline));
        ReduceElements(buffer, buffer, incoming, count, type, op);
      }
    }
    if (r < 2 * extra) {
      if (r % 2 == 1) {
        OutgoingMessage out{r - 1, header, buffer};
        RETURN_IF_ERROR(channel_->Exchange(&out, nullptr, deadline));
      } else {
        IncomingMessage in{r + 1, header, buffer};
        RETURN_IF_ERROR(channel_->Exchange(nullptr, &in, deadline));
      }
    }
  }
  if (op == ReduceOp::kAvg) DivideElements(buffer, count, type, n);
  return Status::Ok();
}

Status CollectiveAlgorithms::Broadcast(void* buffer, size_t count, DataType type, int root,
                                       uint64_t sequence, Deadline deadline) {
  if (channel_->size() == 1) return Status::Ok();
  const size_t bytes = count * DataTypeSize(type);
  if (bytes < tuning_.small_broadcast_bytes || channel_->size() == 2) {
    return BinomialBroadcast(buffer, count, type, root, sequence, deadline);
  }
  return ChainBroadcast(buffer, count, type, root, sequence, deadline);
}

Status CollectiveAlgorithms::BinomialBroadcast(void* buffer, size_t count, DataType type,
                                               int root, uint64_t sequence, Deadline deadline) {
  const int n = channel_->size();
  const int virtual_rank = Mod(channel_->rank() - root, n);
  const size_t bytes = count * DataTypeSize(type);
  const MessageHeader header = MakeHeader(CollectiveOp::kBroadcast, type, ReduceOp::kSum, root,
                                          sequence, count, bytes);
  int mask = 1;
  while (mask < n) {
    if (virtual_rank & mask) {
      IncomingMessage in{Mod(virtual_rank - mask + root, n), header, buffer};
      RETURN_IF_ERROR(channel_->Exchange(nullptr, &in, deadline));
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (virtual_rank + mask < n) {
      OutgoingMessage out{Mod(virtual_rank + mask + root, n), header, buffer};
      RETURN_IF_ERROR(channel_->Exchange(&out, nullptr, deadline));
    }
  }
  return Status::Ok();
}

Status CollectiveAlgorithms::ChainBroadcast(void* buffer, size_t count, DataType type, int root,
                                            uint64_t sequence, Deadline deadline) {
  const int n = channel_->size();
  const int virtual_rank = Mod(channel_->rank() - root, n);
  const int previous = virtual_rank > 0 ? Mod(channel_->rank() - 1, n) : -1;
  const int next = virtual_rank < n - 1 ? Mod(channel_->rank() + 1, n) : -1;
  const size_t element = DataTypeSize(type);
  const size_t segment = std::max<size_t>(element, tuning_.segment_bytes / element * element);
  const size_t bytes = count * element;
  // bytes / segment rounded up, without the sum's overflow (a segment of SIZE_MAX bytes asks
  // for one piece; bytes + segment - 1 wrapped to no segments at all).
  const size_t segments = bytes / segment + (bytes % segment != 0 ? 1 : 0);
  auto* data = static_cast<std::byte*>(buffer);
  auto header_for = [&](size_t i) {
    return MakeHeader(CollectiveOp::kBroadcast, type, ReduceOp::kSum, root, sequence, count,
                      std::min(segment, bytes - i * segment));
  };
  // Step k receives segment k from the previous rank while forwarding segment k-1.
  for (size_t k = 0; k <= segments; ++k) {
    OutgoingMessage out;
    IncomingMessage in;
    const bool sending = next >= 0 && k >= 1;
    const bool receiving = previous >= 0 && k < segments;
    if (sending) out = OutgoingMessage{next, header_for(k - 1), data + (k - 1) * segment};
    if (receiving) in = IncomingMessage{previous, header_for(k), data + k * segment};
    if (!sending && !receiving) continue;
    RETURN_IF_ERROR(
        channel_->Exchange(sending ? &out : nullptr, receiving ? &in : nullptr, deadline));
  }
  return Status::Ok();
}

Status CollectiveAlgorithms::Allgather(const void* send, void* recv, size_t count,
                                       DataType type, uint64_t sequence, Deadline deadline) {
  const int n = channel_->size();
  const int r = channel_->rank();
  const size_t block = count * DataTypeSize(type);
  auto* output = static_cast<std::byte*>(recv);
  if (output + r * block != send && block > 0) std::memmove(output + r * block, send, block);
  const MessageHeader header =
      MakeHeader(CollectiveOp::kAllgather, type, ReduceOp::kSum, -1, sequence, count, block);
  if (n == 1) return Status::Ok();
  chain_out_.resize(n - 1);
  chain_in_.resize(n - 1);
  for (int step = 0; step < n - 1; ++step) {
    const int send_block = Mod(r - step, n);
    const int recv_block = Mod(r - step - 1, n);
    chain_out_[step] = OutgoingMessage{Mod(r + 1, n), header, output + send_block * block};
    chain_in_[step] = IncomingMessage{Mod(r - 1, n), header, output + recv_block * block,
                                      nullptr, tuning_.segment_bytes};
  }
  return channel_->ExchangeChain(std::span<const OutgoingMessage>(chain_out_.data(), n - 1),
                                 std::span<const IncomingMessage>(chain_in_.data(), n - 1),
                                 deadline);
}

Status CollectiveAlgorithms::ReduceScatter(const void* send, void* recv, size_t count,
                                           DataType type, ReduceOp op, uint64_t sequence,
                                           Deadline deadline) {
  const int n = channel_->size();
  const int r = channel_->rank();
  if (type == DataType::kFloat16 && op == ReduceOp::kAvg) {
    // [n blocks in | own block out], as float32.
    ASSIGN_OR_RETURN(float* wide,
                     GrowScratch(wide_, static_cast<size_t>(n) + 1, count,
                         ScratchFor{r, CollectiveOp::kReduceScatter, sequence, count, type, op},
                         "the float32 copy of a float16 average"));
    const size_t all = count * static_cast<size_t>(n);
    HalfToFloatElements(static_cast<const uint16_t*>(send), wide, all);
    RETURN_IF_ERROR(
        ReduceScatter(wide, wide + all, count, DataType::kFloat32, op, sequence, deadline));
    FloatToHalfElements(wide + all, static_cast<uint16_t*>(recv), count);
    return Status::Ok();
  }
  const size_t block = count * DataTypeSize(type);
  const auto* input = static_cast<const std::byte*>(send);
  auto* output = static_cast<std::byte*>(recv);
  if (n == 1) {
    if (output != input && block > 0) std::memmove(output, input, block);
  } else {
    // Scratch: [incoming | accumulator A | accumulator B]. Three blocks can be more than an
    // object holds where the caller's n blocks were not (two ranks).
    ASSIGN_OR_RETURN(std::byte* incoming,
                     GrowScratch(scratch_, 3, block,
                         ScratchFor{r, CollectiveOp::kReduceScatter, sequence, count, type, op},
                         "a received block and two accumulators"));
    std::byte* accumulators[2] = {incoming + block, incoming + 2 * block};
    const MessageHeader header =
        MakeHeader(CollectiveOp::kReduceScatter, type, op, -1, sequence, count, block);
    // The last step reduces straight into `output`, unless output overlaps the input (in
    // place: the result lands over block 0): with two ranks rank 1's only step sends input
    // block 0 while it reduces, and the transport sends and receives together, so the result
    // would overwrite bytes not yet sent. It then lands in an accumulator and is copied.
    const bool overlaps =
        output < input + static_cast<size_t>(n) * block && input < output + block;
    for (int step = 0; step < n - 1; ++step) {
      const int send_block = Mod(r - step - 1, n);
      const int recv_block = Mod(r - step - 2, n);
      const std::byte* outgoing =
          step == 0 ? input + send_block * block : accumulators[(step - 1) % 2];
      std::byte* target = step == n - 2 && !overlaps ? output : accumulators[step % 2];
      ReducingSink sink(target, input + recv_block * block, incoming, type, op);
      OutgoingMessage out{Mod(r + 1, n), header, outgoing};
      IncomingMessage in{Mod(r - 1, n), header, incoming, &sink, tuning_.segment_bytes};
      RETURN_IF_ERROR(channel_->Exchange(&out, &in, deadline));
    }
    if (overlaps && block > 0) std::memmove(output, accumulators[(n - 2) % 2], block);
  }
  if (op == ReduceOp::kAvg) DivideElements(output, count, type, n);
  return Status::Ok();
}

Status CollectiveAlgorithms::Barrier(uint64_t sequence, Deadline deadline) {
  const int n = channel_->size();
  const int r = channel_->rank();
  const MessageHeader header =
      MakeHeader(CollectiveOp::kBarrier, DataType::kUint8, ReduceOp::kSum, -1, sequence, 0, 0);
  for (int distance = 1; distance < n; distance <<= 1) {
    OutgoingMessage out{Mod(r + distance, n), header, nullptr};
    IncomingMessage in{Mod(r - distance, n), header, nullptr};
    RETURN_IF_ERROR(channel_->Exchange(&out, &in, deadline));
  }
  return Status::Ok();
}

}  // namespace tessera::collectives
