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

// O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, then fstat; O_NONBLOCK changes nothing for a
// regular file's reads.
RegularFileOpen OpenRegularFile(const std::string& path);

}  // namespace tessera
