// A file written whole or not at all.
//
// WriteFileWhole() writes `bytes` into a temporary beside `path` (PATH + options.suffix),
// created with options.mode and set to it again whatever the umask, never through a link in
// the temporary's place (O_NOFOLLOW: a planted link fails the write instead of redirecting
// it). Every write is checked, then the fsync (when options.sync) and the close, and only then
// is the temporary renamed over `path`. On any failure the temporary is removed and `path` is
// as it was: a full disk or a crash half-way never leaves a cut file under its name.
// An ofstream is not enough: it writes its last buffered bytes as it closes, unchecked.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "base/status.h"

namespace tessera {

struct WholeFileOptions {
  mode_t mode = 0644;
  // fsync before the rename: a file that must survive a power cut (keys, certificates,
  // exports). A hand-over read back at once by another process on this machine need not.
  bool sync = true;
  std::string suffix = ".tmp";
};

// DataLoss naming the file and the failing step ("cannot write 'PATH.tmp': No space left on
// device", "cannot rename 'PATH.tmp' to 'PATH': ..."), each path as QuoteUntrusted shows it
// (escaped, its first 256 characters).
Status WriteFileWhole(const std::string& path, std::string_view bytes, const WholeFileOptions& options = {});

}  // namespace tessera
