// The state directory's files as the SQLite store writes and reads them: each file written
// whole (base/whole_file.h: a temporary beside it, fsync, rename, fsync of the directory),
// directories created so that their names survive a power cut, and files opened for reading
// without waiting on something that is not a regular file.
#pragma once

#include <sys/stat.h>

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/whole_file.h"

namespace tessera::server {

// How the state directory's files are written (base/whole_file.h): PATH.tmp, fsync, rename,
// fsync of the directory; the umask narrows the mode (0644), so a service's UMask=0077 keeps
// every file 0600; a full disk is ResourceExhausted naming the file, and the old file stays;
// any other failure is Internal naming the file and the step.
inline const WholeFileOptions kStateFileOptions{
    .mode = 0644, .apply_umask = true, .sync = true, .suffix = ".tmp", .codes = WholeFileCodes::kFullDiskOrInternal};

// Writes `bytes` to `path` whole, as kStateFileOptions says.
Status WriteFileAtomically(const std::string& path, std::string_view bytes);
// The same for the concatenation of `pieces`, written one after another (a checkpoint's
// header and tensors, without copying them into one buffer first).
Status WriteFileAtomically(const std::string& path, const std::vector<std::string_view>& pieces);
// fsync of a directory of the state, so that the names created, renamed or removed in it
// survive a power cut. An error names the directory, with kStateFileOptions' codes.
Status SyncStateDirectory(const std::string& dir);
// Creates `dir` and each missing directory above it, from the top down, syncing each new
// directory's parent after its mkdir, so that the new name survives a power cut. Ok when
// `dir` is a directory already. An error names the directory and the errno's text.
Status CreateDirectoriesDurably(const std::string& dir);

// Opens `path`, a `what` ("checkpoint") of the state directory, for reading: O_NONBLOCK, so
// that a FIFO in its place fails at once instead of waiting for a writer that may never come,
// then CheckRegularFile. Returns the descriptor, for the caller to close; `*info` is its
// fstat. NotFound when there is no file; Unavailable, naming the file and the errno's text,
// when the open fails for another reason (permissions, too many open files, a loop of links):
// that says nothing about the file's content.
Result<int> OpenRegularFileForReading(const std::string& path, const std::string& what, struct stat* info);
// fstat of `fd`, opened from `path`: Unavailable naming the file and the errno's text when
// fstat fails (an I/O failure, not damage), DataLoss naming the file, what it is (a FIFO, a
// directory, ...) and that a regular file was expected when it is not a regular file.
Status CheckRegularFile(int fd, const std::string& path, const std::string& what, struct stat* info);

}  // namespace tessera::server
