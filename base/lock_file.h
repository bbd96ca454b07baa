// An exclusive lock on a file that names its holder: one process at a time owns a directory.
//
// Acquire() opens (creating) the lock file and takes flock(LOCK_EX) on it without waiting,
// then writes the holder's PID into it. The lock belongs to the open file: it is released
// when the LockFile is destroyed or the process dies however it dies (SIGKILL included), so
// a stale file left behind never blocks the next owner. A second LockFile on the same file,
// in this process or another, is refused. The directory holding the file is locked the same
// way, so that deleting the file while its owner runs does not let a second owner in. The
// file descriptors are not inherited by children.
//
// Thread-compatible: one owner; Acquire may be called from any thread.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"

namespace tessera {

class LockFile {
 public:
  // `what` names the thing locked in the error, e.g. "state directory './var'".
  // FailedPrecondition naming `what`, the holder's PID (as written in the file) and the lock
  // file when it is held; an error naming the path when it cannot be opened or written.
  // A symbolic link at `path` is not followed, and anything there but a regular file is
  // refused: FailedPrecondition naming the path and saying which.
  static Result<std::unique_ptr<LockFile>> Acquire(const std::string& path, const std::string& what);
  ~LockFile();  // releases the lock; the file stays

  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  LockFile(std::string path, int fd, int dir_fd) : path_(std::move(path)), fd_(fd), dir_fd_(dir_fd) {}
  std::string path_;
  int fd_;
  int dir_fd_;
};

}  // namespace tessera
