#include "collectives/algorithms.h"

#include <algorithm>
#include <cstring>

#include "collectives/reduce.h"

namespace tessera::collectives {
namespace {

// dst[offset..] = reduce(a[offset..], b[offset..]) as bytes of a message arrive.
class ReducingSink final : public SegmentSink {
 public:
  ReducingSink(void* dst, const void* a, const void* b, DataType type, ReduceOp op)
      : dst_(static_cast<std::byte*>(dst)),
        a_(static_cast<const std::byte*>(a)),
        b_(static_cast<const std::byte*>(b)),
        type_(type),
        op_(op),
        element_(DataTypeSize(type)) {}
  void OnReceived(size_t offset, size_t bytes) override {
    ReduceElements(dst_ + offset, a_ + offset, b_ + offset, bytes / element_, type_, op_);
  }

 private:
  std::byte* dst_;
  const std::byte* a_;
  const std::byte* b_;
  DataType type_;
  ReduceOp op_;
  size_t element_;
};

// First element of chunk i when `count` elements are split as evenly as possible in n.
size_t ChunkStart(size_t count, int n, int i) {
  return static_cast<size_t>((static_cast<unsigned __int128>(count) * i) / n);
}

int Mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

CollectiveAlgorithms::CollectiveAlgorithms(MessageChannel* channel, AlgorithmTuning tuning)
    : channel_(channel), tuning_(tuning) {
  tuning_.segment_bytes = std::max<size_t>(8, tuning_.segment_bytes / 8 * 8);
}

std::byte* CollectiveAlgorithms::Scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

Status CollectiveAlgorithms::Allreduce(const void* send, void* recv, size_t count,
                                       DataType type, ReduceOp op, uint64_t sequence,
                                       Deadline deadline) {
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
  if (send != recv && count > 0) std::memmove(buffer, send, count * element);
  if (n > 1) {
    const int right = Mod(r + 1, n);
    const int left = Mod(r - 1, n);
    size_t largest_chunk = 0;
    for (int i = 0; i < n; ++i) {
      largest_chunk = std::max(largest_chunk, ChunkStart(count, n, i + 1) - ChunkStart(count, n, i));
    }
    std::byte* incoming = Scratch(largest_chunk * element);
    auto chunk_bytes = [&](int i) {
      return (ChunkStart(count, n, i + 1) - ChunkStart(count, n, i)) * element;
    };
    auto chunk_data = [&](int i) { return buffer + ChunkStart(count, n, i) * element; };

    // Reduce-scatter: after n-1 steps this rank holds chunk (r+1) fully reduced.
    for (int step = 0; step < n - 1; ++step) {
      const int send_chunk = Mod(r - step, n);
      const int recv_chunk = Mod(r - step - 1, n);
      OutgoingMessage out{right,
                          MakeHeader(CollectiveOp::kAllreduce, type, op, -1, sequence, count,
                                     chunk_bytes(send_chunk)),
                          chunk_data(send_chunk)};
      ReducingSink sink(chunk_data(recv_chunk), chunk_data(recv_chunk), incoming, type, op);
      IncomingMessage in{left,
                         MakeHeader(CollectiveOp::kAllreduce, type, op, -1, sequence, count,
                                    chunk_bytes(recv_chunk)),
                         incoming, &sink, tuning_.segment_bytes};
      RETURN_IF_ERROR(channel_->Exchange(&out, &in, deadline));
    }
    // Allgather of the reduced chunks, received straight into place.
    for (int step = 0; step < n - 1; ++step) {
      const int send_chunk = Mod(r + 1 - step, n);
      const int recv_chunk = Mod(r - step, n);
      OutgoingMessage out{right,
                          MakeHeader(CollectiveOp::kAllreduce, type, op, -1, sequence, count,
                                     chunk_bytes(send_chunk)),
                          chunk_data(send_chunk)};
      IncomingMessage in{left,
                         MakeHeader(CollectiveOp::kAllreduce, type, op, -1, sequence, count,
                                    chunk_bytes(recv_chunk)),
                         chunk_data(recv_chunk)};
      RETURN_IF_ERROR(channel_->Exchange(&out, &in, deadline));
    }
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
  if (send != recv && bytes > 0) std::memmove(buffer, send, bytes);
  if (n > 1) {
    const MessageHeader header =
        MakeHeader(CollectiveOp::kAllreduce, type, op, -1, sequence, count, bytes);
    std::byte* incoming = Scratch(bytes);
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
  const size_t segments = (bytes + segment - 1) / segment;
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
  for (int step = 0; step < n - 1; ++step) {
    const int send_block = Mod(r - step, n);
    const int recv_block = Mod(r - step - 1, n);
    OutgoingMessage out{Mod(r + 1, n), header, output + send_block * block};
    IncomingMessage in{Mod(r - 1, n), header, output + recv_block * block};
    RETURN_IF_ERROR(channel_->Exchange(&out, &in, deadline));
  }
  return Status::Ok();
}

Status CollectiveAlgorithms::ReduceScatter(const void* send, void* recv, size_t count,
                                           DataType type, ReduceOp op, uint64_t sequence,
                                           Deadline deadline) {
  const int n = channel_->size();
  const int r = channel_->rank();
  const size_t block = count * DataTypeSize(type);
  const auto* input = static_cast<const std::byte*>(send);
  auto* output = static_cast<std::byte*>(recv);
  if (n == 1) {
    if (output != input && block > 0) std::memmove(output, input, block);
  } else {
    // Scratch: [incoming | accumulator A | accumulator B].
    std::byte* incoming = Scratch(3 * block);
    std::byte* accumulators[2] = {incoming + block, incoming + 2 * block};
    const MessageHeader header =
        MakeHeader(CollectiveOp::kReduceScatter, type, op, -1, sequence, count, block);
    for (int step = 0; step < n - 1; ++step) {
      const int send_block = Mod(r - step - 1, n);
      const int recv_block = Mod(r - step - 2, n);
      const std::byte* outgoing =
          step == 0 ? input + send_block * block : accumulators[(step - 1) % 2];
      std::byte* target = step == n - 2 ? output : accumulators[step % 2];
      ReducingSink sink(target, input + recv_block * block, incoming, type, op);
      OutgoingMessage out{Mod(r + 1, n), header, outgoing};
      IncomingMessage in{Mod(r - 1, n), header, incoming, &sink, tuning_.segment_bytes};
      RETURN_IF_ERROR(channel_->Exchange(&out, &in, deadline));
    }
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
