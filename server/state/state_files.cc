#include "server/state/state_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace tessera::server {
namespace {

Status ErrnoStatus(const std::string& what, const std::string& path, int err) {
  std::string message = what + " '" + path + "': " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) return ResourceExhaustedError(message + " (the disk is full)");
  return InternalError(message);
}

// What a file that is not a regular one is, in words.
std::string FileKind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

}  // namespace

Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  return WriteFileWhole(path, bytes, kStateFileOptions);
}

Status WriteFileAtomically(const std::string& path, const std::vector<std::string_view>& pieces) {
  return WriteFileWhole(path, pieces, kStateFileOptions);
}

Status SyncStateDirectory(const std::string& dir) { return SyncDirectory(dir, kStateFileOptions.codes); }

Status CreateDirectoriesDurably(const std::string& dir) {
  std::filesystem::path path = std::filesystem::path(dir).lexically_normal();
  if (!path.has_filename() && path.has_parent_path()) path = path.parent_path();  // "a/b/" is "a/b"
  // The directories missing, the deepest first.
  std::vector<std::filesystem::path> missing;
  for (std::filesystem::path p = path; !p.empty(); p = p.parent_path()) {
    struct stat info {};
    if (::stat(p.c_str(), &info) == 0) {
      if (!S_ISDIR(info.st_mode)) {
        return FailedPreconditionError("cannot create directory '" + dir + "': '" + p.string() + "' is " +
                                       FileKind(info.st_mode) + "; expected a directory");
      }
      break;
    }
    if (errno != ENOENT) return ErrnoStatus("cannot create directory", p.string(), errno);
    missing.push_back(p);
    if (p == p.parent_path()) break;  // the root
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    // A directory made meanwhile by another process is as good; its parent is synced all the same.
    if (::mkdir(it->c_str(), 0777) != 0 && errno != EEXIST) {
      return ErrnoStatus("cannot create directory", it->string(), errno);
    }
    const std::string parent = it->parent_path().string();
    RETURN_IF_ERROR(SyncStateDirectory(parent.empty() ? "." : parent));
  }
  return Status::Ok();
}

Status CheckRegularFile(int fd, const std::string& path, const std::string& what, struct stat* info) {
  if (::fstat(fd, info) != 0) {
    return UnavailableError("cannot stat " + what + " '" + path + "': " + std::strerror(errno));
  }
  if (!S_ISREG(info->st_mode)) {
    return DataLossError(what + " '" + path + "' is " + FileKind(info->st_mode) + "; expected a regular file");
  }
  return Status::Ok();
}

Result<int> OpenRegularFileForReading(const std::string& path, const std::string& what, struct stat* info) {
  // O_NONBLOCK changes nothing for a regular file's reads; it only keeps a FIFO's open from
  // waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFoundError(what + " '" + path + "' is missing");
    return UnavailableError("cannot open " + what + " '" + path + "': " + std::strerror(err));
  }
  if (Status s = CheckRegularFile(fd, path, what, info); !s.ok()) {
    ::close(fd);
    return s;
  }
  return fd;
}

}  // namespace tessera::server
