#include "server/jobs/job_retention.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "proto/job_mapping.h"
#include "server/workers/worker_registry.h"  // UnixMillis

namespace tessera::server {
std::vector<ExpiredJob> ExpiredJobs(const std::vector<v1::Job>& jobs, const std::map<std::string, int64_t>& ended_unix_ms,
                                    int64_t now_unix_ms, std::chrono::hours keep) {
  std::vector<ExpiredJob> expired;
  if (jobs.size() < 2 || keep.count() <= 0) return expired;
  const int64_t keep_ms = std::chrono::duration_cast<std::chrono::milliseconds>(keep).count();
  for (size_t i = 0; i + 1 < jobs.size(); ++i) {  // the newest, last, stays
    const v1::Job& job = jobs[i];
    if (!wire::JobEnded(job.state())) continue;
    const auto recorded = ended_unix_ms.find(job.id());
    const int64_t ended = recorded != ended_unix_ms.end()
                              ? recorded->second
                              : std::max(job.created_unix_ms(), job.last_round().committed_unix_ms());
    // A time in the future (a clock set back) is no age at all.
    if (ended > now_unix_ms || now_unix_ms - ended < keep_ms) continue;
    expired.push_back(ExpiredJob{job.id(), job.state(), ended});
  }
  return expired;
}

JobRetention::JobRetention(StateStore* store, std::chrono::hours keep, std::function<void(const ExpiredJob&)> deleted,
                           std::function<bool(const std::string& job_id)> busy)
    : store_(store), keep_(keep), deleted_(std::move(deleted)), busy_(std::move(busy)) {}

JobRetention::~JobRetention() { Stop(); }

std::vector<std::string> JobRetention::Sweep(int64_t now_unix_ms) {
  std::lock_guard<std::mutex> sweeping(sweep_mu_);
  std::vector<std::string> deleted;
  auto listed = store_->ListNewestJobs(SIZE_MAX);
  if (!listed.ok()) {
    spdlog::warn("ended jobs past their retention are not deleted now: {}", listed.status().message());
    return deleted;
  }
  for (const ExpiredJob& job : ExpiredJobs(listed->jobs, listed->ended_unix_ms, now_unix_ms, keep_)) {
    if (busy_ && busy_(job.id)) continue;  // still finishing: its runner would outlive its deletion
    auto gone = store_->DeleteJob(job.id);
    if (!gone.ok()) {
      spdlog::warn("job {}: not deleted, tried again at the next sweep: {}", job.id, gone.status().message());
      continue;
    }
    if (!*gone) continue;  // deleted meanwhile
    spdlog::info("job {} deleted: it ended {} {} days ago (retention: {} days)", job.id,
                 wire::JobStateName(job.state), (now_unix_ms - job.ended_unix_ms) / 86400000, keep_.count() / 24);
    deleted.push_back(job.id);
    if (deleted_) deleted_(job);
  }
  return deleted;
}

void JobRetention::Start(std::chrono::milliseconds interval) {
  thread_ = std::thread([this, interval] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      lock.unlock();
      Sweep(UnixMillis());
      lock.lock();
      cv_.wait_for(lock, interval, [this] { return stop_; });
    }
  });
}

void JobRetention::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tessera::server
