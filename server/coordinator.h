// The coordinator daemon's core: durable state, the worker registry, one runner per job,
// and the gRPC server that serves the worker-facing and the user-facing services.
//
// Start() checks the credentials it is given (AccessPolicy::Validate, TLS unless insecure on
// loopback), locks the state directory (a second coordinator on it is refused, naming the
// first one's PID), opens it, binds the listening address exclusively (no SO_REUSEPORT: a
// second coordinator on the same port fails instead of sharing its connections), and
// resumes every job that was running; port 0 picks a free port (tests). Shutdown() follows gRPC's documented order: finish the
// long-lived streams (task channels, watches), then stop the server, which waits for the
// calls in flight. Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "base/lock_file.h"
#include "proto/transport_security.h"
#include "server/jobs/job_retention.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/model_version.h"
#include "server/rpc/access_policy.h"
#include "server/rpc/byte_budget.h"
#include "server/rpc/stream_limits.h"
#include "server/state/state_store.h"
#include "server/workers/worker_registry.h"
#include "tessera/v1/job_service.pb.h"

namespace tessera::server {

struct CoordinatorOptions {
  std::string listen_address = "127.0.0.1:7070";  // HOST:PORT; port 0 picks a free one
  std::string state_dir = "./var";
  // Credentials (server/rpc/access_policy.h): workers join with a join token (label -> token; a
  // name is bound to the label it first joined with) and/or, under mutual TLS, a worker
  // certificate; operators call the job service with the admin token or an operator
  // certificate. `join_token` is a single token labelled "default".
  std::map<std::string, std::string> join_tokens;
  std::string join_token;
  std::string admin_token;
  wire::ServerTls tls;                       // TLS unless tls.insecure (loopback only)
  uint32_t chunk_bytes = 1u << 20;           // model download chunk size (at most 1 MiB)
  // Bytes that uploads being received may hold at once; more wait their turn in their workers
  // (upload admission; one upload is always let through, whatever its size). Keeps memory
  // flat in the number of workers.
  uint64_t upload_buffer_bytes = uint64_t{64} << 20;
  // HTTP/2 receive window per stream in KiB; 0: gRPC's, grown by probing the link's
  // bandwidth-delay product. gRPC's probing lets a hundred 10 MiB uploads hold about a GB of
  // receive buffers; a fixed 1 MiB window holds the coordinator near 300 MB, and caps each
  // upload at a window per round trip (10 MB/s at 100 ms;
  // docs/benchmarks/round-overhead-history-2026-12-01-02.md).
  uint32_t stream_window_kib = 1024;
  // Workers send an update of at least this many bytes on a connection of their own, closed
  // when the upload ends (JoinResponse.upload_connection_min_bytes): gRPC keeps each
  // connection's read buffers at the size of the largest transfer it carried, so large
  // uploads on the workers' own connections would hold 0.5-0.7 MiB here per worker. A new
  // connection costs a TLS handshake (about 3 ms of the coordinator's CPU here), which a
  // 4 MiB update's transfer outweighs (docs/benchmarks/round-overhead-history-2026-12-01-02.md).
  // 0: every upload on the worker's connection.
  uint64_t upload_connection_min_bytes = uint64_t{4} << 20;
  // Workers open a task session (WorkerService.TaskSession) and send an update of at most
  // this many bytes inside it, with no upload call (JoinResponse.inline_update_max_bytes):
  // a small model's round then costs each worker no call beyond its session. 0: task
  // channels and upload calls, as older workers use. At most kMaxInlineUpdateBytes.
  uint64_t inline_update_max_bytes = uint64_t{256} << 10;
  static constexpr uint64_t kMaxInlineUpdateBytes = uint64_t{1} << 20;
  // Timeouts and counts of open streams (server/rpc/stream_limits.h), the rendezvous store's
  // quotas (server/workers/rendezvous_store.h); checked by Start().
  StreamLimits streams;
  RendezvousLimits rendezvous;
  WorkerRegistryOptions registry;
  JobRunnerOptions runner;
  // Ended jobs are deleted once their end is this old (server/jobs/job_retention.h),
  // swept at start and every `retention_sweep_interval`; 0: kept for good.
  std::chrono::hours ended_job_retention{0};
  std::chrono::milliseconds retention_sweep_interval{std::chrono::hours(1)};
  // Runs in a watch (WatchJob) each time it has read a page of a job's committed rounds from
  // the state store, before it takes them, on the gRPC thread, with the job's id. A seam for
  // tests, which run a round there.
  std::function<void(const std::string& job_id)> watch_page_read_hook;
};

class Coordinator {
 public:
  static Result<std::unique_ptr<Coordinator>> Start(CoordinatorOptions options);
  ~Coordinator();

  int port() const { return port_; }
  const CoordinatorOptions& options() const { return options_; }
  WorkerRegistry& registry() { return registry_; }
  RendezvousStore& rendezvous() { return rendezvous_; }
  ByteBudget& upload_budget() { return upload_budget_; }
  StreamCounter& streams() { return streams_; }
  StreamWatchdog& watchdog() { return watchdog_; }

  // Blocks until Shutdown() is called from another thread or a signal handler's thread.
  void Wait();
  void Shutdown();

  // The user-facing operations.
  Result<v1::Job> SubmitJob(const v1::JobSpec& spec);
  Result<v1::Job> GetJob(const std::string& job_id);
  // The job without its last round's per-worker reports, as in the lists.
  Result<v1::Job> ListedJob(const std::string& job_id);
  // The newest `max_jobs` jobs (the oldest of them first), each without its last round's
  // per-worker reports, and how many jobs there are in all. A job whose stored row cannot be
  // read is left out (it was logged at start).
  Result<StateStore::JobList> ListJobs(size_t max_jobs);
  // Jobs by state, from memory: what the coordinator read at start and what its runners
  // hold (a scrape of /metrics reads no job from the store).
  std::map<v1::JobState, uint64_t> JobCounts();
  // Jobs whose stored row could not be read at start (not resumed, not in JobCounts).
  uint64_t UnreadableJobs();
  // ListJobs as a reply: the newest jobs within wire::kMaxListEntries and kMaxListBytes, the
  // oldest of them first; `more` counts the jobs left out.
  Result<v1::ListJobsResponse> JobsReply();
  // Records the cancel durably, then tells the job's runner: once this returns Ok, the job
  // ends CANCELLED, also if the coordinator is killed first (it ends at the next start). The
  // job as ListedJob gives it.
  Result<v1::Job> CancelJob(const std::string& job_id);
  // Deletes a job that ended (tessera delete): StateStore::DeleteJob, then its runner, metrics
  // and count. The job as last stored. FAILED_PRECONDITION while it is pending or running, and
  // for the newest job (the next job takes one past the largest number stored); NOT_FOUND for
  // an unknown job.
  Result<v1::Job> DeleteJob(const std::string& job_id);
  Result<std::vector<v1::RoundRecord>> ListRounds(const std::string& job_id, uint32_t from_round,
                                                  size_t max_bytes = SIZE_MAX);
  // The job (as ListedJob gives it) and a page of its committed rounds from `from_round`: at
  // most `page_bytes` in all, the job's own bytes counted, and always the first round (a
  // round's record is bounded by the workers a round takes); next_round is set to the first
  // round left out. Read by
  // GetJob and the dashboard's /api/job; the store parses at most a page and one record.
  Result<v1::GetJobResponse> JobWithRounds(const std::string& job_id, uint32_t from_round, size_t page_bytes);
  // The global model of `round` of a job (its newest committed round when unset), from its
  // checkpoint, without the strategy's state, encoded for the wire in chunks of
  // `chunk_bytes`. NotFound when the round is not committed or its checkpoint is not kept.
  // Reads the checkpoint file on the calling thread.
  Result<std::shared_ptr<const ModelVersion>> ExportModel(const std::string& job_id, std::optional<uint32_t> round,
                                                          uint32_t chunk_bytes);
  // The runner of a job that is running in this process, or nullptr.
  std::shared_ptr<JobRunner> Runner(const std::string& job_id);

  const AccessPolicy& access() const { return *access_; }
  // The certificate revocation list in force under mutual TLS (--tls-crl), or null.
  wire::RevocationFile* revocation() const { return revocation_.get(); }
  // Binds a worker's name to `credential` at its first join; PermissionDenied when the name
  // is bound to another credential.
  Status BindWorkerName(const std::string& name, const std::string& credential);
  // Persists a worker's identity and device after it joins (a failure is logged, not fatal).
  void RememberWorker(const v1::WorkerStatus& worker);
  // Held, shared, by a join from its check against max_workers to RememberWorker, so that
  // ForgetWorker never falls between a join's binding of the name and its registry entry.
  std::shared_lock<std::shared_mutex> JoiningNames() { return std::shared_lock<std::shared_mutex>(names_mu_); }
  // Forgets a worker gone for good (tessera workers forget): its registry entry, then its
  // stored row and its name's binding, durably. FAILED_PRECONDITION while it is alive,
  // NOT_FOUND when neither the registry nor the store knows the name. When the store fails
  // the registry entry is put back, so that what is listed is what a restart would list.
  Status ForgetWorker(const std::string& name);

 private:
  explicit Coordinator(CoordinatorOptions options);
  Status ResumeJobs();
  // Ok between the end of ResumeJobs and the start of Shutdown; UNAVAILABLE naming `what`
  // otherwise.
  Status Accepting(const std::string& what);
  // After a job's deletion from the store (by DeleteJob or the retention): its ended runner,
  // if this process still holds it, is dropped with its metrics; otherwise the count of jobs
  // ended in `state` loses it.
  void ForgetDeletedJob(const std::string& job_id, v1::JobState state);

  CoordinatorOptions options_;
  std::unique_ptr<LockFile> state_lock_;  // held for the coordinator's whole life
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<AccessPolicy> access_;
  std::shared_ptr<wire::RevocationFile> revocation_;  // null: no revocation list
  WorkerRegistry registry_;
  RendezvousStore rendezvous_;
  ByteBudget upload_budget_;
  StreamCounter streams_;     // outlives the server and its streams' slots
  StreamWatchdog watchdog_;
  std::unique_ptr<JobRetention> retention_;  // with a retention set, once jobs are resumed
  std::shared_mutex names_mu_;  // joins shared, ForgetWorker exclusive
  // Held by SubmitJob from reading the next job number to storing the job, so that no two
  // jobs read the same number; taken before mu_, never while it is held.
  std::mutex submit_mu_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<JobRunner>> runners_;
  std::map<v1::JobState, uint64_t> ended_;  // jobs ended with no runner left in runners_
  uint64_t unreadable_jobs_ = 0;             // stored rows that did not parse at start
  // Jobs are submitted and cancelled only between the end of ResumeJobs (the server takes
  // calls before it, so that workers can rejoin) and the start of Shutdown.
  bool resumed_ = false;
  bool accepting_ = true;  // false once Shutdown() has begun: no job starts
  std::vector<std::unique_ptr<grpc::Service>> services_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex shutdown_mu_;
  bool shut_down_ = false;
};

}  // namespace tessera::server
