// FileStore: a Store in a directory shared by all ranks (local disk or a shared mount).
//
// Each key is a file; Set writes a temporary file and rename(2)s it into place, so a reader
// sees a whole value or nothing. Add serialises through flock(2) on a lock file. Get polls
// with a short backoff (1 to 20 ms). Remove the directory when the job is done.
#pragma once

#include <string>

#include "collectives/store/store.h"

namespace tessera::collectives {

class FileStore final : public Store {
 public:
  // Creates `directory` if needed.
  static Result<std::shared_ptr<FileStore>> Open(const std::string& directory);

  Status Set(const std::string& key, const std::string& value) override;
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  explicit FileStore(std::string directory) : directory_(std::move(directory)) {}
  std::string PathFor(const std::string& key) const;
  Result<std::string> TryRead(const std::string& path) const;  // NOT_FOUND when absent

  std::string directory_;
};

}  // namespace tessera::collectives
