#include "server/rendezvous_store.h"

namespace tessera::server {

void RendezvousStore::Set(const std::string& key, std::string value) {
  std::lock_guard<std::mutex> lock(mu_);
  values_[key] = std::move(value);
  cv_.notify_all();
}

Result<std::string> RendezvousStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return values_.count(key) > 0; })) {
    return DeadlineExceededError("rendezvous key '" + key + "' was not set within " +
                                 std::to_string(timeout.count()) + " ms");
  }
  return values_[key];
}

int64_t RendezvousStore::Add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string& slot = values_[key];
  int64_t value = slot.empty() ? 0 : std::stoll(slot);
  value += delta;
  slot = std::to_string(value);
  cv_.notify_all();
  return value;
}

void RendezvousStore::ClearPrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = values_.lower_bound(prefix); it != values_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    it = values_.erase(it);
  }
}

size_t RendezvousStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.size();
}

}  // namespace tessera::server
