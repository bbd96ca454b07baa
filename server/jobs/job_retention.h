// How long ended jobs are kept. With a retention set (--ended-job-retention-days), the
// coordinator deletes a job that ended (succeeded, failed or cancelled) once its end is that
// old: its checkpoints, its row, its round records and its seats (StateStore::DeleteJob).
// A job's end is when the state store first wrote its row ended (StateStore::InsertJob), so
// that a job that ran for months is kept for the whole retention after it ended. Without a
// retention, the default, every job's record and kept models stay for good, and the state
// directory grows with every job run.
//
// Thread-safe: Sweep() may be called while the periodic thread runs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/state/state_store.h"
#include "tessera/v1/job.pb.h"

namespace tessera::server {

struct ExpiredJob {
  std::string id;
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  int64_t ended_unix_ms = 0;  // when it ended, as ExpiredJobs took it
};

// The jobs of `jobs` (a store's list, oldest first) that a sweep at `now_unix_ms` deletes: the
// ended ones whose end is at least `keep` before it. A job's end is its time in
// `ended_unix_ms` (the store's JobList::ended_unix_ms, by id); for a job with none there (a row
// stored already ended), its last activity: the newest round's commit, or its creation where
// it committed none. The newest job is never one of them, whatever its state: the next job
// takes one past the largest number stored.
std::vector<ExpiredJob> ExpiredJobs(const std::vector<v1::Job>& jobs, const std::map<std::string, int64_t>& ended_unix_ms,
                                    int64_t now_unix_ms, std::chrono::hours keep);

class JobRetention {
 public:
  // `deleted` is told of each job deleted, after its deletion (the coordinator's counts).
  // `busy`, when given, is asked of each expired job before its deletion: a job it names busy
  // is left for a later sweep (the coordinator's: a job whose row says it ended while its
  // runner is still finishing, telling its workers).
  JobRetention(StateStore* store, std::chrono::hours keep, std::function<void(const ExpiredJob&)> deleted,
               std::function<bool(const std::string& job_id)> busy = nullptr);
  ~JobRetention();  // Stop()
  JobRetention(const JobRetention&) = delete;
  JobRetention& operator=(const JobRetention&) = delete;

  // Deletes the jobs ExpiredJobs gives at `now_unix_ms`, each logged; the ids deleted. A job
  // whose deletion fails, or that is busy, is tried again at the next sweep.
  std::vector<std::string> Sweep(int64_t now_unix_ms);
  // A thread that sweeps at once, then every `interval`, until Stop().
  void Start(std::chrono::milliseconds interval);
  void Stop();

 private:
  StateStore* const store_;
  const std::chrono::hours keep_;
  const std::function<void(const ExpiredJob&)> deleted_;
  const std::function<bool(const std::string&)> busy_;
  std::mutex sweep_mu_;  // one sweep at a time
  std::mutex mu_;        // guards stop_
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tessera::server
