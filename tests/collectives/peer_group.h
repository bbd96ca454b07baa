// Runs one body per rank, as threads of this process or as forked processes, and collects
// each rank's Status. A forked rank reports through a pipe; a rank that dies reports the
// signal or exit code. Bodies must not use gtest assertions (they would not cross fork):
// they return a Status instead.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"

namespace tessera::collectives::testing {

enum class RankMode { kThreads, kProcesses };

inline const char* RankModeName(RankMode mode) {
  return mode == RankMode::kThreads ? "threads" : "processes";
}

using RankBody = std::function<Status(int rank)>;

// Returns one Status per rank. For processes, `bound` is how long the parent waits for all
// children before killing them (generous: a hang is reported, never waited out).
inline std::vector<Status> RunRanks(int size, RankMode mode, const RankBody& body,
                                    std::chrono::seconds bound = std::chrono::seconds(120)) {
  std::vector<Status> results(size);
  if (mode == RankMode::kThreads) {
    std::vector<std::thread> threads;
    for (int rank = 0; rank < size; ++rank) {
      threads.emplace_back([&, rank] { results[rank] = body(rank); });
    }
    for (auto& thread : threads) thread.join();
    return results;
  }
  struct Child {
    pid_t pid;
    int pipe_read;
  };
  std::vector<Child> children;
  for (int rank = 0; rank < size; ++rank) {
    int fds[2];
    if (::pipe(fds) != 0) {
      results[rank] = InternalError("pipe failed");
      continue;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      Status status = body(rank);
      const std::string message = status.ok() ? "" : status.ToString();
      size_t off = 0;
      while (off < message.size()) {
        const ssize_t n = ::write(fds[1], message.data() + off, message.size() - off);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      ::close(fds[1]);
      ::_exit(status.ok() ? 0 : 1);
    }
    ::close(fds[1]);
    children.push_back({pid, fds[0]});
  }
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (int rank = 0; rank < static_cast<int>(children.size()); ++rank) {
    Child& child = children[rank];
    int wstatus = 0;
    for (;;) {
      const pid_t done = ::waitpid(child.pid, &wstatus, WNOHANG);
      if (done == child.pid) break;
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(child.pid, SIGKILL);
        ::waitpid(child.pid, &wstatus, 0);
        results[rank] = DeadlineExceededError("rank " + std::to_string(rank) +
                                              " hung and was killed");
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::string message;
    char buffer[4096];
    ssize_t n;
    while ((n = ::read(child.pipe_read, buffer, sizeof(buffer))) > 0) message.append(buffer, n);
    ::close(child.pipe_read);
    if (!results[rank].ok()) continue;
    if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) {
      results[rank] = Status::Ok();
    } else if (!message.empty()) {
      results[rank] = InternalError(message);
    } else if (WIFSIGNALED(wstatus)) {
      results[rank] = InternalError("rank " + std::to_string(rank) + " died of signal " +
                                    std::to_string(WTERMSIG(wstatus)));
    } else {
      results[rank] = InternalError("rank " + std::to_string(rank) + " exited with " +
                                    std::to_string(WEXITSTATUS(wstatus)));
    }
  }
  return results;
}

}  // namespace tessera::collectives::testing
