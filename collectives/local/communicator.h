// LocalCommunicator: an in-memory transport for ranks that are threads of one process. It
// declares Send and Recv only; wrapped in FallbackCommunicator it proves that every
// collective can be composed from send/recv alone. Send is buffered (copies and returns);
// Recv waits up to the deadline and checks tag, dtype and count against the next message.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "collectives/communicator.h"

namespace tessera::collectives {

// Mailboxes shared by the ranks of one local group. Thread-safe.
class LocalHub {
 public:
  explicit LocalHub(int size) : size_(size), mailboxes_(static_cast<size_t>(size) * size) {}
  int size() const { return size_; }

 private:
  friend class LocalCommunicator;
  struct Message {
    int tag;
    DataType type;
    size_t count;
    std::vector<std::byte> payload;
  };
  int size_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::vector<std::deque<Message>> mailboxes_;  // [from * size + to], guarded by mutex_
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalHub> hub, int rank,
                    std::chrono::milliseconds default_timeout);

  std::string_view backend_name() const override { return "local"; }
  const CommunicatorCapabilities& capabilities() const override;

 protected:
  Status DoSend(const void* buffer, size_t count, DataType type, int peer, int tag,
                Deadline deadline) override;
  Status DoRecv(void* buffer, size_t count, DataType type, int peer, int tag,
                Deadline deadline) override;

 private:
  std::shared_ptr<LocalHub> hub_;
};

}  // namespace tessera::collectives
