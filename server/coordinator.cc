#include "server/coordinator.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "base/escape.h"
#include "base/host_port.h"
#include "base/names.h"
#include "base/rate_limit.h"
#include "proto/job_mapping.h"
#include "proto/list_reply.h"
#include "proto/record_bounds.h"
#include "proto/revocation.h"
#include "server/monitoring/coordinator_metrics.h"
#include "server/rpc/services.h"
#include "server/state/sqlite_state_store.h"

namespace tessera::server {

namespace {

struct ServerTlsMode {
  std::string description;
  bool warn = false;
  std::string warning;
};

ServerTlsMode ModeOf(const wire::ServerTls& tls) {
  if (tls.insecure) {
    return {"PLAINTEXT", true,
            "serving plaintext (--insecure): join tokens, admin tokens and models cross the network unencrypted"};
  }
  return {tls.mutual() ? "mutual TLS" : "TLS", false, ""};
}

// A stored job as served: within the bounds of proto/record_bounds.h, also one whose row was
// written before they held (a longer error).
Result<v1::Job> Bounded(Result<v1::Job> job) {
  if (job.ok()) wire::BoundJob(&*job);
  return job;
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options)
    : options_(std::move(options)),
      registry_(options_.registry),
      rendezvous_(options_.rendezvous),
      upload_budget_(options_.upload_buffer_bytes),
      streams_(options_.streams) {}

Result<std::unique_ptr<Coordinator>> Coordinator::Start(CoordinatorOptions options) {
  ASSIGN_OR_RETURN(HostPort listen, ParseHostPort("--listen", options.listen_address, PortZero::kAllowed));
  RETURN_IF_ERROR(options.streams.Validate());
  RETURN_IF_ERROR(options.rendezvous.Validate());
  if (options.inline_update_max_bytes > CoordinatorOptions::kMaxInlineUpdateBytes) {
    return InvalidArgumentError("inline_update_max_bytes: expected at most " +
                                std::to_string(CoordinatorOptions::kMaxInlineUpdateBytes) + ", got " +
                                std::to_string(options.inline_update_max_bytes));
  }
  if (!options.join_token.empty()) {
    if (options.join_tokens.count("default")) {
      return InvalidArgumentError("two join tokens are labelled 'default' (--join-token and the token file)");
    }
    options.join_tokens["default"] = options.join_token;
  }
  options.runner.chunk_bytes = options.chunk_bytes;
  options.runner.idle_update_buffer_bytes = options.upload_buffer_bytes;
  auto access = std::make_unique<AccessPolicy>(options.join_tokens, options.admin_token, options.tls.mutual());
  RETURN_IF_ERROR(access->Validate());
  // Refused certificates: a few log lines a minute, as the services' other refusals.
  auto refusals = std::make_shared<LogRateLimiter>(5, std::chrono::seconds(60));
  auto on_refusal = [refusals](const std::string& why) {
    uint64_t suppressed = 0;
    if (!refusals->Allow(&suppressed)) return;
    spdlog::warn("refused a call: {}{}", why, HeldBackNote(suppressed, "like it"));
  };
  // A revocation list that changed but does not load: said every time, never rate-limited.
  auto on_problem = [](const std::string& problem) { spdlog::error("{}", problem); };
  ASSIGN_OR_RETURN(std::shared_ptr<wire::RevocationFile> revocation, wire::OpenRevocationList(options.tls));
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   wire::MakeServerCredentials(options.tls, listen, on_refusal, revocation, on_problem));
  std::unique_ptr<Coordinator> c(new Coordinator(std::move(options)));
  c->access_ = std::move(access);
  c->revocation_ = std::move(revocation);
  const std::string& dir = c->options_.state_dir;
  // Durable before anything is written in it: a new directory's parent is synced after its mkdir.
  if (Status made = CreateDirectoriesDurably(dir); !made.ok()) {
    return FailedPreconditionError("cannot create --state-dir " + QuoteUntrusted(dir, 256) + ": " + made.message());
  }
  auto lock = LockFile::Acquire(dir + "/coordinator.lock", "state directory " + QuoteUntrusted(dir, 256));
  if (!lock.ok()) {
    // The hint is for a directory another coordinator holds, not for a lock file refused (a
    // link, a FIFO) or one that cannot be opened.
    const bool held = lock.status().message().find(" is in use by another process") != std::string::npos;
    return held ? Status(lock.status().code(),
                         lock.status().message() + "; stop that coordinator first, or use another --state-dir")
                : lock.status();
  }
  c->state_lock_ = std::move(lock).value();
  ASSIGN_OR_RETURN(std::unique_ptr<SqliteStateStore> store, SqliteStateStore::Open(dir));
  // A coordinator killed between a commit and the removal of the checkpoint it superseded
  // (or mid-write) leaves files behind; nothing runs yet, so they go now.
  auto removed = store->RemoveLeftoverCheckpoints();
  if (!removed.ok()) {
    spdlog::warn("state directory: {}", removed.status().ToString());
  } else {
    // A file's name is whatever was put in the directory: escaped and bounded, as any input.
    for (const std::string& path : *removed) {
      const std::filesystem::path removed_path(path);
      spdlog::info("removed leftover checkpoint file {} from {}", QuoteUntrusted(removed_path.filename().string(), 128),
                   QuoteUntrusted(removed_path.parent_path().string(), 256));
    }
  }
  c->store_ = std::move(store);
  c->services_.push_back(MakeWorkerService(c.get()));
  c->services_.push_back(MakeJobService(c.get()));
  grpc::ServerBuilder builder;
  // The port is this coordinator's alone: with SO_REUSEPORT a second coordinator on the same
  // port would start and silently take half of the new connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(c->options_.listen_address, credentials, &c->port_);
  for (auto& service : c->services_) builder.RegisterService(service.get());
  // Chunks are at most 1 MiB; leave room for the envelope and nothing more.
  builder.SetMaxReceiveMessageSize(static_cast<int>(wire::kCoordinatorMaxReceiveBytes));
  // Liveness at the transport, which costs no RPC: every connection is pinged after 20 s
  // without a ping and closed when the answer takes over 10 s, which ends its worker's task
  // channel and drops the worker from its round at once. Heartbeats (every 15 s by default)
  // then only report the worker's state and catch a worker process that hangs with its
  // connection alive. Workers ping every 10 s themselves (worker/coordinator_client.cc):
  // accepted without data in between, as are any number of pings this side sends.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  if (c->options_.stream_window_kib > 0) {
    // A fixed HTTP/2 receive window per stream instead of the one gRPC grows by probing the
    // link's bandwidth-delay product: less memory per upload on a LAN, slower uploads over a
    // long link (a window per round trip).
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                               static_cast<int>(c->options_.stream_window_kib * 1024));
  }
  c->server_ = builder.BuildAndStart();
  if (!c->server_ || c->port_ == 0) {
    Status why = ProbeListen(listen);
    return UnavailableError("cannot listen on " + QuoteUntrusted(c->options_.listen_address) + ": " +
                            (why.ok() ? std::string("the server did not start") : why.message()));
  }
  ASSIGN_OR_RETURN(auto known, c->store_->LoadWorkers());
  c->registry_.Restore(known);
  RETURN_IF_ERROR(c->ResumeJobs());
  if (c->options_.ended_job_retention.count() > 0) {
    Coordinator* self = c.get();
    c->retention_ = std::make_unique<JobRetention>(c->store_.get(), c->options_.ended_job_retention,
                                                   [self](const ExpiredJob& job) {
                                                     self->ForgetDeletedJob(job.id, job.state);
                                                   },
                                                   // As DeleteJob: a job whose end is recorded
                                                   // but whose runner has not finished waits.
                                                   [self](const std::string& id) {
                                                     auto runner = self->Runner(id);
                                                     return runner != nullptr && !runner->finished();
                                                   });
    c->retention_->Start(c->options_.retention_sweep_interval);
  }
  const ServerTlsMode mode = ModeOf(c->options_.tls);
  spdlog::info("coordinator listening on port {} ({}); state in {}; evaluating on the dataset in {} on device {}",
               c->port_, mode.description, c->options_.state_dir, c->options_.runner.data_dir,
               c->options_.runner.evaluation_device);
  if (mode.warn) spdlog::warn("{}", mode.warning);
  return c;
}

Coordinator::~Coordinator() { Shutdown(); }

Status Coordinator::ResumeJobs() {
  ASSIGN_OR_RETURN(StateStore::JobList listed, store_->ListNewestJobs(SIZE_MAX));
  // One damaged row stops no other job: it is left as it is (its checkpoints kept) for an
  // operator to look at.
  for (const std::string& id : listed.damaged) {
    spdlog::error("job {}: its row in the state store cannot be read; it is not resumed, and its files are kept",
                  QuoteUntrusted(id, 128));
  }
  std::lock_guard<std::mutex> lock(mu_);
  unreadable_jobs_ = listed.damaged.size();
  if (!accepting_) return Status::Ok();
  // No job can have been submitted yet (SubmitJob waits for resumed_): the list is every job.
  for (auto& job : listed.jobs) {
    if (job.state() != v1::JOB_RUNNING && job.state() != v1::JOB_PENDING) {
      ++ended_[job.state()];
      continue;
    }
    spdlog::info("resuming job {} at round {} of {}{}", job.id(), job.rounds_committed() + 1, job.spec().rounds(),
                 job.cancel_requested() ? " (its cancel was recorded: it ends cancelled)" : "");
    auto runner = std::make_shared<JobRunner>(job, store_.get(), &registry_, &rendezvous_, options_.runner);
    runners_[job.id()] = runner;
    // Started under the lock: Shutdown() either finds the runner started or finds
    // accepting_ false before it is made.
    runner->Start();
  }
  resumed_ = true;
  return Status::Ok();
}

void Coordinator::Wait() {
  if (server_) server_->Wait();
}

void Coordinator::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (retention_) retention_->Stop();  // a sweep under way ends first
  registry_.Shutdown();  // task channels finish
  std::map<std::string, std::shared_ptr<JobRunner>> runners;
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;  // no job starts from here on
    runners.swap(runners_);
  }
  for (auto& [id, runner] : runners) runner->Stop();
  for (auto& [id, runner] : runners) runner->events().End();  // watches finish
  rendezvous_.Shutdown();  // waiting StoreGets answer
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  watchdog_.Shutdown();
}

Status Coordinator::BindWorkerName(const std::string& name, const std::string& credential) {
  ASSIGN_OR_RETURN(std::string bound, store_->BindWorkerName(name, credential));
  if (bound == credential) return Status::Ok();
  const auto label = [](const std::string& c) {
    return c.rfind("token:", 0) == 0 ? "join token '" + c.substr(6) + "'" : QuoteUntrusted(c);
  };
  return PermissionDeniedError("join refused for worker '" + name + "': the name is bound to " + label(bound) +
                               " since its first join, and this worker came with " + label(credential) +
                               "; a site's workers join with that site's token");
}

void Coordinator::RememberWorker(const v1::WorkerStatus& worker) {
  if (Status s = store_->SaveWorker(worker); !s.ok()) {
    spdlog::warn("worker {} joined but could not be recorded: {}", worker.worker_id(), s.ToString());
  }
}

Status Coordinator::ForgetWorker(const std::string& name) {
  std::unique_lock<std::shared_mutex> names(names_mu_);  // no join binds or records a name meanwhile
  v1::WorkerStatus removed;
  Status in_registry = registry_.Forget(name, &removed);
  if (!in_registry.ok() && in_registry.code() != StatusCode::kNotFound) return in_registry;
  // A name can be in the store alone: a join that bound it and then failed.
  Result<bool> in_store = store_->ForgetWorker(name);
  if (!in_store.ok()) {
    if (in_registry.ok()) registry_.Restore({removed});
    return Status(in_store.status().code(), "forget worker " + QuoteUntrusted(name, kMaxNameBytes) +
                                                ": the state store failed, and the worker is still known: " +
                                                in_store.status().message());
  }
  if (!in_registry.ok() && !*in_store) return in_registry;  // NOT_FOUND, naming it
  RetireWorker(name);
  spdlog::info("worker {} forgotten by an operator: its name is free to join again with any join token",
               QuoteUntrusted(name, kMaxNameBytes));
  return Status::Ok();
}

Result<v1::Job> Coordinator::SubmitJob(const v1::JobSpec& submitted) {
  if (submitted.data().has_input_shape()) {
    return InvalidArgumentError("spec.data.input_shape: the coordinator fills it from its copy of the dataset; leave it "
                                "unset");
  }
  RETURN_IF_ERROR(wire::ValidateJobSpec(submitted));
  v1::JobSpec spec = submitted;
  RETURN_IF_ERROR(InferInputShape(options_.runner.Datasets(), &spec));
  RETURN_IF_ERROR(wire::ValidateJobSpec(spec));  // the model, the classes and the augmentation against the shape
  v1::Job job;
  {
    // The number read and the row that takes it stored as one step: two submissions between
    // the read and the insert would both read the same number (the store numbers the rows
    // apart, but the ids would share it).
    std::lock_guard<std::mutex> numbering(submit_mu_);
    ASSIGN_OR_RETURN(uint64_t number, store_->NextJobNumber());
    job.set_id("job-" + std::to_string(number) + "-" + RandomHex(3));
    *job.mutable_spec() = spec;
    job.set_state(v1::JOB_PENDING);
    job.set_created_unix_ms(UnixMillis());
    RETURN_IF_ERROR(Accepting("job submission"));
    RETURN_IF_ERROR(store_->InsertJob(job));
  }
  auto runner = std::make_shared<JobRunner>(job, store_.get(), &registry_, &rendezvous_, options_.runner);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_) {
      // Stored as pending: the next start runs it.
      return UnavailableError("job " + job.id() + " is stored, but the coordinator is shutting down; it starts when "
                              "the coordinator starts again");
    }
    // Ended jobs are read from the store; their runners (and the memory they held) go, and
    // their metrics make room for newer jobs' once the families are full.
    // (Job ids are new: the map has no runner for this one to replace.)
    std::erase_if(runners_, [this](const auto& entry) {
      if (!entry.second->finished()) return false;
      ++ended_[entry.second->state()];
      RetireJob(entry.first);
      return true;
    });
    runners_[job.id()] = runner;
    runner->Start();  // under the lock, as in ResumeJobs
  }
  spdlog::info("job {} submitted: {} rounds of {} clients ({})", job.id(), spec.rounds(), spec.clients_per_round(),
               EscapeUntrusted(spec.name()));
  return job;
}

std::shared_ptr<JobRunner> Coordinator::Runner(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = runners_.find(job_id);
  return it == runners_.end() ? nullptr : it->second;
}

Result<v1::Job> Coordinator::GetJob(const std::string& job_id) {
  if (auto runner = Runner(job_id)) return runner->Snapshot();
  return Bounded(store_->GetJob(job_id));
}

Result<v1::Job> Coordinator::ListedJob(const std::string& job_id) {
  if (auto runner = Runner(job_id)) return runner->Listed();
  return Bounded(store_->GetJob(job_id));  // a row holds no reports
}

Result<std::shared_ptr<const ModelVersion>> Coordinator::ExportModel(const std::string& job_id,
                                                                       std::optional<uint32_t> round,
                                                                       uint32_t chunk_bytes) {
  ASSIGN_OR_RETURN(v1::Job job, GetJob(job_id));
  const uint32_t committed = job.rounds_committed();
  const uint32_t wanted = round.value_or(committed);
  if (wanted > committed) {
    return NotFoundError("job " + job_id + " has committed " + std::to_string(committed) + " round(s); round " +
                         std::to_string(wanted) + " has no model yet");
  }
  auto tensors = store_->LoadCheckpoint(job_id, wanted);
  if (!tensors.ok() && tensors.status().code() == StatusCode::kNotFound) {
    return NotFoundError("job " + job_id + ": the model of round " + std::to_string(wanted) +
                         " is not kept (the coordinator keeps the initial model and the newest " +
                         std::to_string(kKeptCheckpoints) + " rounds' checkpoints; the newest is round " +
                         std::to_string(committed) + ")");
  }
  if (!tensors.ok()) {
    // A checkpoint that is there but cannot be read (damaged, an I/O error) is not "not kept":
    // its error, with the file it names, is the operator's to see.
    return Status(tensors.status().code(), "job " + job_id + ": the model of round " + std::to_string(wanted) +
                                               " cannot be read: " + tensors.status().message());
  }
  TensorSet state;
  auto model = std::make_shared<const TensorSet>(SplitModelAndState(std::move(tensors).value(), &state));
  return ModelVersion::Encode(std::move(model), wanted, chunk_bytes);
}

Result<StateStore::JobList> Coordinator::ListJobs(size_t max_jobs) {
  ASSIGN_OR_RETURN(StateStore::JobList list, store_->ListNewestJobs(max_jobs));
  for (auto& job : list.jobs) {
    if (auto runner = Runner(job.id())) {
      job = runner->Listed();
    } else {
      wire::BoundJob(&job);
    }
  }
  return list;
}

Result<v1::ListJobsResponse> Coordinator::JobsReply() {
  ASSIGN_OR_RETURN(StateStore::JobList list, ListJobs(wire::kMaxListEntries));
  // The newest first, until the bytes run out.
  size_t bytes = 0, first = list.jobs.size();
  while (first > 0) {
    const size_t size = list.jobs[first - 1].ByteSizeLong() + 8;  // and its tag and length
    if (bytes + size > wire::kMaxListBytes) break;
    bytes += size;
    --first;
  }
  v1::ListJobsResponse reply;
  for (size_t i = first; i < list.jobs.size(); ++i) *reply.add_jobs() = std::move(list.jobs[i]);
  const uint64_t listed = static_cast<uint64_t>(reply.jobs_size());
  reply.set_more(list.total > listed ? list.total - listed : 0);
  return reply;
}

Status Coordinator::Accepting(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!accepting_) return UnavailableError(what + " refused: the coordinator is shutting down");
  if (!resumed_) return UnavailableError(what + " refused: the coordinator is starting (resuming its jobs); try again");
  return Status::Ok();
}

uint64_t Coordinator::UnreadableJobs() {
  std::lock_guard<std::mutex> lock(mu_);
  return unreadable_jobs_;
}

std::map<v1::JobState, uint64_t> Coordinator::JobCounts() {
  // Each runner is asked outside the coordinator's lock: one busy under its own lock (a large
  // model encoded as it resumes) must not hold up every Runner() lookup, and with them the
  // workers' calls, for the length of a metrics scrape.
  std::map<v1::JobState, uint64_t> counts;
  std::vector<std::shared_ptr<JobRunner>> runners;
  {
    std::lock_guard<std::mutex> lock(mu_);
    counts = ended_;
    runners.reserve(runners_.size());
    for (const auto& [id, runner] : runners_) runners.push_back(runner);
  }
  for (const auto& runner : runners) ++counts[runner->state()];
  return counts;
}

Result<v1::Job> Coordinator::CancelJob(const std::string& job_id) {
  RETURN_IF_ERROR(Accepting("cancel of job " + job_id));
  auto runner = Runner(job_id);
  ASSIGN_OR_RETURN(v1::Job job, runner ? Result<v1::Job>(runner->Snapshot()) : Bounded(store_->GetJob(job_id)));
  if (job.state() != v1::JOB_PENDING && job.state() != v1::JOB_RUNNING) {
    return FailedPreconditionError("job " + job_id + " is " + wire::JobStateName(job.state()) +
                                   "; only a pending or running job can be cancelled");
  }
  // Durable before the answer: a coordinator killed after it ends the job at its next start.
  if (Status recorded = store_->RequestCancel(job_id); !recorded.ok()) {
    return Status(recorded.code(), "job " + job_id + " is not cancelled: the cancel could not be recorded (" +
                                       recorded.message() + "); the job goes on");
  }
  if (!runner) {
    // Stored, not running here (submitted as shutdown began): it ends cancelled when the
    // coordinator starts again.
    job.set_cancel_requested(true);
    return job;
  }
  runner->Cancel();
  v1::Job now = runner->Listed();  // the reply: without the last round's per-worker reports
  if (now.state() == v1::JOB_SUCCEEDED || now.state() == v1::JOB_FAILED) {
    return FailedPreconditionError("job " + job_id + " ended " + wire::JobStateName(now.state()) +
                                   " before the cancel took effect");
  }
  return now;
}

Result<v1::Job> Coordinator::DeleteJob(const std::string& job_id) {
  RETURN_IF_ERROR(Accepting("deletion of job " + job_id));
  auto runner = Runner(job_id);
  if (runner && !runner->finished()) {
    const v1::JobState now = runner->state();
    if (wire::JobEnded(now)) {
      // Between its end and its runner's last step: its end is being recorded.
      return UnavailableError("job " + job_id + " has just ended " + wire::JobStateName(now) +
                              " and is still recording its end; try again in a moment");
    }
    return FailedPreconditionError("job " + job_id + " is " + wire::JobStateName(now) +
                                   "; only an ended job can be deleted (cancel it first: tessera cancel " + job_id + ")");
  }
  ASSIGN_OR_RETURN(v1::Job job, Bounded(store_->GetJob(job_id)));
  const v1::JobState state = job.state();
  if (!wire::JobEnded(state)) {
    return FailedPreconditionError("job " + job_id + " is " + wire::JobStateName(state) +
                                   "; only an ended job can be deleted (cancel it first: tessera cancel " + job_id + ")");
  }
  ASSIGN_OR_RETURN(StateStore::JobList newest, store_->ListNewestJobs(1));
  if (!newest.jobs.empty() && newest.jobs.back().id() == job_id) {
    return FailedPreconditionError("job " + job_id +
                                   " is the newest job: it is kept so that its number is not given to another job; "
                                   "it can be deleted once a newer job is submitted");
  }
  ASSIGN_OR_RETURN(bool deleted, store_->DeleteJob(job_id));
  if (!deleted) return NotFoundError("job " + job_id + " was deleted meanwhile");
  ForgetDeletedJob(job_id, state);
  spdlog::info("job {} deleted by an operator: it had ended {} after {} committed rounds", job_id,
               wire::JobStateName(state), job.rounds_committed());
  return job;
}

void Coordinator::ForgetDeletedJob(const std::string& job_id, v1::JobState state) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = runners_.find(job_id);
  if (it != runners_.end() && it->second->finished()) {
    runners_.erase(it);  // it was counted as its runner, not in ended_
    RetireJob(job_id);
    return;
  }
  uint64_t& count = ended_[state];
  if (count > 0) --count;
}

Result<std::vector<v1::RoundRecord>> Coordinator::ListRounds(const std::string& job_id, uint32_t from_round,
                                                             size_t max_bytes) {
  ASSIGN_OR_RETURN(auto rounds, store_->ListRounds(job_id, from_round, max_bytes));
  // A record stored before its text was bounded is served within the bounds all the same, so
  // that the command line can read it (proto/record_bounds.h).
  for (v1::RoundRecord& record : rounds) wire::BoundRoundRecord(&record);
  return rounds;
}

Result<v1::GetJobResponse> Coordinator::JobWithRounds(const std::string& job_id, uint32_t from_round,
                                                      size_t page_bytes) {
  v1::GetJobResponse response;
  ASSIGN_OR_RETURN(*response.mutable_job(), ListedJob(job_id));  // the reports are in the rounds
  size_t bytes = response.job().ByteSizeLong();
  ASSIGN_OR_RETURN(auto rounds, ListRounds(job_id, from_round, page_bytes > bytes ? page_bytes - bytes : 0));
  for (auto& r : rounds) {
    const size_t size = r.ByteSizeLong() + 8;  // and its tag and length
    if (response.rounds_size() > 0 && bytes + size > page_bytes) {
      response.set_next_round(r.round());
      break;
    }
    bytes += size;
    *response.add_rounds() = std::move(r);
  }
  return response;
}

}  // namespace tessera::server
