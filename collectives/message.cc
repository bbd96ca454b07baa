#include "collectives/message.h"

#include <string>

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

namespace {

// A header may come from a peer that is not this build, or not Tessera: a field outside its
// enum is printed as the number that came ("dtype 200"), not as a name it does not have.
std::string DescribeOp(uint8_t op) {
  if (op <= static_cast<uint8_t>(CollectiveOp::kRecv)) {
    return std::string(CollectiveOpName(static_cast<CollectiveOp>(op)));
  }
  return "op " + std::to_string(op);
}

std::string DescribeDataType(uint8_t dtype) {
  if (dtype <= static_cast<uint8_t>(DataType::kFloat64)) {
    return std::string(DataTypeName(static_cast<DataType>(dtype)));
  }
  return "dtype " + std::to_string(dtype);
}

std::string DescribeReduceOp(uint8_t reduce_op) {
  if (reduce_op <= static_cast<uint8_t>(ReduceOp::kMin)) {
    return std::string(ReduceOpName(static_cast<ReduceOp>(reduce_op)));
  }
  return "reduce op " + std::to_string(reduce_op);
}

std::string Hex32(uint32_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out = "0x";
  for (int shift = 28; shift >= 0; shift -= 4) out += kDigits[(value >> shift) & 0xf];
  return out;
}

}  // namespace

std::string DescribeHeader(const MessageHeader& header) {
  if (header.magic != kMessageMagic) {
    return "a message with a corrupt header (magic " + Hex32(header.magic) + ", expected " +
           Hex32(kMessageMagic) + ")";
  }
  std::string out = DescribeOp(header.op) + " #" + std::to_string(header.sequence) +
                    " (count " + std::to_string(header.count) + ", " +
                    DescribeDataType(header.dtype);
  const auto op = static_cast<CollectiveOp>(header.op);
  if (op == CollectiveOp::kAllreduce || op == CollectiveOp::kReduceScatter) {
    out += ", " + DescribeReduceOp(header.reduce_op);
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
