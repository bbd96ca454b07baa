// The state directory's files as the SQLite store writes and reads them: each file written
// whole (a temporary beside it, fsync, rename, fsync of the directory), directories created
// so that their names survive a power cut, and files opened for reading without waiting on
// something that is not a regular file.
#pragma once

#include <sys/stat.h>

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera::server {

// Writes `bytes` to `path` atomically: a temporary file beside it (PATH.tmp), fsync, rename,
// fsync of the directory. Whatever is at PATH.tmp first (a write cut short, or a link put
// there) is removed, and the temporary is created new (O_EXCL | O_NOFOLLOW): a link in its
// place is never written through. A full disk gives ResourceExhausted naming the path, and
// the old file stays; another failure is Internal naming the path and the step.
Status WriteFileAtomically(const std::string& path, const std::string& bytes);
// The same for the concatenation of `pieces`, written one after another (a checkpoint's
// header and tensors, without copying them into one buffer first).
Status WriteFileAtomically(const std::string& path, const std::vector<std::string_view>& pieces);
// Writes `pieces` to `fd` one after another, as WriteFileAtomically does to its temporary;
// an error names `path` (ResourceExhausted for a full disk).
Status WritePieces(int fd, const std::string& path, const std::vector<std::string_view>& pieces);
// fsync of a directory, so that the names created or renamed in it survive a power cut. An
// error names the directory.
Status SyncDirectory(const std::string& dir);
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
