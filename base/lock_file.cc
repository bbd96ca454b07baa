#include "base/lock_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "base/escape.h"

namespace tessera {
namespace {

// The PID the holder wrote, or "" when the file holds none yet (it may be between taking
// the lock and writing).
std::string HolderPid(int fd) {
  char buffer[32] = {};
  const ssize_t n = ::pread(fd, buffer, sizeof(buffer) - 1, 0);
  std::string pid;
  for (ssize_t i = 0; i < n && std::isdigit(static_cast<unsigned char>(buffer[i])); ++i) pid += buffer[i];
  return pid;
}

}  // namespace

Result<std::unique_ptr<LockFile>> LockFile::Acquire(const std::string& path, const std::string& what) {
  // Never through a symbolic link: one planted at the lock's path would have this process
  // create or lock (and truncate, to write its PID) a file of the link's choosing. Not blocking
  // either: a FIFO there must not hold the open before it is refused below.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) {
    const int error = errno;
    if (error == ELOOP) {
      return FailedPreconditionError("the lock file " + QuoteUntrusted(path, 256) + " of " + what +
                                     " is a symbolic link, which is not followed; remove it");
    }
    return FailedPreconditionError("cannot open the lock file " + QuoteUntrusted(path, 256) + " of " + what + ": " +
                                   std::strerror(error));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return FailedPreconditionError("cannot stat the lock file " + QuoteUntrusted(path, 256) + " of " + what + ": " +
                                   std::strerror(error));
  }
  if (!S_ISREG(st.st_mode)) {  // a FIFO, a device, a socket
    ::close(fd);
    return FailedPreconditionError("the lock file " + QuoteUntrusted(path, 256) + " of " + what +
                                   " is not a regular file; remove it");
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    std::string pid = error == EWOULDBLOCK ? HolderPid(fd) : "";
    ::close(fd);
    if (error != EWOULDBLOCK) {
      return FailedPreconditionError("cannot lock " + QuoteUntrusted(path, 256) + ": " + std::strerror(error));
    }
    return FailedPreconditionError(what + " is in use by another process (" +
                                   (pid.empty() ? std::string("its PID is not written yet") : "pid " + pid) +
                                   ", lock file " + QuoteUntrusted(path, 256) + ")");
  }
  // The directory too: a lock file deleted by hand while its owner runs would otherwise let
  // the next process create a new one and lock that.
  std::string dir = path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
  if (dir.empty()) dir = path.find('/') == 0 ? "/" : ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0 || ::flock(dir_fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (dir_fd >= 0) ::close(dir_fd);
    ::close(fd);
    if (error == EWOULDBLOCK) {
      return FailedPreconditionError(what + " is in use by another process (its directory " + QuoteUntrusted(dir, 256) +
                                     " is locked, though the lock file " + QuoteUntrusted(path, 256) +
                                     " is not: was the lock file deleted while its owner ran?)");
    }
    return FailedPreconditionError("cannot lock the directory " + QuoteUntrusted(dir, 256) + ": " +
                                   std::strerror(error));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int error = errno;
    ::close(dir_fd);
    ::close(fd);
    return FailedPreconditionError("cannot write the PID into the lock file " + QuoteUntrusted(path, 256) + ": " +
                                   std::strerror(error));
  }
  return std::unique_ptr<LockFile>(new LockFile(path, fd, dir_fd));
}

LockFile::~LockFile() {
  ::close(dir_fd_);
  ::close(fd_);
}

}  // namespace tessera
