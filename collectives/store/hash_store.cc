#include "collectives/store/hash_store.h"

#include "base/escape.h"

namespace tessera::collectives {

Status HashStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
  }
  changed_.notify_all();
  return Status::Ok();
}

Result<std::string> HashStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  const bool found = changed_.wait_for(lock, timeout, [&] { return values_.count(key) != 0; });
  if (!found) {
    return DeadlineExceededError("store key " + QuoteUntrusted(key) + " not set within " +
                                 std::to_string(timeout.count()) + " ms");
  }
  return values_[key];
}

Result<int64_t> HashStore::Add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = values_.find(key);
    if (it != values_.end()) {
      ASSIGN_OR_RETURN(value, ParseCounter(it->second, "store key " + QuoteUntrusted(key)));
    }
    ASSIGN_OR_RETURN(value, AddToCounter(value, delta, key));
    values_[key] = std::to_string(value);
  }
  changed_.notify_all();
  return value;
}

}  // namespace tessera::collectives
