#include "collectives/local/communicator.h"

#include <cstring>
#include <string>

namespace tessera::collectives {

LocalCommunicator::LocalCommunicator(std::shared_ptr<LocalHub> hub, int rank,
                                     std::chrono::milliseconds default_timeout)
    : Communicator(rank, hub->size(), default_timeout), hub_(std::move(hub)) {}

const CommunicatorCapabilities& LocalCommunicator::capabilities() const {
  static const CommunicatorCapabilities kCapabilities{
      {CollectiveOp::kSend, CollectiveOp::kRecv}, {}, AllDataTypes(), {BufferLocation::kHost},
      /*verifies_calls=*/true};  // Recv checks tag, dtype and count; see the class comment
  return kCapabilities;
}

Status LocalCommunicator::DoSend(const void* buffer, size_t count, DataType type, int peer,
                                 int tag, Deadline) {
  LocalHub::Message message{tag, type, count, std::vector<std::byte>(count * DataTypeSize(type))};
  if (count > 0) std::memcpy(message.payload.data(), buffer, message.payload.size());
  {
    std::lock_guard<std::mutex> lock(hub_->mutex_);
    hub_->mailboxes_[static_cast<size_t>(rank()) * size() + peer].push_back(std::move(message));
  }
  hub_->arrived_.notify_all();
  return Status::Ok();
}

Status LocalCommunicator::DoRecv(void* buffer, size_t count, DataType type, int peer, int tag,
                                 Deadline deadline) {
  std::unique_lock<std::mutex> lock(hub_->mutex_);
  auto& mailbox = hub_->mailboxes_[static_cast<size_t>(peer) * size() + rank()];
  if (!hub_->arrived_.wait_until(lock, deadline, [&] { return !mailbox.empty(); })) {
    return DeadlineExceededError("rank " + std::to_string(rank()) + ": timed out waiting for rank " +
                                 std::to_string(peer) + " to send (tag " + std::to_string(tag) +
                                 ", count " + std::to_string(count) + ")");
  }
  LocalHub::Message message = std::move(mailbox.front());
  mailbox.pop_front();
  lock.unlock();
  if (message.tag != tag || message.type != type || message.count != count) {
    return FailedPreconditionError(
        "rank " + std::to_string(rank()) + ": call mismatch with rank " + std::to_string(peer) +
        ": this rank expected a message (tag " + std::to_string(tag) + ", count " +
        std::to_string(count) + ", " + std::string(DataTypeName(type)) + "), rank " +
        std::to_string(peer) + " sent (tag " + std::to_string(message.tag) + ", count " +
        std::to_string(message.count) + ", " + std::string(DataTypeName(message.type)) + ")");
  }
  if (count > 0) std::memcpy(buffer, message.payload.data(), message.payload.size());
  return Status::Ok();
}

}  // namespace tessera::collectives
