#include "collectives/verified.h"

#include <string>

#include "collectives/message.h"

namespace tessera::collectives {
namespace {

enum Field : size_t { kSequence = 0, kOp, kDtype, kCount, kReduceOp, kRoot };
constexpr const char* kFieldNames[] = {"sequence number", "op", "dtype", "count", "reduce op",
                                       "root"};
// How many differing ranks a mismatch message lists before summarising the rest.
constexpr int kListedRanks = 4;

// "allreduce #3 (count 10, float32, sum)", "broadcast #4 (count 8, int32, root 1)",
// "barrier #5". Fields come from another rank: out-of-range values are printed as numbers.
std::string DescribeCall(const std::array<int64_t, 6>& call) {
  const int64_t op = call[kOp];
  const bool known_op = op >= 0 && op <= static_cast<int64_t>(CollectiveOp::kRecv);
  std::string out = known_op ? std::string(CollectiveOpName(static_cast<CollectiveOp>(op)))
                             : "op " + std::to_string(op);
  out += " #" + std::to_string(call[kSequence]);
  if (known_op && static_cast<CollectiveOp>(op) == CollectiveOp::kBarrier) return out;
  out += " (count " + std::to_string(call[kCount]);
  const int64_t dtype = call[kDtype];
  if (dtype >= 0 && dtype <= static_cast<int64_t>(DataType::kFloat64)) {
    out += ", " + std::string(DataTypeName(static_cast<DataType>(dtype)));
  } else {
    out += ", dtype " + std::to_string(dtype);
  }
  const int64_t reduce = call[kReduceOp];
  if (reduce >= 0 && reduce <= static_cast<int64_t>(ReduceOp::kMin)) {
    out += ", " + std::string(ReduceOpName(static_cast<ReduceOp>(reduce)));
  } else if (reduce != -1) {
    out += ", reduce op " + std::to_string(reduce);
  }
  if (call[kRoot] != -1) out += ", root " + std::to_string(call[kRoot]);
  return out + ")";
}

}  // namespace

VerifiedCommunicator::VerifiedCommunicator(std::unique_ptr<Communicator> base)
    : Communicator(base->rank(), base->size(), base->default_timeout()),
      base_(std::move(base)),
      capabilities_(ReserveTopTag(base_->capabilities(), &header_tag_)),
      sent_to_(static_cast<size_t>(size()), 0),
      received_from_(static_cast<size_t>(size()), 0) {}

VerifiedCommunicator::Fingerprint VerifiedCommunicator::Make(CollectiveOp op, int64_t dtype,
                                                             size_t count, int64_t reduce_op,
                                                             int64_t root) {
  return {static_cast<int64_t>(sequence_++), static_cast<int64_t>(op), dtype,
          static_cast<int64_t>(count), reduce_op, root};
}

Status VerifiedCommunicator::Verify(const Fingerprint& mine, Deadline deadline) {
  if (size() == 1) return Status::Ok();
  // Each field and its complement (~x == -x - 1, which reverses the order as negation does
  // but has no value that overflows): after max, values[f] is the largest and
  // ~values[kFields + f] the smallest any rank holds. The results come from peers (a ring
  // hands on a peer's reduction), so they may be any int64, INT64_MIN included.
  std::array<int64_t, 2 * kFields> values;
  for (size_t f = 0; f < kFields; ++f) {
    values[f] = mine[f];
    values[kFields + f] = ~mine[f];
  }
  Status exchanged = CallHostAllreduce(*base_, values.data(), values.size(), ReduceOp::kMax,
                                       deadline);
  if (!exchanged.ok()) {
    return exchanged.WithContext("rank " + std::to_string(rank()) +
                                 ": checking that every rank calls " + DescribeCall(mine));
  }
  std::array<bool, kFields> differs{};
  bool any = false;
  for (size_t f = 0; f < kFields; ++f) {
    differs[f] = values[f] != ~values[kFields + f];
    any = any || differs[f];
  }
  if (!any) return Status::Ok();
  return ReportMismatch(mine, differs, deadline);
}

Status VerifiedCommunicator::ReportMismatch(const Fingerprint& mine,
                                            const std::array<bool, kFields>& differs,
                                            Deadline deadline) {
  std::string fields;
  for (size_t f = 0; f < kFields; ++f) {
    if (differs[f]) fields += (fields.empty() ? "" : ", ") + std::string(kFieldNames[f]);
  }
  const std::string call = DescribeCall(mine);
  std::string message = "rank " + std::to_string(rank()) + ": " +
                        call.substr(0, call.find(' ')) + " call mismatch across ranks (" + fields +
                        " differs): this rank called " + call;
  // Every rank reached this point (all saw the same max and min), so all run this exchange.
  gathered_.assign(static_cast<size_t>(size()) * kFields, 0);
  for (size_t f = 0; f < kFields; ++f) gathered_[static_cast<size_t>(rank()) * kFields + f] = mine[f];
  Status gathered = CallHostAllreduce(*base_, gathered_.data(), gathered_.size(), ReduceOp::kSum,
                                      deadline);
  if (!gathered.ok()) {
    return InvalidArgumentError(message + "; another rank's call differs (collecting the other " +
                                "ranks' calls failed: " + gathered.ToString() + ")");
  }
  int listed = 0, unlisted = 0;
  for (int r = 0; r < size(); ++r) {
    Fingerprint theirs;
    for (size_t f = 0; f < kFields; ++f) theirs[f] = gathered_[static_cast<size_t>(r) * kFields + f];
    if (theirs == mine) continue;
    if (listed == kListedRanks) {
      ++unlisted;
      continue;
    }
    message += "; rank " + std::to_string(r) + " called " + DescribeCall(theirs);
    ++listed;
  }
  if (unlisted > 0) message += "; and " + std::to_string(unlisted) + " more ranks differ";
  if (listed == 0) message += "; another rank's call differs from it";
  return InvalidArgumentError(message);
}

Status VerifiedCommunicator::DoAllreduce(const void* send, void* recv, size_t count,
                                         DataType type, ReduceOp op, Deadline deadline) {
  RETURN_IF_ERROR(Verify(Make(CollectiveOp::kAllreduce, static_cast<int64_t>(type), count,
                              static_cast<int64_t>(op), -1),
                         deadline));
  return CallAllreduce(*base_, send, recv, count, type, op, deadline);
}

Status VerifiedCommunicator::DoBroadcast(void* buffer, size_t count, DataType type, int root,
                                         Deadline deadline) {
  RETURN_IF_ERROR(
      Verify(Make(CollectiveOp::kBroadcast, static_cast<int64_t>(type), count, -1, root),
             deadline));
  return CallBroadcast(*base_, buffer, count, type, root, deadline);
}

Status VerifiedCommunicator::DoAllgather(const void* send, void* recv, size_t count,
                                         DataType type, Deadline deadline) {
  RETURN_IF_ERROR(
      Verify(Make(CollectiveOp::kAllgather, static_cast<int64_t>(type), count, -1, -1), deadline));
  return CallAllgather(*base_, send, recv, count, type, deadline);
}

Status VerifiedCommunicator::DoReduceScatter(const void* send, void* recv, size_t count,
                                             DataType type, ReduceOp op, Deadline deadline) {
  RETURN_IF_ERROR(Verify(Make(CollectiveOp::kReduceScatter, static_cast<int64_t>(type), count,
                              static_cast<int64_t>(op), -1),
                         deadline));
  return CallReduceScatter(*base_, send, recv, count, type, op, deadline);
}

Status VerifiedCommunicator::DoBarrier(Deadline deadline) {
  RETURN_IF_ERROR(Verify(Make(CollectiveOp::kBarrier, -1, 0, -1, -1), deadline));
  return CallBarrier(*base_, deadline);
}

Status VerifiedCommunicator::DoSend(const void* buffer, size_t count, DataType type, int peer,
                                    int tag, Deadline deadline) {
  const MessageHeader header =
      MakeHeader(CollectiveOp::kSend, type, ReduceOp::kSum, tag, sent_to_[peer]++, count,
                 count * DataTypeSize(type));
  RETURN_IF_ERROR(CallHostSend(*base_, &header, sizeof(header), peer, header_tag_, deadline));
  if (count == 0) return Status::Ok();
  return CallSend(*base_, buffer, count, type, peer, tag, deadline);
}

Status VerifiedCommunicator::DoRecv(void* buffer, size_t count, DataType type, int peer, int tag,
                                    Deadline deadline) {
  const MessageHeader expected =
      MakeHeader(CollectiveOp::kSend, type, ReduceOp::kSum, tag, received_from_[peer]++, count,
                 count * DataTypeSize(type));
  MessageHeader got;
  RETURN_IF_ERROR(CallHostRecv(*base_, &got, sizeof(got), peer, header_tag_, deadline));
  RETURN_IF_ERROR(CheckHeader(expected, got, rank(), peer));
  if (count == 0) return Status::Ok();
  return CallRecv(*base_, buffer, count, type, peer, tag, deadline);
}

// Control traffic of an enclosing wrapper passes through unverified.
Status VerifiedCommunicator::DoHostAllreduce(int64_t* values, size_t count, ReduceOp op,
                                             Deadline deadline) {
  return CallHostAllreduce(*base_, values, count, op, deadline);
}

Status VerifiedCommunicator::DoHostSend(const void* bytes, size_t size, int peer, int tag,
                                        Deadline deadline) {
  return CallHostSend(*base_, bytes, size, peer, tag, deadline);
}

Status VerifiedCommunicator::DoHostRecv(void* bytes, size_t size, int peer, int tag,
                                        Deadline deadline) {
  return CallHostRecv(*base_, bytes, size, peer, tag, deadline);
}

}  // namespace tessera::collectives
