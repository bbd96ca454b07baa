#include "base/whole_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/escape.h"

namespace tessera {

namespace {

// How much of a path an error message shows: as much as the command line shows of an -o path.
constexpr size_t kShownPathChars = 256;

// The path often comes from a command line or a job: shown escaped and bounded.
std::string Shown(const std::string& path) { return QuoteUntrusted(path, kShownPathChars); }

// "cannot WHAT: ERRNO'S TEXT", with the code `codes` gives `error`.
Status Failure(const std::string& what, int error, WholeFileCodes codes) {
  const bool full = error == ENOSPC || error == EDQUOT;
  std::string message = "cannot " + what + ": " + std::strerror(error) + (full ? " (the disk is full)" : "");
  if (codes == WholeFileCodes::kDataLoss) return DataLossError(std::move(message));
  return full ? ResourceExhaustedError(std::move(message)) : InternalError(std::move(message));
}

}  // namespace

Status WritePieces(int fd, const std::string& path, const std::vector<std::string_view>& pieces,
                   WholeFileCodes codes) {
  for (std::string_view bytes : pieces) {
    for (size_t written = 0; written < bytes.size();) {
      const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Failure("write " + Shown(path), n < 0 ? errno : EIO, codes);
      written += static_cast<size_t>(n);
    }
  }
  return Status::Ok();
}

Status SyncDirectory(const std::string& dir, WholeFileCodes codes) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Failure("open directory " + Shown(dir), errno, codes);
  if (::fsync(dfd) != 0) {
    const int error = errno;
    ::close(dfd);
    return Failure("sync directory " + Shown(dir), error, codes);
  }
  ::close(dfd);
  return Status::Ok();
}

Status WriteFileWhole(const std::string& path, std::string_view bytes, const WholeFileOptions& options) {
  return WriteFileWhole(path, std::vector<std::string_view>{bytes}, options);
}

Status WriteFileWhole(const std::string& path, const std::vector<std::string_view>& pieces,
                      const WholeFileOptions& options) {
  const std::string temporary = path + options.suffix;
  const std::string shown = Shown(temporary);
  // A temporary left by a write cut short, or a link put in its place: removed (a link's
  // target untouched), and the temporary made new. O_EXCL fails on any name there, a link
  // included, so whatever appears between the two calls is never written through either.
  if (::unlink(temporary.c_str()) != 0 && errno != ENOENT) {
    return Failure("remove the stale " + shown, errno, options.codes);
  }
  const int fd =
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, options.mode);
  // Nothing of ours is there to remove: what O_EXCL found is someone else's.
  if (fd < 0) return Failure("create " + shown, errno, options.codes);
  // From here on the temporary is ours: every failure removes it.
  auto failed = [&](Status why) {
    ::unlink(temporary.c_str());
    return why;
  };
  auto close_failed = [&](Status why) {
    ::close(fd);
    return failed(std::move(why));
  };
  if (!options.apply_umask && ::fchmod(fd, options.mode) != 0) {
    return close_failed(Failure("set the mode of " + shown, errno, options.codes));
  }
  if (Status s = WritePieces(fd, temporary, pieces, options.codes); !s.ok()) return close_failed(s);
  if (options.sync && ::fsync(fd) != 0) return close_failed(Failure("sync " + shown, errno, options.codes));
  if (::close(fd) != 0) return failed(Failure("close " + shown, errno, options.codes));
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    return failed(Failure("rename " + shown + " to " + Shown(path), errno, options.codes));
  }
  if (!options.sync) return Status::Ok();
  // The rename is durable once the directory is: until then a power cut may undo it.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return SyncDirectory(dir.empty() ? "." : dir, options.codes);
}

}  // namespace tessera
