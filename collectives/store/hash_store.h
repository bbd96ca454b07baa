// HashStore: an in-memory Store for ranks that are threads of one process.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "collectives/store/store.h"

namespace tessera::collectives {

class HashStore final : public Store {
 public:
  Status Set(const std::string& key, const std::string& value) override;
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;  // guarded by mutex_
};

}  // namespace tessera::collectives
