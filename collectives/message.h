// MessageChannel: the ordered, framed point-to-point transport the send/recv algorithms
// (collectives/algorithms.h) run on. The p2p backend implements it over TCP
// (collectives/p2p/tcp_mesh.h); FallbackCommunicator implements it over any backend's
// Send/Recv (collectives/fallback.h).
//
// Every message is a MessageHeader followed by header.payload_bytes bytes. A receiver states
// the header it expects; anything else is a FAILED_PRECONDITION naming the peer and both
// sides' calls, so calls that do not match across ranks are reported, not silently wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/status.h"
#include "collectives/communicator.h"
#include "collectives/types.h"

namespace tessera::collectives {

inline constexpr uint32_t kMessageMagic = 0x4d435354;  // "TSCM" little-endian

// 40 bytes on the wire in host byte order (ranks of one job share an architecture).
struct MessageHeader {
  uint32_t magic = kMessageMagic;
  uint8_t op = 0;         // CollectiveOp; kSend for point-to-point messages
  uint8_t dtype = 0;      // DataType
  uint8_t reduce_op = 0;  // ReduceOp, 0 where it does not apply
  uint8_t reserved = 0;
  int32_t tag = -1;       // Send/Recv tag, Broadcast root, -1 otherwise
  uint32_t reserved2 = 0;
  uint64_t sequence = 0;  // collective call number, or point-to-point message number per peer
  uint64_t count = 0;     // elements in the whole call (not in this message)
  uint64_t payload_bytes = 0;

  bool operator==(const MessageHeader& other) const = default;
};
static_assert(sizeof(MessageHeader) == 40, "MessageHeader is a wire format");

MessageHeader MakeHeader(CollectiveOp op, DataType type, ReduceOp reduce_op, int tag,
                         uint64_t sequence, uint64_t count, uint64_t payload_bytes);
// "allreduce #5 (count 100, float32, sum, 400-byte message)". The header may be a peer's:
// a field outside its enum is printed as its number ("dtype 200"), a wrong magic as "a message
// with a corrupt header (magic 0x..., expected 0x4d435354)".
std::string DescribeHeader(const MessageHeader& header);
// OK when `got` equals `expected`; otherwise FAILED_PRECONDITION:
// "rank 1: call mismatch with rank 2: this rank is in <expected>, rank 2 sent <got>".
Status CheckHeader(const MessageHeader& expected, const MessageHeader& got, int self, int peer);

// Told as a message's payload arrives, in order, at segment boundaries and at the end.
class SegmentSink {
 public:
  virtual ~SegmentSink() = default;
  virtual void OnReceived(size_t offset, size_t bytes) = 0;
};

struct OutgoingMessage {
  int peer = -1;
  MessageHeader header;
  const void* data = nullptr;  // header.payload_bytes bytes
};

struct IncomingMessage {
  int peer = -1;
  MessageHeader expected;
  void* data = nullptr;          // room for expected.payload_bytes bytes
  SegmentSink* sink = nullptr;   // optional
  // Sink granularity, and the unit in which a chained exchange forwards this message (see
  // ExchangeChain); 0 = once at the end.
  size_t segment_bytes = 0;
};

class MessageChannel {
 public:
  virtual ~MessageChannel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sends `out` while receiving `in` (either may be null; they may name the same peer) and
  // returns when both are complete, or fails at the deadline naming the peer waited for.
  virtual Status Exchange(const OutgoingMessage* out, const IncomingMessage* in,
                          Deadline deadline) = 0;

  // A pipeline of exchanges in which each outgoing message forwards what the previous
  // incoming message delivered, as a ring step forwards the chunk it just reduced:
  // out[i+1]'s payload byte k may be sent as soon as in[i] has delivered byte k (landed in
  // in[i].data and, with a sink, been passed to it), and not before. Requires
  // out.size() == in.size() and out[i+1].header.payload_bytes <=
  // in[i].expected.payload_bytes. Messages to one peer go in order, as do messages from one
  // peer. Fails like Exchange.
  //
  // Callers must make sure that no incoming message overwrites bytes an earlier outgoing
  // message has not sent yet unless causality forbids it (a ring's allgather result cannot
  // arrive before this rank sent its own contribution).
  //
  // The default runs Exchange(out[i], in[i]) one step after another; a transport that can
  // overlap the steps overrides it.
  virtual Status ExchangeChain(std::span<const OutgoingMessage> out,
                               std::span<const IncomingMessage> in, Deadline deadline);
};

}  // namespace tessera::collectives
