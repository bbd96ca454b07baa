// The coordinator's durable state (server/state/state_store.h) in SQLite (WAL mode, synchronous
// FULL) under the state directory, and global-model checkpoints as files beside it, each
// written atomically (temporary file, fsync, rename) before the database row that names it.
// A round counts as committed when its row is in the database; a checkpoint file without a
// row is ignored on restart, and removed by RemoveLeftoverCheckpoints.
//
// Thread-safe, on two connections to the database, each behind a lock of its own:
//  - Writes go through one read-write connection under write_mu_, one at a time, each
//    returning once its commit is synced. A write that reads in order to decide what to
//    write (BindWorkerName, RequestCancel) reads on this connection, inside its transaction.
//  - Reads go through a second, read-only connection under read_mu_. In WAL mode a reader
//    sees the last committed state and neither waits for a write (its commit's fsync
//    included) nor holds one up; a read that starts after a write returned sees that write.
//    A read of more than one statement (ListNewestJobs) is one read transaction.
// A checkpoint file is written before either lock is taken, so its fsync holds up no other
// call either.
#pragma once

#include <sqlite3.h>

#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/state/state_files.h"
#include "server/state/state_store.h"

namespace tessera::server {

class SqliteStateStore final : public StateStore {
 public:
  // Opens (creating if needed) `state_dir`/coordinator.db and `state_dir`/checkpoints/: the
  // database read-write, switched to WAL mode (an error naming the file when it cannot be),
  // then again read-only for the reads. Either open failing is an error naming the file.
  static Result<std::unique_ptr<SqliteStateStore>> Open(const std::string& state_dir);
  ~SqliteStateStore() override;
  SqliteStateStore(const SqliteStateStore&) = delete;
  SqliteStateStore& operator=(const SqliteStateStore&) = delete;

  const std::string& state_dir() const { return state_dir_; }

  // The job takes one past the largest number stored: a largest that has none after it
  // (INT64_MAX, or a value that is no integer, edited in by hand) is DataLoss naming the
  // database file and the column, from NextJobNumber too. A value longer than the
  // connection's length limit is refused naming the statement and the parameter, by every
  // write.
  Status InsertJob(const v1::Job& job) override;
  Status UpdateJob(const v1::Job& job) override;
  Result<v1::Job> GetJob(const std::string& job_id) override;
  Result<std::vector<v1::Job>> ListJobs() override;
  Result<uint64_t> NextJobNumber() override;
  Result<JobList> ListNewestJobs(size_t max_jobs) override;
  Status RequestCancel(const std::string& job_id) override;
  // Its checkpoint files (those of every round, and temporary ones), the directory synced,
  // then its rows (sqlite_job_deletion.cc).
  Result<bool> DeleteJob(const std::string& job_id) override;
  // The checkpoint file, atomically and without the database's lock; then, in
  // CommitWrittenRound, the record and the job's row in one transaction.
  using StateStore::WriteCheckpoint;
  Status WriteCheckpoint(const std::string& job_id, uint32_t round, const TensorSet& global_model,
                         const TensorSet& extra) override;
  Status CommitWrittenRound(const v1::Job& job, const v1::RoundRecord& record) override;
  Status SaveInitialModel(const std::string& job_id, const TensorSet& model) override;
  Status UpdateRoundRecord(const v1::Job& job, const v1::RoundRecord& record) override;
  Result<TensorSet> LoadCheckpoint(const std::string& job_id, uint32_t round) override;
  Status RewindJob(const v1::Job& job) override;
  Result<std::vector<v1::RoundRecord>> ListRounds(const std::string& job_id, uint32_t from_round = 0,
                                                  size_t max_bytes = SIZE_MAX) override;
  Status SaveWorker(const v1::WorkerStatus& worker) override;
  Result<std::vector<v1::WorkerStatus>> LoadWorkers() override;
  Result<std::string> BindWorkerName(const std::string& name, const std::string& credential) override;
  Result<bool> ForgetWorker(const std::string& name) override;
  Status SaveSeat(const std::string& job_id, const std::string& worker_id, uint32_t party) override;
  Result<std::vector<std::pair<std::string, uint32_t>>> LoadSeats(const std::string& job_id,
                                                                  size_t max_seats = kMaxStoredSeats) override;

  // Removes what an interrupted coordinator may have left in the checkpoint directory:
  // temporary files, checkpoints of rounds never committed and checkpoints older than the
  // kept ones. Files of jobs the database does not know are left alone. Returns the paths
  // removed. Call it before any job runs.
  Result<std::vector<std::string>> RemoveLeftoverCheckpoints();

  // Where the checkpoint of `round` of `job_id` is kept.
  std::string CheckpointPath(const std::string& job_id, uint32_t round) const;
  // A file name of the checkpoint directory read back: CheckpointPath's "JOB-round-R.ckpt"
  // (JOB before the last "-round-", R of 1 to 9 digits), or a write of one left unfinished
  // ("...ckpt.tmp", `temporary`); nullopt for any other name.
  struct CheckpointFileName {
    std::string job_id;
    uint32_t round = 0;
    bool temporary = false;
  };
  static std::optional<CheckpointFileName> ParseCheckpointFileName(const std::string& name);

 private:
  SqliteStateStore(std::string state_dir, sqlite3* writer);
  // Adds the jobs table's ended_unix_ms to a database made before it, each ended job's end
  // taken as now.
  Status AddJobEndColumn();
  // Opens the read-only connection to `db_path`, once the writer has made its tables.
  Status OpenReader(const std::string& db_path);
  // Runs `body` in one IMMEDIATE transaction on the writer: committed when it returns Ok,
  // rolled back otherwise (write_mu_ held). An error, the transaction's own (a lock held
  // elsewhere, a full disk) or the body's, is given in the context of `what`, which names
  // the job or worker written.
  Status InTransactionLocked(const std::string& what, const std::function<Status()>& body);
  // Runs `body` in one read transaction on the reader, so that its statements all see the
  // same committed state (read_mu_ held).
  Status InReadTransactionLocked(const std::function<Status()>& body);
  // Writes `job` over its row (write_mu_ held).
  Status UpdateJobRowLocked(const v1::Job& job);

  const std::string state_dir_;
  // Lock order: write_mu_ is never taken while read_mu_ is held, nor the other way round;
  // no method holds both.
  std::mutex write_mu_;
  sqlite3* writer_;  // guarded by write_mu_; read-write
  // Checkpoints written and not yet committed, as (job id, round), at most one a job;
  // guarded by write_mu_.
  std::set<std::pair<std::string, uint32_t>> written_;
  std::mutex read_mu_;
  sqlite3* reader_ = nullptr;  // guarded by read_mu_; read-only
};

}  // namespace tessera::server
