// The coordinator's state (server/state/state_store.h) held in memory, for tests: the round driver,
// selection and the services run against it without a disk, and a test makes any kind of
// write fail, or stops one mid-way, to see what the caller does. It keeps the interface's
// contract (the conformance suite runs on it): checkpoints are stored encoded and
// hash-checked when loaded, the same ones are kept, a failed write changes nothing.
//
// "Durable" means for the object's life: a test that restarts the coordinator's side hands
// the same store to the next runner.
//
// Thread-safe. No method blocks, except on a write hook a test installed.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/state/state_store.h"

namespace tessera::server {

// The kinds of write, one per writing method of StateStore.
enum class StateWrite {
  kInsertJob,
  kUpdateJob,
  kWriteCheckpoint,
  kCommitRound,
  kSaveInitialModel,
  kUpdateRoundRecord,
  kRewindJob,
  kSaveWorker,
  kBindWorkerName,
  kSaveSeat,
  kRequestCancel,
  kForgetWorker,
  kDeleteJob,
};
inline constexpr size_t kStateWriteKinds = 13;
std::string_view StateWriteName(StateWrite kind);  // "CommitRound"

class MemoryStateStore final : public StateStore {
 public:
  MemoryStateStore() = default;

  Status InsertJob(const v1::Job& job) override;
  Status UpdateJob(const v1::Job& job) override;
  Result<v1::Job> GetJob(const std::string& job_id) override;
  Result<std::vector<v1::Job>> ListJobs() override;
  Result<uint64_t> NextJobNumber() override;
  Result<JobList> ListNewestJobs(size_t max_jobs) override;
  Status RequestCancel(const std::string& job_id) override;
  // The kDeleteJob write.
  Result<bool> DeleteJob(const std::string& job_id) override;
  using StateStore::WriteCheckpoint;
  Status WriteCheckpoint(const std::string& job_id, uint32_t round, const TensorSet& global_model,
                         const TensorSet& extra) override;
  // The kCommitRound write.
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

  // Failure injection: the next `count` writes of `kind` fail with `why` and change nothing
  // (replacing what was injected for that kind before; count 0 clears it).
  void FailNextWrites(StateWrite kind, int count, Status why);
  // Calls `hook` at the start of every write of `kind`, before an injected failure is taken,
  // on the writing thread and without the store's lock: a test can hold a write there (a
  // commit under way when the runner stops). An empty hook removes it.
  void SetWriteHook(StateWrite kind, std::function<void()> hook);
  // Writes of `kind` attempted so far, the failed ones included.
  int writes(StateWrite kind) const;

  // Whether the checkpoint of `round` is kept.
  bool HasCheckpoint(const std::string& job_id, uint32_t round) const;
  // Makes the job's row unreadable, as a damaged row of the SQLite store: ListJobs and GetJob
  // then fail with DataLoss naming it, ListNewestJobs leaves it out; false for an unknown job.
  bool DamageJobRow(const std::string& job_id);
  // Flips a byte of a kept checkpoint's tensors, so that loading it fails its hash check
  // (DataLoss); false when there is no such checkpoint or it holds no tensor bytes.
  bool DamageCheckpoint(const std::string& job_id, uint32_t round);

 private:
  struct Injected {
    int count = 0;
    Status why;
    std::function<void()> hook;
    int writes = 0;
  };
  using RoundKey = std::pair<std::string, uint32_t>;  // job id, round

  // Counts the write, runs its hook, and takes an injected failure if one is due.
  Status BeginWrite(StateWrite kind);
  static std::string CheckpointName(const std::string& job_id, uint32_t round);
  // One past the largest number of a job stored, as the SQLite store numbers jobs.
  uint64_t NextNumberLocked() const;
  // The job as read: its row, with cancel_requested from the cancels recorded.
  v1::Job ReadRowLocked(const std::string& job_id, const v1::Job& row) const;
  // Writes the row of a job stored (false for another), and records its end at its first
  // write ended (StateStore::InsertJob).
  bool WriteRowLocked(const v1::Job& job);

  mutable std::mutex mu_;  // guards everything below; never held while running a hook
  std::array<Injected, kStateWriteKinds> injected_;
  std::map<std::string, std::pair<uint64_t, v1::Job>> jobs_;  // id -> (number, job row)
  std::set<std::string> damaged_jobs_;                          // rows DamageJobRow made unreadable
  std::set<std::string> cancels_;                               // jobs whose cancel was asked for
  std::map<std::string, int64_t> ended_;                        // id -> when its end was first written
  std::map<RoundKey, v1::RoundRecord> rounds_;
  std::map<RoundKey, std::string> checkpoints_;  // EncodeCheckpoint's bytes
  std::map<RoundKey, std::string> written_;      // written, not yet committed (one a job)
  std::map<std::string, v1::WorkerStatus> workers_;
  std::map<std::string, std::string> worker_names_;  // name -> credential
  std::map<std::string, std::map<std::string, uint32_t>> seats_;  // job id -> worker -> party
};

}  // namespace tessera::server
