// The key-value store the coordinator serves to site cohorts for their rendezvous: members
// publish their addresses and ids under the round's prefix and wait for each other's.
// Entries live in memory; a round's keys are dropped when the round closes.
//
// Thread-safe. Get blocks for at most its timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "base/status.h"

namespace tessera::server {

class RendezvousStore {
 public:
  void Set(const std::string& key, std::string value);
  // The value of `key`, waiting up to `timeout` for it to be set; DeadlineExceeded naming it.
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout);
  int64_t Add(const std::string& key, int64_t delta);
  void ClearPrefix(const std::string& prefix);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

}  // namespace tessera::server
