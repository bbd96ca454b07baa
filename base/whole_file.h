// A file written whole or not at all: the one writer of a whole file in Tessera (the state
// directory's checkpoints, keys and certificates, exports, traces, hand-overs to a trainer).
//
// WriteFileWhole() writes into a temporary beside `path` (PATH + options.suffix), then renames
// it over `path`:
//  1. whatever is at the temporary's name first (a write cut short, or a link put there) is
//     removed, a link's target untouched;
//  2. the temporary is created new (O_CREAT | O_EXCL | O_NOFOLLOW): a link or a file that
//     appears in its place meanwhile fails the write instead of being written through;
//  3. its mode is set (see WholeFileOptions::apply_umask);
//  4. the pieces are written one after another, every write checked, without joining them
//     into one buffer first;
//  5. with options.sync, it is fsync'd; then it is closed, the close checked (an ofstream is
//     not enough: it writes its last buffered bytes as it closes, unchecked);
//  6. it is renamed over `path`;
//  7. with options.sync, the directory is fsync'd, so that the rename survives a power cut.
// A failure at any step before the rename removes the temporary and leaves `path` as it was: a
// full disk or a crash half-way never leaves a cut file under its name. A failure of step 7
// comes after `path` holds the new bytes; it is reported all the same.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera {

// The Status code a failure gives. Whatever the code, the message names the step that failed
// and the file it failed on, each path as QuoteUntrusted shows it (escaped, its first 256
// characters), then the errno's text, and " (the disk is full)" for ENOSPC and EDQUOT:
// "cannot remove the stale 'PATH.tmp': ...", "cannot create 'PATH.tmp': ...", "cannot set the
// mode of 'PATH.tmp': ...", "cannot write 'PATH.tmp': No space left on device (the disk is
// full)", "cannot sync 'PATH.tmp': ...", "cannot close 'PATH.tmp': ...", "cannot rename
// 'PATH.tmp' to 'PATH': ...", "cannot open directory 'DIR': ...", "cannot sync directory 'DIR': ...".
enum class WholeFileCodes {
  // DataLoss for every failure: the file asked for was not written (an export, a trace, a
  // hand-over to a trainer, a key or a certificate).
  kDataLoss,
  // ResourceExhausted for a full disk, Internal for any other failure (the state directory's
  // files: an operator frees the disk; a job's error shows the code).
  kFullDiskOrInternal,
};

struct WholeFileOptions {
  mode_t mode = 0644;
  // false: the file has `mode` exactly, whatever the umask (a certificate another account
  // reads, a key 0600 on any system). true: the umask narrows `mode`, as open(2) does (the
  // state directory, made 0600 by a service's UMask=0077).
  bool apply_umask = false;
  // fsync of the temporary before the rename and of the directory after it: a file that must
  // survive a power cut (state, keys, certificates, exports). A hand-over read back at once by
  // another process on this machine need not.
  bool sync = true;
  std::string suffix = ".tmp";
  WholeFileCodes codes = WholeFileCodes::kDataLoss;
};

Status WriteFileWhole(const std::string& path, std::string_view bytes, const WholeFileOptions& options = {});
// The same for the concatenation of `pieces`, written one after another (a checkpoint's header
// and tensors, without copying them into one buffer first).
Status WriteFileWhole(const std::string& path, const std::vector<std::string_view>& pieces,
                      const WholeFileOptions& options = {});

// Writes `pieces` to `fd` one after another, as WriteFileWhole does to its temporary, retrying
// a write cut short or interrupted; an error is "cannot write 'PATH': ..." with `codes`' code.
Status WritePieces(int fd, const std::string& path, const std::vector<std::string_view>& pieces,
                   WholeFileCodes codes = WholeFileCodes::kDataLoss);

// fsync of a directory, so that the names created, renamed or removed in it survive a power
// cut. An error names the directory and the step ("cannot open directory", "cannot sync
// directory"), with `codes`' code.
Status SyncDirectory(const std::string& dir, WholeFileCodes codes = WholeFileCodes::kDataLoss);

}  // namespace tessera
