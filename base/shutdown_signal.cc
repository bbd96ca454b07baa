#include "base/shutdown_signal.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

namespace tessera {
namespace {

int pipe_fds[2] = {-1, -1};  // written by the handler, read by WaitForShutdownSignal

void OnShutdownSignal(int signal) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signal);
  // Non-blocking: if the pipe is full a shutdown is already pending.
  [[maybe_unused]] ssize_t n = ::write(pipe_fds[1], &byte, 1);
  errno = saved;
}

sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

Status InstallShutdownSignalHandlers() {
  static std::once_flag once;
  static Status installed;
  std::call_once(once, [] {
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
      installed = InternalError(std::string("cannot make the shutdown signal pipe: ") + std::strerror(errno));
      return;
    }
    ::fcntl(pipe_fds[1], F_SETFL, ::fcntl(pipe_fds[1], F_GETFL) | O_NONBLOCK);
    struct sigaction action {};
    action.sa_handler = OnShutdownSignal;
    action.sa_flags = SA_RESTART;
    sigfillset(&action.sa_mask);  // one handler at a time
    for (int signal : {SIGINT, SIGTERM}) {
      if (::sigaction(signal, &action, nullptr) != 0) {
        installed = InternalError("cannot handle signal " + std::to_string(signal) + ": " + std::strerror(errno));
        return;
      }
    }
  });
  return installed;
}

void BlockShutdownSignals() {
  sigset_t set = ShutdownSignals();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForShutdownSignal() {
  sigset_t set = ShutdownSignals();
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  unsigned char byte = 0;
  for (;;) {
    const ssize_t n = ::read(pipe_fds[0], &byte, 1);
    if (n == 1) return byte;
    if (n < 0 && errno == EINTR) continue;
    return 0;  // the pipe is gone: nothing more will come
  }
}

void WakeShutdownWaiter() {
  const unsigned char zero = 0;
  [[maybe_unused]] ssize_t n = ::write(pipe_fds[1], &zero, 1);
}

}  // namespace tessera
