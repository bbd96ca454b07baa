#include "worker/external_trainer.h"

#include <fcntl.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <map>
#include <cstring>
#include <sstream>
#include <thread>

#include "base/escape.h"
#include "core/data/numpy_format.h"
#include "worker/round_deadline.h"

extern char** environ;

namespace tessera::worker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxReplyBytes = 64 * 1024;
constexpr int kChildRequestFd = 3, kChildReplyFd = 4;

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string JsonQuote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
      out += buffer;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonNumber(double v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  return out.str();
}

// A pipe whose two ends are above the descriptors the child is given (3 and 4), close-on-exec.
Status MakePipe(int ends[2]) {
  int raw[2];
  if (pipe2(raw, O_CLOEXEC) != 0) return FailedPreconditionError(std::string("pipe: ") + std::strerror(errno));
  for (int i = 0; i < 2; ++i) {
    ends[i] = fcntl(raw[i], F_DUPFD_CLOEXEC, 10);
    close(raw[i]);
    if (ends[i] < 0) return FailedPreconditionError(std::string("fcntl: ") + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

Result<TrainerCommand> ParseTrainerFlag(const std::string& value) {
  const size_t eq = value.find('=');
  if (eq == std::string::npos) {
    return InvalidArgumentError("--trainer: expected NAME=COMMAND (e.g. pytorch=/usr/bin/python3 train.py), got " +
                                QuoteUntrusted(value, 128));
  }
  TrainerCommand command;
  command.name = value.substr(0, eq);
  if (command.name.empty() || command.name.size() > 64 ||
      command.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789._-") != std::string::npos) {
    return InvalidArgumentError("--trainer: the name must have 1 to 64 characters from [a-z0-9._-], got " +
                                QuoteUntrusted(command.name, 64));
  }
  std::istringstream words(value.substr(eq + 1));
  for (std::string word; words >> word;) command.argv.push_back(word);
  if (command.argv.empty()) return InvalidArgumentError("--trainer " + command.name + ": the command is empty");
  return command;
}

namespace {

bool IsExecutableFile(const std::string& file) {
  struct stat st {};
  return ::stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(file.c_str(), X_OK) == 0;
}

}  // namespace

Status CheckTrainerProgram(const TrainerCommand& command, const std::string& path) {
  const std::string& program = command.argv.front();
  const std::string what = "--trainer " + command.name + ": the program " + QuoteUntrusted(program, 256);
  if (program.find('/') != std::string::npos) {
    if (IsExecutableFile(program)) return Status::Ok();
    return InvalidArgumentError(what + " is not an executable file");
  }
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find(':', start), path.size());
    const std::string dir = path.substr(start, end - start);
    if (IsExecutableFile((dir.empty() ? "." : dir) + "/" + program)) return Status::Ok();
    start = end + 1;
  }
  return InvalidArgumentError(what + " is not an executable file in any directory of PATH (" +
                              QuoteUntrusted(path, 256) + "); give its path");
}

Clock::time_point TrainerDeadline(int64_t deadline_unix_ms, int64_t now_unix_ms) {
  if (deadline_unix_ms <= 0) return Clock::now() + std::chrono::hours(24);
  return Clock::now() + TimeLeftUntil(deadline_unix_ms, now_unix_ms);
}

ExternalTrainer::ExternalTrainer(TrainerCommand command, std::string work_dir)
    : command_(std::move(command)), work_dir_(std::move(work_dir)) {}

ExternalTrainer::~ExternalTrainer() {
  StopProcess(std::chrono::seconds(5));
  if (!share_path_.empty()) std::remove(share_path_.c_str());
}

Status ExternalTrainer::Start() {
  // A write to a trainer that has just died must fail with EPIPE, not end the worker.
  signal(SIGPIPE, SIG_IGN);
  int request[2], reply[2];
  RETURN_IF_ERROR(MakePipe(request));
  if (Status s = MakePipe(reply); !s.ok()) {
    close(request[0]);
    close(request[1]);
    return s;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, request[0], kChildRequestFd);
  posix_spawn_file_actions_adddup2(&actions, reply[1], kChildReplyFd);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "TESSERA_TRAINER_FDS=", 20) != 0) env_strings.emplace_back(*e);
  }
  env_strings.push_back("TESSERA_TRAINER_FDS=3,4");
  std::vector<char*> envp, argv;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (auto& a : command_.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The trainer starts with no signal blocked and the usual dispositions, whatever this
  // thread blocks (the worker's threads block SIGINT and SIGTERM for its shutdown handler).
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaddset(&defaults, signal);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  // In a process group of its own, so that what it starts (a shell script's commands, data
  // loader workers) ends with it (EndProcessGroup).
  posix_spawnattr_setpgroup(&attributes, 0);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  // posix_spawnp, not fork: the child only applies the file actions and attributes above and
  // execs, so it runs nothing that takes a lock another thread of the worker may hold at that
  // moment (a host-name lookup left running past its deadline holds the resolver's, see
  // PauseHostLookups in collectives/tcp_socket.h). A fork whose child went on to run code of
  // its own would have to pause lookups first.
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &actions, &attributes, argv.data(), envp.data());
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  close(request[0]);
  close(reply[1]);
  if (rc != 0) {
    close(request[1]);
    close(reply[0]);
    return FailedPreconditionError("external trainer '" + command_.name + "': cannot start " +
                                   QuoteUntrusted(command_.argv[0], 256) + ": " + std::strerror(rc));
  }
  pid_ = pid;
  request_fd_ = request[1];
  reply_fd_ = reply[0];
  pending_.clear();
  spdlog::info("external trainer '{}' started (pid {})", command_.name, pid_);
  return Status::Ok();
}

namespace {

// Waits up to `grace` for process `pid` (a group leader) to exit, then kills its whole group
// (the leader too, if it has not exited) and reaps it; its wait status, or -1 when it could not
// be waited for. The group is killed before the leader is reaped: until then its id cannot be
// another process's.
int EndProcessGroup(pid_t pid, std::chrono::milliseconds grace) {
  const auto until = Clock::now() + grace;
  while (true) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == EINTR) continue;
      return -1;  // not our child any more
    }
    if (info.si_pid == pid || Clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return status;
}

}  // namespace

void ExternalTrainer::StopProcess(std::chrono::milliseconds grace) {
  if (request_fd_ >= 0) close(request_fd_);
  request_fd_ = -1;
  if (pid_ > 0) {
    EndProcessGroup(pid_, grace);
    pid_ = 0;
  }
  if (reply_fd_ >= 0) close(reply_fd_);
  reply_fd_ = -1;
  pending_.clear();
}

std::string ExternalTrainer::ExitDescription() {
  // It has closed its end of the channel; give it 2 s to exit before killing it.
  const int status = EndProcessGroup(pid_, std::chrono::seconds(2));
  pid_ = 0;
  if (status < 0) return "ended";
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended";
}

Result<std::string> ExternalTrainer::ReadLine(Clock::time_point deadline, const std::function<bool()>& should_stop,
                                              const std::string& waiting) {
  const std::string who = "external trainer '" + command_.name + "' (pid " + std::to_string(pid_) + ")";
  while (true) {
    const size_t newline = pending_.find('\n');
    if (newline != std::string::npos) {
      std::string line = pending_.substr(0, newline);
      pending_.erase(0, newline + 1);
      return line;
    }
    if (pending_.size() > kMaxReplyBytes) {
      StopProcess(std::chrono::milliseconds(0));
      return InvalidArgumentError(who + ": a reply line longer than " + std::to_string(kMaxReplyBytes) +
                                  " bytes while " + waiting + "; stopped it");
    }
    if (should_stop && should_stop()) {
      StopProcess(std::chrono::milliseconds(0));
      return CancelledError(who + ": stopped while " + waiting +
                            " (the task cancelled, its session ended or the worker stopping)");
    }
    if (Clock::now() >= deadline) {
      StopProcess(std::chrono::milliseconds(0));
      return DeadlineExceededError(who + ": no reply by the round's deadline while " + waiting + "; killed it");
    }
    pollfd p{reply_fd_, POLLIN, 0};
    const int ready = poll(&p, 1, 100);
    if (ready < 0 && errno != EINTR) {
      const std::string why = std::strerror(errno);
      StopProcess(std::chrono::milliseconds(0));  // its reply would be taken for the next round's
      return FailedPreconditionError(who + ": poll: " + why + "; stopped it");
    }
    if (ready <= 0) continue;
    char buffer[4096];
    const ssize_t n = read(reply_fd_, buffer, sizeof(buffer));
    if (n > 0) {
      pending_.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    // The process closed its reply channel: it has exited or is exiting.
    const std::string how = ExitDescription();
    StopProcess(std::chrono::milliseconds(0));
    return FailedPreconditionError(who + " " + how + " while " + waiting + " (see its output in this worker's log)");
  }
}

Status ExternalTrainer::CheckNoReplyUnasked(const std::string& what) {
  while (pending_.size() <= kMaxReplyBytes) {
    pollfd p{reply_fd_, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0 || (p.revents & POLLIN) == 0) break;
    char buffer[4096];
    const ssize_t n = read(reply_fd_, buffer, sizeof(buffer));
    if (n <= 0) break;
    pending_.append(buffer, static_cast<size_t>(n));
  }
  if (pending_.empty()) return Status::Ok();
  const std::string line = pending_.substr(0, pending_.find('\n'));
  const pid_t pid = pid_;
  StopProcess(std::chrono::milliseconds(0));
  return InvalidArgumentError(what + ": the process (pid " + std::to_string(pid) +
                              ") replied when no round was asked of it (one reply per request): " +
                              QuoteUntrusted(line, 128) + "; stopped it, the next round starts a fresh one");
}

namespace {

// The reply line to a round: "update" with its fields into *result, or the trainer's own
// "error" (FailedPrecondition). InvalidArgument for a line that is neither.
Status ReadReply(const std::string& reply, const Dataset& share, const std::string& what,
                 ExternalTrainerResult* result) {
  google::protobuf::Struct message;
  if (!google::protobuf::util::JsonStringToMessage(reply, &message).ok()) {
    return InvalidArgumentError(what + ": the reply is not a JSON object: " + QuoteUntrusted(reply, 128));
  }
  const auto& fields = message.fields();
  auto text = [&](const char* key) -> std::string {
    auto it = fields.find(key);
    return it != fields.end() && it->second.has_string_value() ? it->second.string_value() : "";
  };
  const std::string type = text("type");
  if (type == "error") {
    return FailedPreconditionError(what + ": the trainer could not train: " + QuoteUntrusted(text("message"), 512));
  }
  if (type != "update") {
    return InvalidArgumentError(what + ": reply field 'type': expected \"update\" or \"error\", got " +
                                QuoteUntrusted(type, 64));
  }
  auto number = [&](const char* key, double* out) -> Status {
    auto it = fields.find(key);
    if (it == fields.end() || !it->second.has_number_value() || !std::isfinite(it->second.number_value())) {
      return InvalidArgumentError(what + ": reply field '" + key + "': expected a finite number");
    }
    *out = it->second.number_value();
    return Status::Ok();
  };
  double samples = 0;
  RETURN_IF_ERROR(number("samples", &samples));
  if (samples < 1 || samples != std::floor(samples) || samples > static_cast<double>(share.count)) {
    return InvalidArgumentError(what + ": reply field 'samples': expected a whole number in [1, " +
                                std::to_string(share.count) + "] (this worker's share), got " + JsonNumber(samples));
  }
  result->samples = static_cast<uint64_t>(samples);
  if (fields.count("loss") > 0) RETURN_IF_ERROR(number("loss", &result->loss));
  return Status::Ok();
}

}  // namespace

Result<ExternalTrainerResult> ExternalTrainer::Train(const ExternalTrainerRequest& request, const TensorSet& global,
                                                     const Dataset& share, const std::string& share_key,
                                                     Clock::time_point deadline,
                                                     const std::function<bool()>& should_stop) {
  const std::string what = "external trainer '" + command_.name + "', job " + request.job_id + " round " +
                           std::to_string(request.round);
  ExternalTrainerResult result;
  const auto handover_start = Clock::now();
  const std::string suffix = std::to_string(request.round) + "-" + std::to_string(request.attempt) + ".npz";
  const std::string model_path = work_dir_ + "/model-" + suffix;
  const std::string out_path = work_dir_ + "/update-" + suffix;
  // The round's files go whatever the round's end: an error, a deadline or a cancel left a
  // model-sized file in the private directory (often memory-backed) until the worker exited.
  // So does "out" + kTrainerTemporarySuffix, where tessera_client writes the trained model
  // before renaming it to "out": a process killed mid-write (the round's deadline) left it.
  const std::string out_temporary = out_path + kTrainerTemporarySuffix;
  struct RemoveOnExit {
    const std::string& model;
    const std::string& out;
    const std::string& out_temporary;
    ~RemoveOnExit() {
      std::remove(out.c_str());
      std::remove(out_temporary.c_str());
      std::remove(model.c_str());
    }
  } remove_on_exit{model_path, out_path, out_temporary};
  RETURN_IF_ERROR(WriteNpz(model_path, ToNumpy(global), /*sync=*/false).WithContext(what));
  if (share_written_ != share_key) {
    // Under a name of its own: the work directory is shared by every trainer of the worker,
    // and a trainer may keep the arrays it read by their file's name.
    const std::string share_path =
        work_dir_ + "/share-" + command_.name + "-" + std::to_string(++shares_written_) + ".npz";
    NumpyArray x, y;
    x.name = "x";
    x.dtype = "<f4";
    x.shape = {share.count, share.channels, share.rows, share.cols};
    const std::vector<float> values = share.Values();
    x.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    y.name = "y";
    y.dtype = "<i8";
    y.shape = {share.count};
    std::vector<int64_t> labels(share.labels.begin(), share.labels.end());
    y.data.assign(reinterpret_cast<const char*>(labels.data()), labels.size() * sizeof(int64_t));
    RETURN_IF_ERROR(WriteNpz(share_path, {x, y}, /*sync=*/false).WithContext(what));
    if (!share_path_.empty()) std::remove(share_path_.c_str());
    share_path_ = share_path;
    share_written_ = share_key;
  }
  std::remove(out_path.c_str());
  result.handover_ms = MillisSince(handover_start);

  const auto train_start = Clock::now();
  // A process that exited since its last round (a crash, an out-of-memory kill) is replaced
  // now, rather than failing this round at its request.
  if (pid_ > 0) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_) {
      const pid_t gone = pid_;
      const std::string how = ExitDescription();  // reaps it
      StopProcess(std::chrono::milliseconds(0));
      spdlog::warn("external trainer '{}' (pid {}) {} since its last round; starting a fresh one", command_.name, gone,
                   how);
    }
  }
  if (pid_ == 0) RETURN_IF_ERROR(Start());
  RETURN_IF_ERROR(CheckNoReplyUnasked(what));
  const std::string line =
      "{\"type\": \"train\", \"job\": " + JsonQuote(request.job_id) + ", \"round\": " + std::to_string(request.round) +
      ", \"attempt\": " + std::to_string(request.attempt) + ", \"party\": " + std::to_string(request.party) +
      ", \"model\": " + JsonQuote(model_path) + ", \"data\": " + JsonQuote(share_path_) +
      ", \"out\": " + JsonQuote(out_path) + ", \"epochs\": " + std::to_string(request.epochs) +
      ", \"batch_size\": " + std::to_string(request.batch_size) + ", \"learning_rate\": " +
      JsonNumber(request.learning_rate) + ", \"momentum\": " + JsonNumber(request.momentum) +
      ", \"weight_decay\": " + JsonNumber(request.weight_decay) + ", \"seed\": " + std::to_string(request.seed) + "}\n";
  for (size_t written = 0; written < line.size();) {
    const ssize_t n = write(request_fd_, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string how = ExitDescription();
      StopProcess(std::chrono::milliseconds(0));
      return FailedPreconditionError(what + ": the process " + how + " before it took the round's request");
    }
    written += static_cast<size_t>(n);
  }
  ASSIGN_OR_RETURN(std::string reply, ReadLine(deadline, should_stop, "training round " + std::to_string(request.round)));
  result.train_ms = MillisSince(train_start);
  if (Status read = ReadReply(reply, share, what, &result); !read.ok()) {
    if (read.code() != StatusCode::kInvalidArgument) return read;  // the trainer's own error, a reply in step
    // A malformed line (a library's print on the reply channel, say) may be followed by the
    // process's real reply, which the next round would take for its own: the process goes.
    const pid_t pid = pid_;
    StopProcess(std::chrono::milliseconds(0));
    return InvalidArgumentError(std::string(read.message()) + "; stopped the process (pid " + std::to_string(pid) +
                                "), the next round starts a fresh one");
  }

  const auto takeback_start = Clock::now();
  // The trained model may not be larger than the global one by more than its headers.
  uint64_t model_bytes = 0;
  for (const auto& t : global) model_bytes += t.ByteSize() * 2;  // float64 arrays are read too
  auto arrays = ReadNpz(out_path, model_bytes + (uint64_t{1} << 20));
  if (!arrays.ok()) return arrays.status().WithContext(what + ": its trained model");
  std::map<std::string, const NumpyArray*> by_name;
  for (const auto& a : *arrays) by_name[a.name] = &a;
  TensorSet trained;
  for (const NamedTensor& g : global) {
    auto it = by_name.find(g.name);
    if (it == by_name.end()) {
      return InvalidArgumentError(what + ": its trained model lacks tensor " + QuoteUntrusted(g.name, 64) + " (it has " +
                                  std::to_string(arrays->size()) + " arrays)");
    }
    ASSIGN_OR_RETURN(NamedTensor t, ToTensor(*it->second, out_path));
    trained.push_back(std::move(t));
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    return InvalidArgumentError(what + ": its trained model has an array the model does not: " +
                                QuoteUntrusted(by_name.begin()->first, 64));
  }
  RETURN_IF_ERROR(CheckSameLayout(global, trained, what + ": its trained model"));
  // A NaN or an infinity would become the update's delta: the round fails here, naming the
  // tensor and its first bad element, rather than at the coordinator's check of the delta.
  RETURN_IF_ERROR(CheckFinite(trained, what + ": its trained model"));
  result.model = std::move(trained);
  result.takeback_ms = MillisSince(takeback_start);
  return result;
}

}  // namespace tessera::worker
