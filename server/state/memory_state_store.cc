#include "server/state/memory_state_store.h"

#include <algorithm>

#include "base/names.h"
#include "proto/job_mapping.h"

namespace tessera::server {

std::string_view StateWriteName(StateWrite kind) {
  switch (kind) {
    case StateWrite::kInsertJob: return "InsertJob";
    case StateWrite::kUpdateJob: return "UpdateJob";
    case StateWrite::kWriteCheckpoint: return "WriteCheckpoint";
    case StateWrite::kCommitRound: return "CommitRound";
    case StateWrite::kSaveInitialModel: return "SaveInitialModel";
    case StateWrite::kUpdateRoundRecord: return "UpdateRoundRecord";
    case StateWrite::kRewindJob: return "RewindJob";
    case StateWrite::kSaveWorker: return "SaveWorker";
    case StateWrite::kBindWorkerName: return "BindWorkerName";
    case StateWrite::kSaveSeat: return "SaveSeat";
    case StateWrite::kRequestCancel: return "RequestCancel";
    case StateWrite::kForgetWorker: return "ForgetWorker";
    case StateWrite::kDeleteJob: return "DeleteJob";
  }
  return "unknown write";
}

void MemoryStateStore::FailNextWrites(StateWrite kind, int count, Status why) {
  std::lock_guard<std::mutex> lock(mu_);
  Injected& injected = injected_[static_cast<size_t>(kind)];
  injected.count = count;
  injected.why = std::move(why);
}

void MemoryStateStore::SetWriteHook(StateWrite kind, std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  injected_[static_cast<size_t>(kind)].hook = std::move(hook);
}

int MemoryStateStore::writes(StateWrite kind) const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_[static_cast<size_t>(kind)].writes;
}

Status MemoryStateStore::BeginWrite(StateWrite kind) {
  std::function<void()> hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Injected& injected = injected_[static_cast<size_t>(kind)];
    ++injected.writes;
    hook = injected.hook;
  }
  if (hook) hook();
  std::lock_guard<std::mutex> lock(mu_);
  Injected& injected = injected_[static_cast<size_t>(kind)];
  if (injected.count <= 0) return Status::Ok();
  --injected.count;
  return injected.why;
}

std::string MemoryStateStore::CheckpointName(const std::string& job_id, uint32_t round) {
  return "memory checkpoint of job " + job_id + " round " + std::to_string(round);
}

Status MemoryStateStore::InsertJob(const v1::Job& job) {
  RETURN_IF_ERROR(BeginWrite(StateWrite::kInsertJob));
  std::lock_guard<std::mutex> lock(mu_);
  if (jobs_.count(job.id())) return AlreadyExistsError("insert job '" + job.id() + "': the job exists already");
  jobs_[job.id()] = {NextNumberLocked(), JobRow(job)};
  return Status::Ok();
}

Status MemoryStateStore::UpdateJob(const v1::Job& job) {
  RETURN_IF_ERROR(BeginWrite(StateWrite::kUpdateJob));
  std::lock_guard<std::mutex> lock(mu_);
  if (WriteRowLocked(job)) damaged_jobs_.erase(job.id());
  return Status::Ok();
}

bool MemoryStateStore::WriteRowLocked(const v1::Job& job) {
  auto it = jobs_.find(job.id());
  if (it == jobs_.end()) return false;
  it->second.second = JobRow(job);
  if (!wire::JobEnded(job.state())) {
    ended_.erase(job.id());
  } else if (!ended_.count(job.id())) {
    ended_[job.id()] = StoreUnixMillis();  // its first write ended: the end's time
  }
  return true;
}

v1::Job MemoryStateStore::ReadRowLocked(const std::string& job_id, const v1::Job& row) const {
  return WithRecordedCancel(row, cancels_.count(job_id) > 0);
}

Result<v1::Job> MemoryStateStore::GetJob(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NotFoundError("no job '" + job_id + "'");
  if (damaged_jobs_.count(job_id)) return DataLossError("jobs: job '" + job_id + "': corrupt row");
  return ReadRowLocked(job_id, it->second.second);
}

Result<std::vector<v1::Job>> MemoryStateStore::ListJobs() {
  ASSIGN_OR_RETURN(JobList list, ListNewestJobs(SIZE_MAX));
  if (!list.damaged.empty()) return DataLossError("jobs: job '" + list.damaged.front() + "': corrupt row");
  return std::move(list.jobs);
}

Result<StateStore::JobList> MemoryStateStore::ListNewestJobs(size_t max_jobs) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uint64_t, std::string>> numbered;
  for (const auto& [id, entry] : jobs_) numbered.emplace_back(entry.first, id);
  std::sort(numbered.begin(), numbered.end());
  JobList list;
  list.total = numbered.size();
  const size_t skip = numbered.size() > max_jobs ? numbered.size() - max_jobs : 0;
  for (size_t i = skip; i < numbered.size(); ++i) {
    const std::string& id = numbered[i].second;
    if (damaged_jobs_.count(id)) {
      list.damaged.push_back(id);
      continue;
    }
    list.jobs.push_back(ReadRowLocked(id, jobs_.at(id).second));
    if (auto ended = ended_.find(id); ended != ended_.end()) list.ended_unix_ms[id] = ended->second;
  }
  return list;
}

Status MemoryStateStore::RequestCancel(const std::string& job_id) {
  RETURN_IF_ERROR(BeginWrite(StateWrite::kRequestCancel));
  std::lock_guard<std::mutex> lock(mu_);
  if (!jobs_.count(job_id)) return NotFoundError("no job '" + job_id + "'");
  cancels_.insert(job_id);
  return Status::Ok();
}

bool MemoryStateStore::DamageJobRow(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!jobs_.count(job_id)) return false;
  damaged_jobs_.insert(job_id);
  return true;
}

uint64_t MemoryStateStore::NextNumberLocked() const {
  uint64_t largest = 0;
  for (const auto& [id, entry] : jobs_) largest = std::max(largest, entry.first);
  return largest + 1;
}

Result<uint64_t> MemoryStateStore::NextJobNumber() {
  std::lock_guard<std::mutex> lock(mu_);
  return NextNumberLocked();
}

Status MemoryStateStore::WriteCheckpoint(const std::string& job_id, uint32_t round, const TensorSet& global_model,
                                         const TensorSet& extra) {
  {
    // As the SQLite store: at most one written checkpoint a job, the latest.
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(written_, [&](const auto& entry) { return entry.first.first == job_id; });
  }
  RETURN_IF_ERROR(BeginWrite(StateWrite::kWriteCheckpoint));
  std::string checkpoint = EncodeCheckpoint(global_model, extra);
  std::lock_guard<std::mutex> lock(mu_);
  written_[{job_id, round}] = std::move(checkpoint);
  return Status::Ok();
}

Status MemoryStateStore::CommitWrittenRound(const v1::Job& job, const v1::RoundRecord& record) {
  RETURN_IF_ERROR(BeginWrite(StateWrite::kCommitRound));
  std::lock_guard<std::mutex> lock(mu_);
  auto written = written_.find({job.id(), record.round()});
  if (written == written_.end()) {
    return NoWrittenCheckpointError(job.id(), record.round());
  }
  checkpoints_[{job.id(), record.round()}] = std::move(written->second);
  written_.erase(written);
  rounds_[{job.id(), record.round()}] = record;
  WriteRowLocked(job);
  if (record.round() > kKeptCheckpoints) checkpoints_.erase({job.id(), record.round() - kKeptCheckpoints});
  return Status::Ok();
}

Status MemoryStateStore::SaveInitialModel(const std::string& job_id, const TensorSet& model) {
  RETURN_IF_ERROR(BeginWrite(StateWrite::kSaveInitialModel));
  std::string checkpoint = EncodeCheckpoint(model);
  std::lock_guard<std::mutex> lock(mu_);
  checkpoints_[{job_id, 0}] = std::move(checkpoint);
  return Status::Ok();
}

Status MemoryStateStore::UpdateRoundRecord(const v1::Job& job, const v1::RoundRecord& record) {
  RETURN_IF_ERROR(BeginWrite(StateWrite::kUpdateRoundRecord));
  std::lock_guard<std::mutex> lock(mu_);
  auto round = rounds_.find({job.id(), record.round()});
  if (round != rounds_.end()) round->second = record;
  WriteRowLocked(job);
  return Status::Ok();
}

Result<TensorSet> MemoryStateStore::LoadCheckpoint(const std::string& job_id, uint32_t round) {
  std::string bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = checkpoints_.find({job_id, round});
    if (it == checkpoints_.end()) return NotFoundError(CheckpointName(job_id, round) + " is missing");
    bytes = it->second;
  }
  return DecodeCheckpoint(bytes, CheckpointName(job_id, round));
}

Status MemoryStateStore::RewindJob(const v1::Job& job) {
  RETURN_IF_ERROR(BeginWrite(StateWrite::kRewindJob));
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(rounds_, [&](const auto& entry) {
    return entry.first.first == job.id() && entry.first.second > job.rounds_committed();
  });
  WriteRowLocked(job);
  return Status::Ok();
}

Result<std::vector<v1::RoundRecord>> MemoryStateStore::ListRounds(const std::string& job_id, uint32_t from_round,
                                                                   size_t max_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::RoundRecord> rounds;
  size_t bytes = 0;
  for (auto it = rounds_.lower_bound({job_id, from_round});
       bytes <= max_bytes && it != rounds_.end() && it->first.first == job_id; ++it) {
    bytes += it->second.ByteSizeLong();
    rounds.push_back(it->second);
  }
  return rounds;
}

Status MemoryStateStore::SaveWorker(const v1::WorkerStatus& worker) {
  RETURN_IF_ERROR(BeginWrite(StateWrite::kSaveWorker));
  std::lock_guard<std::mutex> lock(mu_);
  workers_[worker.worker_id()] = worker;
  return Status::Ok();
}

Result<std::vector<v1::WorkerStatus>> MemoryStateStore::LoadWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::WorkerStatus> workers;
  for (const auto& [id, worker] : workers_) workers.push_back(worker);
  return workers;
}

Result<std::string> MemoryStateStore::BindWorkerName(const std::string& name, const std::string& credential) {
  RETURN_IF_ERROR(BeginWrite(StateWrite::kBindWorkerName));
  std::lock_guard<std::mutex> lock(mu_);
  return worker_names_.emplace(name, credential).first->second;
}

Result<bool> MemoryStateStore::DeleteJob(const std::string& job_id) {
  RETURN_IF_ERROR(BeginWrite(StateWrite::kDeleteJob));
  if (!IsName(job_id, kMaxJobIdBytes)) return InvalidArgumentError("delete job '" + job_id + "': not a job id");
  std::lock_guard<std::mutex> lock(mu_);
  auto of_job = [&](const auto& entry) { return entry.first.first == job_id; };
  std::erase_if(checkpoints_, of_job);
  std::erase_if(written_, of_job);
  std::erase_if(rounds_, of_job);
  seats_.erase(job_id);
  cancels_.erase(job_id);
  ended_.erase(job_id);
  damaged_jobs_.erase(job_id);
  return jobs_.erase(job_id) > 0;
}

Result<bool> MemoryStateStore::ForgetWorker(const std::string& name) {
  RETURN_IF_ERROR(BeginWrite(StateWrite::kForgetWorker));
  std::lock_guard<std::mutex> lock(mu_);
  const bool row = workers_.erase(name) != 0;
  const bool bound = worker_names_.erase(name) != 0;
  return row || bound;
}

Status MemoryStateStore::SaveSeat(const std::string& job_id, const std::string& worker_id, uint32_t party) {
  RETURN_IF_ERROR(BeginWrite(StateWrite::kSaveSeat));
  std::lock_guard<std::mutex> lock(mu_);
  seats_[job_id][worker_id] = party;
  return Status::Ok();
}

Result<std::vector<std::pair<std::string, uint32_t>>> MemoryStateStore::LoadSeats(const std::string& job_id,
                                                                                  size_t max_seats) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, uint32_t>> seats;
  auto it = seats_.find(job_id);
  if (it != seats_.end()) {
    if (it->second.size() > max_seats) return TooManySeatsError(job_id, max_seats);
    seats.assign(it->second.begin(), it->second.end());  // by seat: the stable sort keeps it among equal parties
  }
  std::stable_sort(seats.begin(), seats.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  return seats;
}

bool MemoryStateStore::HasCheckpoint(const std::string& job_id, uint32_t round) const {
  std::lock_guard<std::mutex> lock(mu_);
  return checkpoints_.count({job_id, round}) > 0;
}

bool MemoryStateStore::DamageCheckpoint(const std::string& job_id, uint32_t round) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = checkpoints_.find({job_id, round});
  if (it == checkpoints_.end()) return false;
  // The tensors' bytes are the checkpoint's tail (its format: magic, manifest, tensors).
  auto decoded = DecodeCheckpoint(it->second, CheckpointName(job_id, round));
  if (!decoded.ok()) return true;  // damaged already
  size_t bytes = 0;
  for (const auto& t : *decoded) bytes += t.ByteSize();
  if (bytes == 0) return false;
  it->second.back() = static_cast<char>(it->second.back() ^ 0x5a);
  return true;
}

}  // namespace tessera::server
