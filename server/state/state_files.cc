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

Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  return WriteFileAtomically(path, std::vector<std::string_view>{bytes});
}

Status WritePieces(int fd, const std::string& path, const std::vector<std::string_view>& pieces) {
  for (std::string_view bytes : pieces) {
    size_t written = 0;
    while (written < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus("cannot write", path, errno);
      if (n == 0) return ErrnoStatus("cannot write", path, EIO);
      written += static_cast<size_t>(n);
    }
  }
  return Status::Ok();
}

Status WriteFileAtomically(const std::string& path, const std::vector<std::string_view>& pieces) {
  const std::string tmp = path + ".tmp";
  // A temporary left by a write cut short, or a link put in its place: removed (a link's
  // target untouched), and the temporary made new. O_EXCL fails on any name there, a link
  // included, so whatever appears between the two calls is never written through either.
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) return ErrnoStatus("cannot remove the stale", tmp, errno);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create", tmp, errno);
  const auto failed = [&](Status why) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return why;
  };
  if (Status s = WritePieces(fd, tmp, pieces); !s.ok()) return failed(s);
  if (::fsync(fd) != 0) return failed(ErrnoStatus("cannot sync", tmp, errno));
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus("cannot close", tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoStatus("cannot rename into", path, err);
  }
  // The rename is durable once the directory is: until then a power cut may undo it.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return SyncDirectory(dir.empty() ? "." : dir);
}

Status SyncDirectory(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoStatus("cannot open directory", dir, errno);
  if (::fsync(dfd) != 0) {
    const int err = errno;
    ::close(dfd);
    return ErrnoStatus("cannot sync directory", dir, err);
  }
  ::close(dfd);
  return Status::Ok();
}

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
    RETURN_IF_ERROR(SyncDirectory(parent.empty() ? "." : parent));
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
