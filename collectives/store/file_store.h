// FileStore: a Store in a directory shared by all ranks (local disk or a shared mount).
//
// Each key is a file; Set writes it whole (base/whole_file.h): into a temporary beside it,
// named uniquely for each write (the process id and random bits, after a '~' no key's file
// name holds), every write and the close checked, then rename(2)d into place, so a reader sees
// a whole value or nothing, and writers of the same key at once, on one machine or several,
// never touch each other's temporaries. A write that fails (a full disk) removes its temporary,
// leaves the key as it was and is UNAVAILABLE naming the key, the step and the file. Values
// are not fsync'd: they matter only while the job's ranks live. Add serialises through flock(2) on the lock file ".lock" in
// the directory, taken without blocking and retried with a short backoff (1 to 20 ms) for up
// to `lock_timeout`: a process that holds it for good (stopped, hung) makes Add
// DEADLINE_EXCEEDED naming the lock file and the timeout instead of hanging every other rank.
// Get polls with the same backoff. Remove the directory when the job is done.
//
// Every key has a file of its own in the directory, whatever bytes the key holds (none, '/',
// "..", thousands): letters, digits, '_', '-' and '.' but a leading one stay, every other byte
// is written %XX, and a name that would be empty or over 200 bytes is cut and ends in "%#"
// and the key's SHA-256. So no key's file is the lock file or any dot file, holds the '~' of
// a temporary, reaches outside the directory or is over a file name's 255 bytes with its
// temporaries' suffix. Every rank running this code names each key's file alike.
//
// A key's file is read only when it is a regular file of at most kMaxValueBytes; anything else
// there (a symbolic link, never followed; a FIFO, a directory, a larger file) makes Get and Add
// FAILED_PRECONDITION naming the key and the file, at once, never another file's bytes, a read
// that blocks or a value held whole; nor is a link at the lock file's name followed. It is
// read to its end, and one that reads shorter or longer than its size (written in place, as no
// Set does) is FAILED_PRECONDITION naming the file and both sizes, never a part of it taken
// for the value.
#pragma once

#include <cstddef>
#include <string>

#include "collectives/store/store.h"

namespace tessera::collectives {

class FileStore final : public Store {
 public:
  static constexpr std::chrono::milliseconds kDefaultLockTimeout{30000};
  // The largest value a key's file may hold when read (a TcpStore field's limit).
  static constexpr size_t kMaxValueBytes = size_t{64} << 20;

  // Creates `directory` if needed. `lock_timeout` (> 0) bounds how long Add waits for the lock.
  static Result<std::shared_ptr<FileStore>> Open(
      const std::string& directory, std::chrono::milliseconds lock_timeout = kDefaultLockTimeout);

  Status Set(const std::string& key, const std::string& value) override;
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  FileStore(std::string directory, std::chrono::milliseconds lock_timeout)
      : directory_(std::move(directory)), lock_timeout_(lock_timeout) {}
  std::string PathFor(const std::string& key) const;
  Result<std::string> TryRead(const std::string& path) const;  // NOT_FOUND when absent

  std::string directory_;
  std::chrono::milliseconds lock_timeout_;
};

}  // namespace tessera::collectives
