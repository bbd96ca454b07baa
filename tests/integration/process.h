// A daemon under test as a real child process, its stdout and stderr in a log file.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace tessera::testing {

// Spawned at construction; SIGKILLed and reaped when destroyed if still running. `env` adds
// NAME=VALUE entries to this process's environment; `unset` removes the named variables.
class Process {
 public:
  Process(std::vector<std::string> argv, const std::string& log, std::vector<std::string> env = {},
          std::vector<std::string> unset = {})
      : log_(log) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    std::vector<std::string> environment;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      bool removed = false;
      for (const auto& name : unset) removed = removed || entry.rfind(name + "=", 0) == 0;
      for (const auto& mine : env) removed = removed || entry.rfind(mine.substr(0, mine.find('=') + 1), 0) == 0;
      if (!removed) environment.push_back(entry);
    }
    for (auto& e : env) environment.push_back(e);
    std::vector<char*> envp;
    for (auto& e : environment) envp.push_back(e.data());
    envp.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), envp.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~Process() { Kill(SIGKILL); }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // Sends `signal` and reaps the process.
  void Kill(int signal) {
    if (pid_ <= 0) return;
    ::kill(pid_, signal);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  void Signal(int signal) {
    if (pid_ > 0) ::kill(pid_, signal);
  }
  // The wait status (as waitpid gives it) once the process has ended, or nullopt if it is
  // still running after `timeout`; an ended process is reaped.
  std::optional<int> WaitExit(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return std::nullopt;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    do {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::steady_clock::now() < deadline);
    return std::nullopt;
  }
  std::string Log() const {
    std::ifstream in(log_);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }

 private:
  pid_t pid_ = -1;
  std::string log_;
};

// "exited with 0", "exited with 1", "killed by signal 15": a wait status for messages.
inline std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exited with " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "ended with wait status " + std::to_string(status);
}

}  // namespace tessera::testing
