// What the coordinator must not forget, behind one interface: jobs, round records, global
// model checkpoints, the workers it admitted, the names they are bound to, and job seats.
//
//  - SqliteStateStore (server/state/sqlite_state_store.h): the daemon's; SQLite plus checkpoint
//    files, durable before a write returns.
//  - MemoryStateStore (server/state/memory_state_store.h): in memory, for tests, with failure
//    injection per kind of write and a way to damage a checkpoint.
//
// The contract every implementation keeps (tests/server/state_store_conformance_test.cc
// runs the same suite on each):
//  - A write that returns Ok is durable (for the memory store: as long as the object lives).
//    A write that fails leaves the job, its rounds and its seats as they were. Committing a
//    round (CommitWrittenRound) is atomic: after it, either the round's record, its
//    checkpoint and the job's new row are all there, or the round is not committed (the
//    SQLite store may leave the new checkpoint's file behind; the job's rounds_committed
//    does not name it, and the next start removes it).
//  - Per job the initial model (round 0) and the newest kKeptCheckpoints rounds' checkpoints
//    are kept, so that a damaged newest checkpoint falls back to the one before it.
//  - Checkpoints hold the tensors in EncodeCheckpoint's format and are hash-checked when
//    loaded: a damaged one is DataLoss naming where it was read from.
//
// Thread-safe: every method may be called from any thread. Each one blocks for its I/O (the
// SQLite store syncs to disk before a write returns): callers do not hold their own locks
// across these calls.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "core/tensor.h"
#include "tessera/v1/job.pb.h"
#include "tessera/v1/job_service.pb.h"

namespace tessera::server {

// Checkpoints kept per job besides the initial model's.
inline constexpr uint32_t kKeptCheckpoints = 3;

// The largest checkpoint file a store reads. A job's model and its strategy's state fit in
// the coordinator's model memory (wire::kMaxModelMemoryBytes, 2 GiB, checked again when a job
// resumes), and its selection's history in a small part of the rest: a larger file was not
// written by the coordinator, and reading it could take all of the coordinator's memory.
inline constexpr uint64_t kMaxCheckpointBytes = uint64_t{3} << 30;

// The longest manifest a checkpoint's reader parses. A model's manifest reaches the workers in
// one message of at most 2 MiB, and a checkpoint's lists, besides the model's tensors, at most
// twice as many of its strategy's and one of its selection's, each entry without the SHA-256
// the workers' has: a few MiB at most. A longer one was not written by the coordinator, and
// parsing it could take many times its size in memory (an entry of a few bytes parses to an
// object of a hundred or more).
inline constexpr uint64_t kMaxCheckpointManifestBytes = uint64_t{16} << 20;

// The most seats LoadSeats reads for a job by default. A job seats one client a party, and a
// partition has at most 10,000 parties (wire::kMaxParties); with workers' own files each
// client that ever trained for the job holds a seat. A table holding more for one job was
// damaged or written by hand, and reading all of it could take the coordinator's memory.
inline constexpr size_t kMaxStoredSeats = 100000;

class StateStore {
 public:
  virtual ~StateStore() = default;

  // Jobs. InsertJob numbers the job one past the largest number stored (1 for the first), so
  // that the newest job's number is given again once it is deleted; AlreadyExists for a job
  // inserted before. NextJobNumber is the number the next insert gives, until another insert:
  // a caller that names a job after it holds its own lock from the read to the insert (as
  // Coordinator::SubmitJob does), or two jobs read the same number. UpdateJob writes
  // over the job's row (its state, rounds_committed, error, last_round) and changes nothing
  // for a job never inserted. A job's row holds its last round without the per-worker
  // reports (JobRow(): a round of 1,000 clients is about 640 KB of them, and they are in the
  // round's record), so GetJob and the lists give it so. GetJob of an unknown job is NotFound; ListJobs gives
  // every job in the order inserted, and a row that cannot be read is DataLoss naming it. A
  // row cannot be read when it does not parse, or when its key is not a job id (base/names.h)
  // or not the id of the job it holds (a hand edit): the runner makes its files' paths from
  // the id.
  //
  // When a job ended: the first write of its row in an ended state (succeeded, failed or
  // cancelled; by UpdateJob, CommitWrittenRound, UpdateRoundRecord or RewindJob) records the
  // time, by the store's clock (the system's, Unix milliseconds), beside the row; later writes
  // keep it, and a write of a state not ended forgets it. ListNewestJobs gives it
  // (JobList::ended_unix_ms), so that a job's age since its end survives a restart whatever its
  // rounds' times. A row inserted already ended has none (its end was not seen).
  virtual Status InsertJob(const v1::Job& job) = 0;
  virtual Status UpdateJob(const v1::Job& job) = 0;
  virtual Result<v1::Job> GetJob(const std::string& job_id) = 0;
  virtual Result<std::vector<v1::Job>> ListJobs() = 0;
  virtual Result<uint64_t> NextJobNumber() = 0;
  // The newest `max_jobs` jobs, the oldest of them first, and how many rows there are in all.
  // A row that cannot be read is left out and its job's id (as stored, at most 128 bytes)
  // is in `damaged`, so that one damaged row hides no other job. `ended_unix_ms` holds, by
  // job id, when each job listed that ended had its end recorded (see InsertJob); a job not
  // in it has no recorded end.
  struct JobList {
    std::vector<v1::Job> jobs;
    uint64_t total = 0;
    std::vector<std::string> damaged;
    std::map<std::string, int64_t> ended_unix_ms;
  };
  virtual Result<JobList> ListNewestJobs(size_t max_jobs) = 0;
  // Records, durably, that the job's cancel was asked for: GetJob and the lists then give the
  // job with cancel_requested set while its row says it is pending or running, whatever
  // UpdateJob writes after. A job whose row says it ended is given without it, whenever the
  // cancel was recorded: no cancel is pending on an ended job, and a cancel that ended it is
  // its state, CANCELLED. NotFound for a job never inserted.
  virtual Status RequestCancel(const std::string& job_id) = 0;
  // Deletes a job for good: its checkpoints first, then its row, round records, seats and
  // recorded cancel together, so that a delete cut short leaves a job that can be deleted
  // again, never files no row names. Whether the job may go (ended, past its retention) is the
  // caller's to decide. False for a job with no row; InvalidArgument for a name that is no
  // job id (base/names.h).
  virtual Result<bool> DeleteJob(const std::string& job_id) = 0;

  // A round's commit in two steps, so that the checkpoint's write and sync can run while the
  // round's record is still being made (its evaluation, its model's hash):
  //  - WriteCheckpoint puts the checkpoint of `round` in place, durably, without committing
  //    the round: `global_model`'s tensors, then `extra`'s (what the job keeps beside the
  //    model: its strategy's state, its selection's history), written one after the other
  //    without joining them in memory first. A job commits one round at a time: it replaces
  //    whatever was written for the job before and not committed, and while it runs, or
  //    after it failed, there is none to commit.
  //  - CommitWrittenRound commits round record.round() of job.id(): the checkpoint written for
  //    it, the record and the job's new row together (see the contract above), then drops the
  //    checkpoint that falls out of the kept ones. FailedPrecondition, naming the job and the
  //    round, when no checkpoint was written for that round.
  // A checkpoint written and never committed is no part of the job: the SQLite store removes
  // its file at the next start.
  virtual Status WriteCheckpoint(const std::string& job_id, uint32_t round, const TensorSet& global_model,
                                 const TensorSet& extra) = 0;
  Status WriteCheckpoint(const std::string& job_id, uint32_t round, const TensorSet& global_model) {
    return WriteCheckpoint(job_id, round, global_model, TensorSet());
  }
  virtual Status CommitWrittenRound(const v1::Job& job, const v1::RoundRecord& record) = 0;
  // Both steps, one after the other.
  Status CommitRound(const v1::Job& job, const v1::RoundRecord& record, const TensorSet& global_model) {
    RETURN_IF_ERROR(WriteCheckpoint(job.id(), record.round(), global_model));
    return CommitWrittenRound(job, record);
  }
  // The checkpoint of round 0: the model a job starts from.
  virtual Status SaveInitialModel(const std::string& job_id, const TensorSet& model) = 0;
  // Rewrites a committed round's record (to add the commit's own latency) and the job's row.
  virtual Status UpdateRoundRecord(const v1::Job& job, const v1::RoundRecord& record) = 0;
  // The checkpoint of `round` (round 0: the initial model); NotFound when there is none,
  // DataLoss when it is damaged, each naming where it was read from.
  virtual Result<TensorSet> LoadCheckpoint(const std::string& job_id, uint32_t round) = 0;
  // Moves a job back to job.rounds_committed() (its newer checkpoints were damaged): the
  // job's row, and the records of the later rounds deleted, together.
  virtual Status RewindJob(const v1::Job& job) = 0;
  // The job's round records from `from_round` on, in round order. With `max_bytes`, it stops
  // after the first record that takes their serialized bytes past it, so that a caller
  // answering in pages parses no more than a page and one record, and knows where the next
  // page starts.
  virtual Result<std::vector<v1::RoundRecord>> ListRounds(const std::string& job_id, uint32_t from_round = 0,
                                                          size_t max_bytes = SIZE_MAX) = 0;

  // Workers the coordinator has admitted, so that `tessera workers` knows them after a
  // restart (as not alive until they rejoin); LoadWorkers is sorted by worker id.
  virtual Status SaveWorker(const v1::WorkerStatus& worker) = 0;
  virtual Result<std::vector<v1::WorkerStatus>> LoadWorkers() = 0;

  // The credential a worker's name is bound to: the first call for `name` records
  // `credential`; every call returns the credential the name is bound to (compare it with
  // yours). Atomic: two first joins under one name bind one credential.
  virtual Result<std::string> BindWorkerName(const std::string& name, const std::string& credential) = 0;
  // Forgets a worker gone for good: its row (SaveWorker's, keyed by its id, which is its
  // name) and its name's binding, together, so that LoadWorkers no longer gives it and the
  // next BindWorkerName of the name binds whatever credential it is given. Returns whether
  // there was either to forget. Its seats stay: a seat belongs to the job.
  virtual Result<bool> ForgetWorker(const std::string& name) = 0;

  // Job seats: which party of the partition each client trains for a job, stable across
  // restarts. LoadSeats is sorted by party, then by seat, and reads at most `max_seats` + 1
  // rows: a job holding more than `max_seats` is DataLoss naming it and the bound, not a
  // shorter list, and a row whose party is not a number from 0 to 2^32 - 1 is DataLoss
  // naming the job and the seat. The store keeps what it is given and gives it back as
  // stored (a seat's name, its party): whether the seats fit the job is the job's to check
  // (SeatTable::Load, server/selection/selection.h).
  virtual Status SaveSeat(const std::string& job_id, const std::string& worker_id, uint32_t party) = 0;
  virtual Result<std::vector<std::pair<std::string, uint32_t>>> LoadSeats(const std::string& job_id,
                                                                          size_t max_seats = kMaxStoredSeats) = 0;

  // The newest checkpoint of `job_id` that loads, trying `round`, the kept rounds before it,
  // then the initial model. Each one that does not load (missing, damaged) is appended to
  // *damaged, its message naming where it was read from. DataLoss when none loads. Built on
  // LoadCheckpoint, the same for every store.
  struct Checkpoint {
    uint32_t round = 0;
    TensorSet tensors;
  };
  Result<Checkpoint> LoadNewestCheckpoint(const std::string& job_id, uint32_t round, std::vector<Status>* damaged);
};

// What CommitWrittenRound gives, in every store, when no checkpoint was written for the round.
Status NoWrittenCheckpointError(const std::string& job_id, uint32_t round);

// What LoadSeats gives, in every store, when the job holds more than `max_seats` seats.
Status TooManySeatsError(const std::string& job_id, size_t max_seats);

// The job as its row holds it: the last round's record without its per-worker reports.
v1::Job JobRow(const v1::Job& job);

// The job as every store gives it back from its row (`row`) and whether a cancel is recorded
// for it: cancel_requested set only while the row says it is pending or running.
v1::Job WithRecordedCancel(v1::Job row, bool cancel_recorded);

// Now by the stores' clock, for the end they record: the system's, in Unix milliseconds.
int64_t StoreUnixMillis();

// Checkpoint format: "TSRCKPT1", then a length-prefixed v1::TensorManifest, then the raw
// float32 bytes of each tensor in manifest order. Each tensor's checksum is verified on load:
// its XXH3-128 (xxh3_128; what EncodeCheckpoint writes), or its SHA-256 in files written
// before; `source` names where the bytes came from in errors.
// With `extra`: the checkpoint of `tensors` followed by `extra`'s tensors, as if they were one set.
std::string EncodeCheckpoint(const TensorSet& tensors, const TensorSet& extra = {});
// The same bytes as pieces to write one after another, without copying the tensors: `header`
// (filled here: the magic, the manifest's length and the manifest), then each tensor's
// values, which must outlive the pieces.
std::vector<std::string_view> CheckpointPieces(const TensorSet& tensors, const TensorSet& extra, std::string* header);
Result<TensorSet> DecodeCheckpoint(const std::string& bytes, const std::string& source);

}  // namespace tessera::server
