// The coordinator's Prometheus metrics (docs/MONITORING.md lists them with their units).
// Recorded where things happen: a committed round's record carries every phase and every
// worker's report, so RecordRound() is the one hook of the round driver; retries, transfers
// and state are recorded at their own places. Label values are job ids, worker ids, phases
// and outcomes: never rounds.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/v1/job.pb.h"

namespace tessera::server {

// A committed round: its phases, each worker's compute, download and upload times and
// outcome, stragglers, the communication share.
void RecordRound(const v1::RoundRecord& record);
// An attempt of a round that did not commit and is tried again.
void RecordRetry(const std::string& job_id);
// A try to commit a round or step of the job whose checkpoint or record could not be written.
void RecordCommitFailure(const std::string& job_id);
// The job has ended and its runner is gone: its series are shown until their families are
// full, then make room for newer jobs' (metrics::FamilyBase::Retire), so that a coordinator
// that has run hundreds of jobs still gives the running one series of its own.
void RetireJob(const std::string& job_id);
// The worker was forgotten (its name is free to join again as a new worker): its series
// are retired as an ended job's are, so that a federation whose workers come and go keeps
// giving new workers series of their own instead of folding them into "other".
void RetireWorker(const std::string& worker_id);
// Bytes of a finished model download or update upload of `worker_id`.
void RecordDownloadBytes(const std::string& worker_id, uint64_t bytes);
void RecordUploadBytes(const std::string& worker_id, uint64_t bytes);
// An update received whole, by `way`: "session" (inside a task session) or "call" (an upload
// call); and how many have come that way (for tests and the dashboard).
void RecordUpdateReceived(const std::string& way);
double UpdatesReceived(const std::string& way);

}  // namespace tessera::server
