#include "collectives/store/store.h"

#include <algorithm>
#include <thread>

namespace tessera::collectives {

Status Store::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const std::string& key : keys) {
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now()));
    auto value = Get(key, left);
    if (!value.ok()) return value.status();
  }
  return Status::Ok();
}

Status PrefixStore::Wait(const std::vector<std::string>& keys,
                         std::chrono::milliseconds timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const std::string& key : keys) prefixed.push_back(prefix_ + key);
  return base_->Wait(prefixed, timeout);
}

Status StoreBarrier(Store& store, const std::string& key, int size,
                    std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(int64_t arrived, store.Add(key + "/arrived", 1));
  if (arrived == size) RETURN_IF_ERROR(store.Set(key + "/done", "1"));
  auto done = store.Get(key + "/done", timeout);
  if (!done.ok()) {
    return done.status().WithContext("barrier '" + key + "' with " + std::to_string(size) +
                                     " participants");
  }
  return Status::Ok();
}

}  // namespace tessera::collectives
