#include "collectives/message.h"

namespace tessera::collectives {

MessageHeader MakeHeader(CollectiveOp op, DataType type, ReduceOp reduce_op, int tag,
                         uint64_t sequence, uint64_t count, uint64_t payload_bytes) {
  MessageHeader header;
  header.op = static_cast<uint8_t>(op);
  header.dtype = static_cast<uint8_t>(type);
  header.reduce_op = static_cast<uint8_t>(reduce_op);
  header.tag = tag;
  header.sequence = sequence;
  header.count = count;
  header.payload_bytes = payload_bytes;
  return header;
}

std::string DescribeHeader(const MessageHeader& header) {
  if (header.magic != kMessageMagic) return "a message with a corrupt header";
  const auto op = static_cast<CollectiveOp>(header.op);
  std::string out = std::string(CollectiveOpName(op)) + " #" + std::to_string(header.sequence) +
                    " (count " + std::to_string(header.count) + ", " +
                    std::string(DataTypeName(static_cast<DataType>(header.dtype)));
  if (op == CollectiveOp::kAllreduce || op == CollectiveOp::kReduceScatter) {
    out += ", " + std::string(ReduceOpName(static_cast<ReduceOp>(header.reduce_op)));
  }
  if (op == CollectiveOp::kBroadcast) out += ", root " + std::to_string(header.tag);
  if (op == CollectiveOp::kSend) out += ", tag " + std::to_string(header.tag);
  out += ", " + std::to_string(header.payload_bytes) + "-byte message)";
  return out;
}

Status CheckHeader(const MessageHeader& expected, const MessageHeader& got, int self, int peer) {
  if (expected == got) return Status::Ok();
  return FailedPreconditionError("rank " + std::to_string(self) + ": call mismatch with rank " +
                                 std::to_string(peer) + ": this rank expected " +
                                 DescribeHeader(expected) + ", rank " + std::to_string(peer) +
                                 " sent " + DescribeHeader(got));
}

Status MessageChannel::ExchangeChain(std::span<const OutgoingMessage> out,
                                     std::span<const IncomingMessage> in, Deadline deadline) {
  if (out.size() != in.size()) {
    return InvalidArgumentError("ExchangeChain: " + std::to_string(out.size()) +
                                " outgoing messages but " + std::to_string(in.size()) +
                                " incoming ones; expected as many of each");
  }
  for (size_t i = 0; i < out.size(); ++i) RETURN_IF_ERROR(Exchange(&out[i], &in[i], deadline));
  return Status::Ok();
}

}  // namespace tessera::collectives
