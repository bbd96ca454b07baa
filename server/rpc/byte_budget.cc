#include "server/rpc/byte_budget.h"

#include <vector>

namespace tessera::server {

void ByteBudget::Acquire(uint64_t bytes, std::function<void()> granted) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!waiters_.empty() || !FitsLocked(bytes)) {
      waiters_.push_back({bytes, std::move(granted)});
      return;
    }
    held_ += bytes;
  }
  granted();
}

void ByteBudget::Take(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  held_ += bytes;
}

void ByteBudget::Release(uint64_t bytes) {
  std::vector<std::function<void()>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = bytes > held_ ? 0 : held_ - bytes;
    while (!waiters_.empty() && FitsLocked(waiters_.front().bytes)) {
      held_ += waiters_.front().bytes;
      ready.push_back(std::move(waiters_.front().granted));
      waiters_.pop_front();
    }
  }
  for (auto& granted : ready) granted();
}

uint64_t ByteBudget::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

size_t ByteBudget::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiters_.size();
}

}  // namespace tessera::server
