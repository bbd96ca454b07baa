#include "server/services.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "proto/grpc_status.h"
#include "proto/tensor_transfer.h"
#include "server/coordinator.h"

namespace tessera::server {
namespace {

using wire::ToGrpc;

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  explicit WorkerServiceImpl(Coordinator* c) : c_(c) {}

  grpc::Status Join(grpc::ServerContext* ctx, const v1::JoinRequest* request, v1::JoinResponse* response) override {
    if (!c_->CheckJoinToken(request->join_token())) {
      spdlog::warn("refused a join from '{}' ({}): wrong join token", request->name(), ctx->peer());
      return ToGrpc(PermissionDeniedError("join refused for worker '" + request->name() +
                                          "': the join token does not match the coordinator's"));
    }
    auto joined = c_->registry().Join(*request);
    if (!joined.ok()) return ToGrpc(joined.status());
    if (auto status = c_->registry().Describe(joined->worker_id())) c_->RememberWorker(*status);
    *response = std::move(joined).value();
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request, v1::HeartbeatResponse*) override {
    return ToGrpc(c_->registry().Heartbeat(request->worker_id(), request->session(), request->state()));
  }

  grpc::Status OpenTaskChannel(grpc::ServerContext* ctx, const v1::TaskChannelRequest* request,
                               grpc::ServerWriter<v1::Task>* writer) override {
    WorkerRegistry& registry = c_->registry();
    if (Status s = registry.Authenticate(request->worker_id(), request->session()); !s.ok()) return ToGrpc(s);
    const uint64_t generation = registry.Generation(request->worker_id());
    if (!registry.OpenChannel(request->worker_id(), generation)) {
      return ToGrpc(UnauthenticatedError("worker '" + request->worker_id() + "': session superseded; join again"));
    }
    writer->SendInitialMetadata();
    while (!ctx->IsCancelled()) {
      bool closed = false;
      auto task = registry.NextTask(request->worker_id(), generation, std::chrono::milliseconds(500), &closed);
      if (closed) break;
      if (task && !writer->Write(*task)) break;
    }
    registry.CloseChannel(request->worker_id(), generation);
    return grpc::Status::OK;
  }

  grpc::Status DownloadModel(grpc::ServerContext* ctx, const v1::DownloadModelRequest* request,
                             grpc::ServerWriter<v1::ModelChunkMessage>* writer) override {
    if (Status s = c_->registry().Authenticate(request->worker_id(), request->session()); !s.ok()) return ToGrpc(s);
    auto runner = c_->Runner(request->job_id());
    if (!runner) return ToGrpc(NotFoundError("job '" + request->job_id() + "' is not running on this coordinator"));
    auto model = runner->Model(request->model_version());
    if (!model.ok()) return ToGrpc(model.status());
    const TensorSet& tensors = **model;
    const uint32_t chunk_bytes = c_->options().chunk_bytes;
    v1::ModelChunkMessage message;
    *message.mutable_manifest() = wire::BuildManifest(tensors, chunk_bytes);
    message.set_model_version(request->model_version());
    message.set_model_sha256(TensorSetSha256(tensors));
    if (!writer->Write(message)) return ToGrpc(CancelledError("the worker went away"));
    Status sent = wire::ForEachChunk(tensors, chunk_bytes, request->resume_offset(), [&](const v1::TensorChunk& chunk) {
      v1::ModelChunkMessage m;
      *m.mutable_chunk() = chunk;
      if (ctx->IsCancelled() || !writer->Write(m)) return CancelledError("the worker went away mid-download");
      return Status::Ok();
    });
    if (!sent.ok()) return ToGrpc(sent);
    runner->RecordDownload(request->worker_id(), request->model_version());
    return grpc::Status::OK;
  }

  // Rendezvous keys are confined to the caller's own cohort: "rendezvous/JOB/ROUND/ATTEMPT/COHORT/...".
  Status CheckStoreAccess(const v1::StoreRequest& request) {
    RETURN_IF_ERROR(c_->registry().Authenticate(request.worker_id(), request.session()));
    const std::string cohort = c_->registry().Cohort(request.worker_id());
    if (cohort.empty()) {
      return PermissionDeniedError("worker '" + request.worker_id() + "' is in no cohort; the store serves cohorts");
    }
    const std::string& key = request.key();
    size_t slashes = 0, i = 0;
    for (; i < key.size() && slashes < 4; ++i) slashes += key[i] == '/';
    if (key.rfind("rendezvous/", 0) != 0 || slashes < 4 || key.compare(i, cohort.size() + 1, cohort + "/") != 0) {
      return PermissionDeniedError("worker '" + request.worker_id() + "': key '" + key +
                                   "' is outside its cohort's rendezvous (expected rendezvous/JOB/ROUND/ATTEMPT/" +
                                   cohort + "/...)");
    }
    return Status::Ok();
  }

  grpc::Status StoreSet(grpc::ServerContext*, const v1::StoreRequest* request, v1::StoreResponse*) override {
    if (Status s = CheckStoreAccess(*request); !s.ok()) return ToGrpc(s);
    c_->rendezvous().Set(request->key(), request->value());
    return grpc::Status::OK;
  }

  grpc::Status StoreGet(grpc::ServerContext*, const v1::StoreRequest* request, v1::StoreResponse* response) override {
    if (Status s = CheckStoreAccess(*request); !s.ok()) return ToGrpc(s);
    const auto wait = std::chrono::milliseconds(std::min<uint32_t>(request->wait_ms(), 10000));
    auto value = c_->rendezvous().Get(request->key(), wait);
    if (!value.ok()) return ToGrpc(value.status());
    response->set_value(*value);
    return grpc::Status::OK;
  }

  grpc::Status StoreAdd(grpc::ServerContext*, const v1::StoreRequest* request, v1::StoreResponse* response) override {
    if (Status s = CheckStoreAccess(*request); !s.ok()) return ToGrpc(s);
    response->set_counter(c_->rendezvous().Add(request->key(), request->delta()));
    return grpc::Status::OK;
  }

  grpc::Status UploadUpdate(grpc::ServerContext*, grpc::ServerReader<v1::UpdateChunkMessage>* reader,
                            v1::UploadResult* result) override {
    const auto start = std::chrono::steady_clock::now();
    v1::UpdateChunkMessage message;
    if (!reader->Read(&message) || !message.has_header()) {
      return ToGrpc(InvalidArgumentError("an upload must start with its header"));
    }
    const v1::UpdateHeader header = message.header();
    if (Status s = c_->registry().Authenticate(header.worker_id(), header.session()); !s.ok()) return ToGrpc(s);
    auto runner = c_->Runner(header.job_id());
    auto refuse = [&](const Status& why) {
      result->set_accepted(false);
      result->set_reason(why.message());
      v1::Task verdict;
      verdict.mutable_verdict()->set_job_id(header.job_id());
      verdict.mutable_verdict()->set_round(header.round());
      verdict.mutable_verdict()->set_accepted(false);
      verdict.mutable_verdict()->set_reason(why.message());
      c_->registry().Send(header.worker_id(), std::move(verdict)).ok();
      return grpc::Status::OK;
    };
    if (!runner) return refuse(NotFoundError("job '" + header.job_id() + "' is not running on this coordinator"));
    // Refuse early, before reading the tensors, when the header alone disqualifies it.
    if (Status admitted = runner->AdmitUpload(header); !admitted.ok()) {
      if (admitted.code() == StatusCode::kInvalidArgument) {
        runner->RejectUpload(header, admitted);  // a selected worker's malformed update
      } else {
        spdlog::warn("refused {}", admitted.message());
        c_->registry().RecordRound(header.worker_id(), false);
      }
      return refuse(admitted);
    }
    if (!header.failure().empty()) {
      Status noted = runner->ReportFailure(header);
      result->set_accepted(noted.ok());
      result->set_reason(noted.ok() ? "failure noted" : noted.message());
      return grpc::Status::OK;
    }
    const std::string what = "update from worker '" + header.worker_id() + "' for job " + header.job_id() + " round " +
                             std::to_string(header.round());
    wire::TensorAssembler assembler(what, runner->model_bytes());
    Status assembled = assembler.Start(header.manifest());
    while (assembled.ok() && reader->Read(&message)) {
      if (!message.has_chunk()) {
        assembled = InvalidArgumentError(what + ": expected tensor chunks after the header");
        break;
      }
      assembled = assembler.Add(message.chunk());
    }
    Result<TensorSet> delta = assembled.ok() ? assembler.Finish() : Result<TensorSet>(assembled);
    const double upload_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!delta.ok()) {
      runner->RejectUpload(header, delta.status());
      return refuse(delta.status());
    }
    Status verdict = runner->SubmitUpdate(header, *delta, upload_ms);
    if (!verdict.ok()) return refuse(verdict);
    result->set_accepted(true);
    return grpc::Status::OK;
  }

 private:
  Coordinator* c_;
};

class JobServiceImpl final : public v1::JobService::Service {
 public:
  explicit JobServiceImpl(Coordinator* c) : c_(c) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override {
    auto job = c_->SubmitJob(request->spec());
    if (!job.ok()) return ToGrpc(job.status());
    *response->mutable_job() = *job;
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request, v1::GetJobResponse* response) override {
    auto job = c_->GetJob(request->job_id());
    if (!job.ok()) return ToGrpc(job.status());
    *response->mutable_job() = *job;
    if (request->include_rounds()) {
      auto rounds = c_->ListRounds(request->job_id(), 0);
      if (!rounds.ok()) return ToGrpc(rounds.status());
      for (auto& r : *rounds) *response->add_rounds() = std::move(r);
    }
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*, v1::ListJobsResponse* response) override {
    auto jobs = c_->ListJobs();
    if (!jobs.ok()) return ToGrpc(jobs.status());
    for (auto& job : *jobs) *response->add_jobs() = std::move(job);
    return grpc::Status::OK;
  }

  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                         v1::CancelJobResponse* response) override {
    auto job = c_->CancelJob(request->job_id());
    if (!job.ok()) return ToGrpc(job.status());
    *response->mutable_job() = *job;
    return grpc::Status::OK;
  }

  grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    auto job = c_->GetJob(request->job_id());
    if (!job.ok()) return ToGrpc(job.status());
    // First the rounds already committed, then live events.
    auto runner = c_->Runner(request->job_id());
    auto rounds = c_->ListRounds(request->job_id(), request->from_round());
    if (!rounds.ok()) return ToGrpc(rounds.status());
    uint32_t last_sent = 0;
    for (const auto& r : *rounds) {
      v1::JobEvent event;
      *event.mutable_job() = *job;
      *event.mutable_round() = r;
      if (!writer->Write(event)) return grpc::Status::OK;
      last_sent = r.round();
    }
    if (!runner) {  // a finished job: its end
      v1::JobEvent event;
      *event.mutable_job() = *job;
      event.set_message("job " + job->id() + " " + v1::JobState_Name(job->state()) +
                        (job->error().empty() ? "" : ": " + job->error()));
      writer->Write(event);
      return grpc::Status::OK;
    }
    size_t seen = 0;
    bool ended = false;
    while (!ended && !ctx->IsCancelled()) {
      auto events = runner->events().WaitAfter(seen, std::chrono::milliseconds(500), &ended);
      seen += events.size();
      for (auto& event : events) {
        if (event.has_round()) {
          if (event.round().round() <= last_sent) continue;
          last_sent = event.round().round();
        }
        if (!writer->Write(event)) return grpc::Status::OK;
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    for (auto& w : c_->registry().List()) *response->add_workers() = std::move(w);
    return grpc::Status::OK;
  }

 private:
  Coordinator* c_;
};

}  // namespace

std::unique_ptr<v1::WorkerService::Service> MakeWorkerService(Coordinator* coordinator) {
  return std::make_unique<WorkerServiceImpl>(coordinator);
}

std::unique_ptr<v1::JobService::Service> MakeJobService(Coordinator* coordinator) {
  return std::make_unique<JobServiceImpl>(coordinator);
}

}  // namespace tessera::server
