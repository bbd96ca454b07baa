// A test's stand-in for a full disk: while a FileSizeLimit lives, this process's writes past
// `bytes` of a file are refused (EFBIG), with SIGXFSZ ignored so that the write fails instead
// of the process. Restores the limit and the signal's handler when it goes.
#pragma once

#include <sys/resource.h>

#include <csignal>

namespace tessera::testing {

class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old_);
    rlimit limited = old_;
    limited.rlim_cur = bytes;
    set_ = ::setrlimit(RLIMIT_FSIZE, &limited) == 0;
  }
  ~FileSizeLimit() {
    if (set_) ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  bool ok() const { return set_; }

 private:
  rlimit old_{};
  void (*old_handler_)(int) = SIG_DFL;
  bool set_ = false;
};

}  // namespace tessera::testing
