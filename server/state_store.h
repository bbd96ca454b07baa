// The coordinator's durable state: jobs, round records, workers and job seats in SQLite
// (WAL mode) under the state directory, and global-model checkpoints as files beside it,
// each written atomically (temporary file, fsync, rename) before the database row that
// names it. A round counts as committed when its row is in the database; a checkpoint file
// without a row is ignored on restart, and removed by RemoveLeftoverCheckpoints.
//
// Per job the initial model (round 0) and the newest kKeptCheckpoints rounds' checkpoints are
// kept, so that a damaged newest checkpoint falls back to the one before it.
//
// Thread-safe: every method takes an internal mutex (one SQLite connection).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/tensor.h"
#include "tessera/v1/job.pb.h"
#include "tessera/v1/job_service.pb.h"

namespace tessera::server {

// Checkpoints kept per job besides the initial model's.
inline constexpr uint32_t kKeptCheckpoints = 3;

class StateStore {
 public:
  // Opens (creating if needed) `state_dir`/coordinator.db and `state_dir`/checkpoints/.
  static Result<std::unique_ptr<StateStore>> Open(const std::string& state_dir);
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  const std::string& state_dir() const { return state_dir_; }

  Status InsertJob(const v1::Job& job);
  Status UpdateJob(const v1::Job& job);  // state, rounds_committed, error, last_round
  Result<v1::Job> GetJob(const std::string& job_id);
  Result<std::vector<v1::Job>> ListJobs();
  Result<uint64_t> NextJobNumber();

  // Writes the checkpoint of `round` for `job_id` atomically, then, in one transaction,
  // the round record and the job's new state. Either both are durable or the round is not
  // committed.
  Status CommitRound(const v1::Job& job, const v1::RoundRecord& record, const TensorSet& global_model);
  // The global model after `round` rounds (round 0: the initial model).
  Status SaveInitialModel(const std::string& job_id, const TensorSet& model);
  // Rewrites a committed round's record (to add the commit's own latency) and the job row.
  Status UpdateRoundRecord(const v1::Job& job, const v1::RoundRecord& record);
  Result<TensorSet> LoadCheckpoint(const std::string& job_id, uint32_t round);
  // The newest checkpoint of `job_id` that loads, trying `round`, the kept rounds before it,
  // then the initial model. Each one that does not load (missing, damaged) is appended to
  // *damaged, its message naming the file. DataLoss when none loads.
  struct Checkpoint {
    uint32_t round = 0;
    TensorSet tensors;
  };
  Result<Checkpoint> LoadNewestCheckpoint(const std::string& job_id, uint32_t round, std::vector<Status>* damaged);
  // Moves a job back to job.rounds_committed() (its newer checkpoints were damaged): the
  // job's row, and the records of the later rounds deleted, in one transaction.
  Status RewindJob(const v1::Job& job);
  // Removes what an interrupted coordinator may have left in the checkpoint directory:
  // temporary files, checkpoints of rounds never committed and checkpoints older than the
  // kept ones. Files of jobs the database does not know are left alone. Returns the paths
  // removed.
  Result<std::vector<std::string>> RemoveLeftoverCheckpoints();

  // Failure injection (tests): the next `count` writes of job rows (InsertJob, UpdateJob,
  // CommitRound, RewindJob) fail with `status` without touching the database.
  void InjectJobWriteFailures(int count, Status status);
  Result<std::vector<v1::RoundRecord>> ListRounds(const std::string& job_id, uint32_t from_round = 0);

  // Workers the coordinator has admitted, so that `tessera workers` knows them after a
  // restart (as not alive until they rejoin).
  Status SaveWorker(const v1::WorkerStatus& worker);
  Result<std::vector<v1::WorkerStatus>> LoadWorkers();

  // The credential a worker's name is bound to: the first call for `name` records
  // `credential`; every call returns the credential the name is bound to (compare it with
  // yours). Atomic: two first joins under one name bind one credential.
  Result<std::string> BindWorkerName(const std::string& name, const std::string& credential);

  // Job seats: which party of the partition each worker trains for a job. Stable across
  // coordinator restarts.
  Status SaveSeat(const std::string& job_id, const std::string& worker_id, uint32_t party);
  Result<std::vector<std::pair<std::string, uint32_t>>> LoadSeats(const std::string& job_id);

 private:
  StateStore(std::string state_dir, sqlite3* db);
  Status Exec(const std::string& sql);
  // Runs `body` in one IMMEDIATE transaction: committed when it returns Ok, rolled back
  // otherwise (mu_ held).
  Status InTransactionLocked(const std::function<Status()>& body);
  // Writes `job` over its row (mu_ held).
  Status UpdateJobRowLocked(const v1::Job& job);
  std::string CheckpointPath(const std::string& job_id, uint32_t round) const;

  // The injected failure for the next job write, if any (mu_ held).
  Status TakeInjectedFailure();

  std::string state_dir_;
  std::mutex mu_;
  sqlite3* db_;
  int injected_failures_ = 0;  // guarded by mu_
  Status injected_status_;     // guarded by mu_
};

// Writes `bytes` to `path` atomically: a temporary file beside it, fsync, rename, fsync of
// the directory. A full disk gives ResourceExhausted naming the path, and the old file stays.
Status WriteFileAtomically(const std::string& path, const std::string& bytes);

// Checkpoint file format: "TSRCKPT1", then a length-prefixed v1::TensorManifest, then the raw
// float32 bytes of each tensor in manifest order. Hashes are verified on load.
std::string EncodeCheckpoint(const TensorSet& tensors);
Result<TensorSet> DecodeCheckpoint(const std::string& bytes, const std::string& source);

}  // namespace tessera::server
