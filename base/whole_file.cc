#include "base/whole_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/escape.h"

namespace tessera {

namespace {

// How much of a path an error message shows: as much as the command line shows of an -o path.
constexpr size_t kShownPathChars = 256;

}  // namespace

Status WriteFileWhole(const std::string& path, std::string_view bytes, const WholeFileOptions& options) {
  const std::string temporary = path + options.suffix;
  // The path often comes from a command line or a job: shown escaped and bounded.
  const std::string shown_temporary = QuoteUntrusted(temporary, kShownPathChars);
  auto failed = [&](const std::string& what, int error) {
    ::unlink(temporary.c_str());
    return DataLossError("cannot " + what + ": " + std::strerror(error));
  };
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, options.mode);
  // Nothing of ours is there to remove: a link left in place, or a directory we cannot write.
  if (fd < 0) return DataLossError("cannot write " + shown_temporary + ": " + std::strerror(errno));
  auto close_failed = [&](const std::string& what, int error) {
    ::close(fd);
    return failed(what, error);
  };
  if (::fchmod(fd, options.mode) != 0) return close_failed("write " + shown_temporary, errno);
  for (size_t written = 0; written < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return close_failed("write " + shown_temporary, n < 0 ? errno : EIO);
    written += static_cast<size_t>(n);
  }
  if (options.sync && ::fsync(fd) != 0) return close_failed("write " + shown_temporary, errno);
  if (::close(fd) != 0) return failed("write " + shown_temporary, errno);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    return failed("rename " + shown_temporary + " to " + QuoteUntrusted(path, kShownPathChars), errno);
  }
  return Status::Ok();
}

}  // namespace tessera
