// An external trainer: a user's own training code (PyTorch, JAX, anything) run by the worker
// as a child process, which takes part in rounds through the worker. The worker still joins,
// downloads, uploads and reports; for each round it hands the global model and its share of
// the data to the process and takes the trained model back.
//
// The channel (docs/JOBS.md, "External trainers"; the Python side is python/tessera_client):
//   - The process inherits two pipes as file descriptors 3 (requests, read by it) and 4
//     (replies, written by it), named in TESSERA_TRAINER_FDS=3,4. Its standard output goes to
//     the worker's standard error, so that its prints never corrupt the channel.
//   - Each request is one line of JSON: {"type": "train", "round": R, "party": P,
//     "model": "DIR/model-R-A.npz", "data": "DIR/share-NAME-K.npz", "out": "DIR/update-R-A.npz",
//     "epochs": E, "batch_size": B, "learning_rate": .., "momentum": .., "weight_decay": ..,
//     "seed": S, "job": "ID", "attempt": A}. The model archive holds the global model's
//     tensors by name (PyTorch state_dict keys for the built-in models); the data archive
//     holds this worker's share: "x" (float32, N x C x H x W, normalised as native training
//     sees it) and "y" (int64 labels). The data archive is written again, under a new K, only
//     when the share changes (another job or party): a process may keep the arrays it read by
//     the archive's name.
//   - The process trains, writes the new model (every tensor, same names and shapes) to
//     "out" (or to "out" + kTrainerTemporarySuffix, renamed to "out" once whole), and replies with one line: {"type": "update", "samples": N, "loss": L}; or
//     {"type": "error", "message": "..."} when it cannot train.
//   - One reply per request: a line written when no round is asked of the process fails the
//     next round and stops the process (the round after starts a fresh one).
//   - The worker closes fd 3 when it no longer needs the process; it should then exit.
//   - The process runs in a process group of its own: when the worker stops it (a closed
//     channel and a grace period, or a kill mid-round), the whole group is killed, so that
//     what it started (a shell script's commands, data loader workers) does not outlive it.
// A process that crashes, hangs past the round's deadline, or replies a line that is not a
// reply (not JSON, another type, a field out of range) fails that round for this worker with a
// message that says which, and is stopped: what it writes next could be taken for the next
// round's reply. The next round starts a fresh process. A reply in step whose trained model
// does not match (a tensor missing, another shape) or holds a value that is not finite (NaN,
// an infinity: the error names the tensor and its first such element) fails the round and
// keeps the process.
//
// Thread safety: one thread at a time (the worker's task thread).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/data/dataset.h"
#include "core/tensor.h"

namespace tessera::worker {

// Where a process may write its trained model before renaming it to "out" (tessera_client
// does): the worker removes it with the round's other files, however the round ended.
inline constexpr char kTrainerTemporarySuffix[] = ".tmp.npz";

struct ExternalTrainerRequest {
  std::string job_id;
  uint32_t round = 0, attempt = 0, party = 0;
  uint32_t epochs = 1, batch_size = 64;
  double learning_rate = 0.01, momentum = 0, weight_decay = 0;
  uint64_t seed = 0;
};

struct ExternalTrainerResult {
  TensorSet model;       // the trained model, checked against the global model's layout, all finite
  uint64_t samples = 0;  // as the trainer reported it, at most the share's size
  double loss = 0;
  double handover_ms = 0;  // writing the model and the share for the process
  double train_ms = 0;     // from the request to the reply
  double takeback_ms = 0;  // reading and checking the trained model
};

// Parses --trainer NAME=COMMAND: the command is split on spaces (no shell), its first word
// an executable path (or a name looked up in PATH).
struct TrainerCommand {
  std::string name;
  std::vector<std::string> argv;
};
Result<TrainerCommand> ParseTrainerFlag(const std::string& value);
// Whether the command's program can be started: a path (with a '/') to an executable file, or
// a name found as one in a directory of `path` (PATH's form; empty entries are the working
// directory), as posix_spawnp looks it up. The error names the trainer and the program.
Status CheckTrainerProgram(const TrainerCommand& command, const std::string& path);

// The round's deadline for the process on this worker's steady clock: `deadline_unix_ms` on
// the coordinator's clock (0 or less: none, and a day is allowed) against `now_unix_ms`, this
// worker's. In int64 milliseconds, and at most 2^40 ms away: a deadline from any coordinator
// (INT64_MAX included) is a time far off, never one wrapped into the past.
std::chrono::steady_clock::time_point TrainerDeadline(int64_t deadline_unix_ms, int64_t now_unix_ms);

class ExternalTrainer {
 public:
  // `work_dir`: a private directory (0700) for the archives it hands over; it must exist.
  ExternalTrainer(TrainerCommand command, std::string work_dir);
  ~ExternalTrainer();  // closes the channel, waits up to 5 s for the process, then kills it
  ExternalTrainer(const ExternalTrainer&) = delete;
  ExternalTrainer& operator=(const ExternalTrainer&) = delete;

  const std::string& name() const { return command_.name; }

  // One round: hands `global` and `share` (written once per distinct `share_key`) to the
  // process (started if none runs), waits for its reply until `deadline` or `should_stop`,
  // and reads the trained model back. Errors name the trainer and the round: a process that
  // could not start or exited (FailedPrecondition), replied late (DeadlineExceeded; it is
  // killed), replied malformed (InvalidArgument; a malformed reply line stops it), or was
  // stopped (Cancelled). Each but the last is a failure the worker reports for the round.
  Result<ExternalTrainerResult> Train(const ExternalTrainerRequest& request, const TensorSet& global,
                                      const Dataset& share, const std::string& share_key,
                                      std::chrono::steady_clock::time_point deadline,
                                      const std::function<bool()>& should_stop);

  pid_t pid() const { return pid_; }  // 0 when no process runs

 private:
  Status Start();
  // Ends the process: closes its request pipe, waits up to `grace` for it to exit, then
  // SIGKILLs its process group (whatever of it is left).
  void StopProcess(std::chrono::milliseconds grace);
  // Reads one reply line; `waiting` names what is awaited in errors.
  Result<std::string> ReadLine(std::chrono::steady_clock::time_point deadline, const std::function<bool()>& should_stop,
                               const std::string& waiting);
  // Before a request: a process that has written to its reply channel since its last reply
  // (a second reply to one round, a reply before any request) is out of step, and each later
  // round would read the reply before its own: InvalidArgument quoting what it wrote, and the
  // process is stopped. What it wrote is read without waiting; an end of the channel is left
  // for the request's write to find.
  Status CheckNoReplyUnasked(const std::string& what);
  // What became of a process that has gone: "exited with status 3", "killed by signal 9".
  std::string ExitDescription();

  TrainerCommand command_;
  std::string work_dir_;
  pid_t pid_ = 0;
  int request_fd_ = -1;  // the worker's end of fd 3
  int reply_fd_ = -1;    // the worker's end of fd 4
  std::string pending_;  // bytes read past the last line
  std::string share_written_;  // the share_key of share_path_
  std::string share_path_;     // DIR/share-NAME-K.npz; empty before the first share
  uint64_t shares_written_ = 0;  // K of the last share written
};

}  // namespace tessera::worker
