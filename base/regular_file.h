// Opening a file that should be a regular one, for reading, without blocking: a FIFO (or a
// terminal) in its place would otherwise hold the open until some writer came, which might be
// never, and a directory would read as an empty file. Each caller words its own errors (a
// checkpoint, a dataset, a device profile), so this says only what happened.
#pragma once

#include <sys/stat.h>

#include <string>

namespace tessera {

struct RegularFileOpen {
  int fd = -1;              // open and regular: the caller closes it
  int open_errno = 0;       // the open failed with this
  int stat_errno = 0;       // the fstat failed with this (nothing is left open)
  bool not_regular = false; // opened, but not a regular file (nothing is left open)
  struct stat info {};      // the fstat's answer, where there was one

  bool ok() const { return fd >= 0; }
};

// Whether a symbolic link as the path's last component is followed. kRefuse (O_NOFOLLOW) is for
// files in a directory others may write, such as a store's: a link planted there would have
// the file read any other the process can. Refused, open_errno is ELOOP.
enum class FinalSymlink { kFollow, kRefuse };

// O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY (and O_NOFOLLOW for kRefuse), then fstat;
// O_NONBLOCK changes nothing for a regular file's reads.
RegularFileOpen OpenRegularFile(const std::string& path, FinalSymlink symlink = FinalSymlink::kFollow);

}  // namespace tessera
