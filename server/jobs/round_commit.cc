// A round's (or a step's) commit when the disk lets it down (server/jobs/job_runner.h,
// CommitWritten): a checkpoint or a record that cannot be written leaves the round
// uncommitted, the previous checkpoint the newest, and the same aggregated model is committed
// again after a wait, with backoff, for as long as JobRunnerOptions::commit_retry_limit
// allows, so that a job rides out a disk that fills for a while (the operator frees space) or
// a passing I/O error. A coordinator killed meanwhile loses the uncommitted round only: the
// job resumes at its last committed round and runs that round again.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "base/format.h"
#include "server/monitoring/coordinator_metrics.h"
#include "server/jobs/job_runner.h"

namespace tessera::server {

namespace {

std::string Seconds(std::chrono::nanoseconds duration) {
  return FormatNumber(std::chrono::duration<double>(duration).count()) + " s";
}

// Whether a wait may mend a failed write: a full disk (ResourceExhausted), an I/O error of a
// file or of SQLite (Internal), a lock another connection holds (Unavailable). A damaged
// database (DataLoss), a record the store refuses (InvalidArgument) or a commit with no
// checkpoint written for it (FailedPrecondition) fail the same way at every try: the job
// fails at once, as with no retry.
bool WaitMayMend(const Status& status) {
  switch (status.code()) {
    case StatusCode::kResourceExhausted:
    case StatusCode::kInternal:
    case StatusCode::kUnavailable: return true;
    default: return false;
  }
}

}  // namespace

Status JobRunner::CommitWritten(v1::Job* committed, v1::RoundRecord* record, const TensorSet& model,
                                const TensorSet& extra, Status written) {
  const std::string& job_id = committed->id();
  const std::string what = std::string(record->has_async_step() ? "step " : "round ") + std::to_string(record->round());
  // The record says when the try that commits it was made.
  const auto stamp = [committed, record] {
    record->set_committed_unix_ms(UnixMillis());
    *committed->mutable_last_round() = *record;
  };
  // A checkpoint written stays the store's to commit while the record's commit fails
  // (StateStore::CommitWrittenRound): a try writes it again only when its write is what
  // failed, so that a disk nearly full is not asked for another copy of the model.
  bool checkpoint_written = written.ok();
  Status last = std::move(written);
  if (checkpoint_written) {
    stamp();
    last = store_->CommitWrittenRound(*committed, *record);
  }
  if (last.ok()) return last;
  RecordCommitFailure(job_id);
  if (options_.commit_retry_limit.count() <= 0 || !WaitMayMend(last)) return last;

  const auto first_failure = clock_->Now();
  auto delay = options_.commit_retry_delay;
  for (int tries = 1;; ++tries) {
    const std::string failure = "cannot commit " + what + " (try " + std::to_string(tries) + "): " +
                                (checkpoint_written ? "its record: " : "its checkpoint: ") + last.message();
    const auto elapsed = clock_->Now() - first_failure;
    if (!WaitMayMend(last)) {
      spdlog::error("job {}: {}; not committed, and not tried again (waiting does not mend it): the job fails", job_id,
                    failure);
      return Status(last.code(), "the commit of " + what + " failed " + std::to_string(tries) + " times in " +
                                     Seconds(elapsed) + "; the last error, which waiting does not mend: " +
                                     last.message());
    }
    if (elapsed >= options_.commit_retry_limit) {
      spdlog::error("job {}: {}; not committed, and tried for {}: the job fails", job_id, failure, Seconds(elapsed));
      const double limit_s = std::chrono::duration<double>(options_.commit_retry_limit).count();
      return Status(last.code(), "the commit of " + what + " failed " + std::to_string(tries) + " times in " +
                                     Seconds(elapsed) + " (--commit-retry-s " + FormatNumber(limit_s) +
                                     "); the last error: " + last.message());
    }
    // The last try comes at the limit, not past it.
    const auto wait = std::min<std::chrono::milliseconds>(
        delay, std::chrono::ceil<std::chrono::milliseconds>(options_.commit_retry_limit - elapsed));
    const std::string retrying = "not committed (the previous checkpoint stays the newest); retrying in " +
                                 Seconds(wait) + ", for up to " + Seconds(options_.commit_retry_limit) + " in all";
    spdlog::error("job {}: {}; {}", job_id, failure, retrying);
    Note("waiting to commit " + what + ": " + failure + "; " + retrying);
    WaitUnlessStopping(wait);  // a cancel or a stop ends the wait
    if (stopping()) {
      const std::string why = cancel_.load() ? "the job was cancelled" : "the coordinator is stopping";
      spdlog::warn("job {}: {} not committed: {}{}", job_id, what, why,
                   cancel_.load() ? "" : "; the job resumes at its last committed round at the next start");
      Note(what + " not committed: " + why);
      return CancelledError(what + " not committed: " + why);
    }
    delay = std::min(delay * 2, options_.max_commit_retry_delay);
    if (!checkpoint_written) {
      last = store_->WriteCheckpoint(job_id, record->round(), model, extra);
      checkpoint_written = last.ok();
    }
    if (checkpoint_written) {
      stamp();
      last = store_->CommitWrittenRound(*committed, *record);
    }
    if (!last.ok()) RecordCommitFailure(job_id);
    if (last.ok()) {
      const std::string message = what + " committed at try " + std::to_string(tries + 1) + ", " +
                                  Seconds(clock_->Now() - first_failure) + " after its first failure";
      spdlog::info("job {}: {}", job_id, message);
      Note(message);
      return last;
    }
  }
}

}  // namespace tessera::server
