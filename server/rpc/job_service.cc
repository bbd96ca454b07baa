// JobService: what the `tessera` command line calls (server/rpc/services.h).
#include "server/rpc/services.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/escape.h"
#include "proto/grpc_status.h"
#include "proto/job_mapping.h"
#include "proto/list_reply.h"
#include "proto/tensor_transfer.h"
#include "server/coordinator.h"
#include "server/rpc/service_doors.h"

namespace tessera::server {
namespace {

using wire::ToGrpc;

// List replies stay well under the command line's 4 MiB receive limit, whatever is stored:
// at most this many entries and bytes; the reply's trailing metadata says how many more
// there were (kMoreEntriesTrailer).
constexpr size_t kMaxListEntries = 1000;
constexpr size_t kMaxListBytes = 3 << 20;

// One `tessera watch`: the committed rounds, then the job's live events until it ends.
class JobWatch final {
 public:
  JobWatch(std::shared_ptr<JobRunner> runner, grpc::ServerWriteReactor<v1::JobEvent>* reactor,
           grpc::CallbackServerContext* ctx)
      : runner_(std::move(runner)), reactor_(reactor), ctx_(ctx) {}

  // Before the first Pump(): the rounds already committed, and for a job that is not running
  // the end of its log.
  void Backlog(const v1::Job& job, std::vector<v1::RoundRecord> rounds) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& r : rounds) {
      v1::JobEvent event;
      *event.mutable_job() = job;
      last_round_ = r.round();
      *event.mutable_round() = std::move(r);
      outbox_.push_back(std::move(event));
    }
    if (!runner_) {
      v1::JobEvent event;
      *event.mutable_job() = job;
      event.set_message("job " + job.id() + " " + wire::JobStateName(job.state()) +
                        (job.error().empty() ? "" : ": " + job.error()));
      outbox_.push_back(std::move(event));
      log_ended_ = true;
    }
  }

  static void Follow(const std::shared_ptr<JobWatch>& watch) {
    std::weak_ptr<JobWatch> weak = watch;
    std::lock_guard<std::mutex> lock(watch->mu_);
    if (watch->runner_) {
      watch->subscription_ = watch->runner_->events().Subscribe([weak] {
        if (auto w = weak.lock()) w->Pump();
      });
    }
  }

  // Writes the next event, or finishes once the log has ended and been sent (or the watcher
  // left), unless a write is in flight.
  void Pump() {
    grpc::ServerWriteReactor<v1::JobEvent>* reactor = nullptr;
    bool finish = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reactor_ == nullptr || writing_ || finish_called_) return;
      if (!cancelled_ && outbox_.empty() && runner_ && !log_ended_) {
        bool ended = false;
        size_t missed = 0;
        std::vector<v1::JobEvent> events = runner_->events().Since(seen_, &ended, &missed);
        seen_ += missed + events.size();
        if (missed > 0) {  // fell behind the log's capacity: skip forward, and say so
          v1::JobEvent note;
          if (!events.empty()) *note.mutable_job() = events.front().job();
          note.set_message(std::to_string(missed) + " events of the job's history were dropped before this watch read "
                           "them (it keeps the last " + std::to_string(runner_->events().capacity()) +
                           "); `tessera status` shows every committed round");
          outbox_.push_back(std::move(note));
        }
        for (auto& event : events) {
          if (event.has_round()) {  // already sent from the committed rounds
            if (event.round().round() <= last_round_) continue;
            last_round_ = event.round().round();
          }
          outbox_.push_back(std::move(event));
        }
        log_ended_ = ended;
      }
      if (cancelled_ || (outbox_.empty() && log_ended_)) {
        finish = finish_called_ = true;
      } else if (outbox_.empty()) {
        return;
      } else {
        in_flight_ = std::move(outbox_.front());
        outbox_.pop_front();
        writing_ = true;
        write_started_ = std::chrono::steady_clock::now();
      }
      reactor = reactor_;
    }
    if (finish) {
      reactor->Finish(finish_status_);
    } else {
      reactor->StartWrite(&in_flight_);
    }
  }

  void WriteDone(bool ok) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok) cancelled_ = true;
    }
    Pump();
  }

  // A limit passed (server/rpc/stream_limits.h): the watch ends with `why`; a write the
  // watcher does not take is cancelled.
  void Expire(const Status& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reactor_ == nullptr || finish_called_) return;
      finish_status_ = ToGrpc(why);
      cancelled_ = true;
      if (writing_) ctx_->TryCancel();
    }
    Pump();
  }

  // No write has waited on the watcher for `idle`.
  bool Alive(std::chrono::milliseconds idle) {
    std::lock_guard<std::mutex> lock(mu_);
    if (writing_ && std::chrono::steady_clock::now() - write_started_ >= idle) return false;
    return true;
  }

  void Cancelled() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
    }
    Pump();
  }

  // The reactor is being deleted.
  void Done() {
    std::shared_ptr<JobRunner> runner;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reactor_ = nullptr;
      runner = std::move(runner_);
    }
    if (runner && subscription_ != 0) runner->events().Unsubscribe(subscription_);
  }

 private:
  std::mutex mu_;  // guards the fields below; held while reading the job's events
  std::shared_ptr<JobRunner> runner_;  // null for a job that is not running here
  grpc::ServerWriteReactor<v1::JobEvent>* reactor_;  // null once done
  grpc::CallbackServerContext* const ctx_;           // valid while reactor_ is set
  grpc::Status finish_status_ = grpc::Status::OK;
  std::chrono::steady_clock::time_point write_started_;
  uint64_t subscription_ = 0;
  std::deque<v1::JobEvent> outbox_;
  size_t seen_ = 0;         // events taken from the job's log
  uint32_t last_round_ = 0;  // the last round queued
  bool log_ended_ = false;
  bool cancelled_ = false;
  bool writing_ = false;  // a write is in flight; in_flight_ belongs to it
  bool finish_called_ = false;
  v1::JobEvent in_flight_;
};

class WatchJobReactor final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  // `admitted`: the operator check, done by the service.
  WatchJobReactor(Coordinator* c, grpc::CallbackServerContext* ctx, const v1::WatchJobRequest& request,
                  const Status& admitted) {
    if (!admitted.ok()) {
      Finish(ToGrpc(admitted));
      return;
    }
    auto slot = c->streams().Open(CallerOf(ctx), "watch");
    if (!slot.ok()) {
      Finish(ToGrpc(slot.status()));
      return;
    }
    slot_ = std::move(slot).value();
    if (Status s = CheckJobId("watch", request.job_id()); !s.ok()) {
      Finish(ToGrpc(s));
      return;
    }
    auto job = c->GetJob(request.job_id());
    if (!job.ok()) {
      Finish(ToGrpc(job.status()));
      return;
    }
    auto runner = c->Runner(request.job_id());
    auto rounds = c->ListRounds(request.job_id(), request.from_round());
    if (!rounds.ok()) {
      Finish(ToGrpc(rounds.status()));
      return;
    }
    watch_ = std::make_shared<JobWatch>(std::move(runner), this, ctx);
    watch_->Backlog(*job, std::move(rounds).value());
    std::weak_ptr<JobWatch> weak = watch_;
    const StreamLimits& limits = c->options().streams;
    deadline_ = StreamDeadline::Create("watch of job " + request.job_id(), limits.idle_timeout,
                                                 limits.channel_max_age, "maximum age (channel_max_age)",
                                                 [weak](const Status& why) {
                                                   if (auto w = weak.lock()) w->Expire(why);
                                                 });
    deadline_->SetAliveProbe([weak, idle = limits.idle_timeout] {
      auto w = weak.lock();
      return w && w->Alive(idle);
    });
    c->watchdog().Watch(deadline_);
    JobWatch::Follow(watch_);
    watch_->Pump();
  }

  void OnWriteDone(bool ok) override {
    deadline_->Progress();
    watch_->WriteDone(ok);
  }
  void OnCancel() override {
    if (watch_) watch_->Cancelled();
  }
  void OnDone() override {
    if (deadline_) deadline_->ClaimFinish();  // the watchdog forgets it
    if (watch_) watch_->Done();
    delete this;
  }

 private:
  std::unique_ptr<StreamCounter::Slot> slot_;
  std::shared_ptr<JobWatch> watch_;  // null when the watch was refused
  std::shared_ptr<StreamDeadline> deadline_;
};

// Moves entries into `out` up to kMaxListEntries and kMaxListBytes; returns how many were left.
template <typename T>
size_t AddBounded(std::vector<T>& entries, google::protobuf::RepeatedPtrField<T>* out) {
  size_t bytes = 0, taken = 0;
  for (auto& entry : entries) {
    const size_t size = entry.ByteSizeLong() + 8;  // and its tag and length
    if (taken == kMaxListEntries || bytes + size > kMaxListBytes) break;
    bytes += size;
    *out->Add() = std::move(entry);
    ++taken;
  }
  return entries.size() - taken;
}

class JobServiceImpl final : public v1::JobService::WithCallbackMethod_WatchJob<v1::JobService::Service> {
 public:
  explicit JobServiceImpl(Coordinator* c) : c_(c) {}

  grpc::Status SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override {
    if (Status s = CheckOperator(ctx); !s.ok()) return ToGrpc(s);
    auto job = c_->SubmitJob(request->spec());
    if (!job.ok()) return ToGrpc(job.status());
    *response->mutable_job() = *job;
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* request, v1::GetJobResponse* response) override {
    if (Status s = CheckOperator(ctx); !s.ok()) return ToGrpc(s);
    if (Status s = CheckJobId("get job", request->job_id()); !s.ok()) return ToGrpc(s);
    if (!request->include_rounds()) {
      auto job = c_->GetJob(request->job_id());
      if (!job.ok()) return ToGrpc(job.status());
      *response->mutable_job() = *job;
      return grpc::Status::OK;
    }
    // Bounded as the lists are (Coordinator::JobWithRounds).
    auto page = c_->JobWithRounds(request->job_id(), request->from_round(), kMaxListBytes);
    if (!page.ok()) return ToGrpc(page.status());
    *response = std::move(*page);
    // For a client that does not read next_round, as the lists say what they left out.
    if (response->next_round() != 0) {
      ctx->AddTrailingMetadata(wire::kNextRoundTrailer, std::to_string(response->next_round()));
    }
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest*, v1::ListJobsResponse* response) override {
    if (Status s = CheckOperator(ctx); !s.ok()) return ToGrpc(s);
    auto jobs = c_->ListJobs();
    if (!jobs.ok()) return ToGrpc(jobs.status());
    // The newest jobs first when there are too many to show.
    std::reverse(jobs->begin(), jobs->end());
    const size_t more = AddBounded(*jobs, response->mutable_jobs());
    std::reverse(response->mutable_jobs()->begin(), response->mutable_jobs()->end());
    if (more > 0) ctx->AddTrailingMetadata(wire::kMoreEntriesTrailer, std::to_string(more));
    return grpc::Status::OK;
  }

  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* request,
                         v1::CancelJobResponse* response) override {
    if (Status s = CheckOperator(ctx); !s.ok()) return ToGrpc(s);
    if (Status s = CheckJobId("cancel job", request->job_id()); !s.ok()) return ToGrpc(s);
    auto job = c_->CancelJob(request->job_id());
    if (!job.ok()) return ToGrpc(job.status());
    *response->mutable_job() = *job;
    return grpc::Status::OK;
  }

  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* ctx,
                                                   const v1::WatchJobRequest* request) override {
    return new WatchJobReactor(c_, ctx, *request, CheckOperator(ctx));
  }

  // Synchronous: an operator's rare call; it holds one of the synchronous threads while the
  // checkpoint is read and sent, and counts among the caller's streams.
  grpc::Status ExportModel(grpc::ServerContext* ctx, const v1::ExportModelRequest* request,
                           grpc::ServerWriter<v1::ModelChunkMessage>* writer) override {
    if (Status s = CheckOperator(ctx); !s.ok()) return ToGrpc(s);
    if (Status s = CheckJobId("export model", request->job_id()); !s.ok()) return ToGrpc(s);
    auto slot = c_->streams().Open(CallerOf(ctx), "export");
    if (!slot.ok()) return ToGrpc(slot.status());
    std::optional<uint32_t> round;
    if (request->has_round()) round = request->round();
    auto model = c_->ExportModel(request->job_id(), round, 1u << 20);
    if (!model.ok()) return ToGrpc(model.status());
    if (!writer->Write((*model)->manifest_message())) return grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
    Status sent = wire::ForEachChunk((*model)->tensors(), (*model)->chunk_bytes(), 0, [&](const v1::TensorChunk& chunk) {
      v1::ModelChunkMessage message;
      *message.mutable_chunk() = chunk;
      if (ctx->IsCancelled() || !writer->Write(message)) return CancelledError("the caller went away");
      return Status::Ok();
    });
    if (!sent.ok()) return grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
    return grpc::Status::OK;
  }

  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    if (Status s = CheckOperator(ctx); !s.ok()) return ToGrpc(s);
    std::vector<v1::WorkerStatus> workers = c_->registry().List();
    const size_t more = AddBounded(workers, response->mutable_workers());
    if (more > 0) ctx->AddTrailingMetadata(wire::kMoreEntriesTrailer, std::to_string(more));
    return grpc::Status::OK;
  }

 private:
  // Every job service call comes from an operator (server/rpc/access_policy.h).
  Status CheckOperator(const grpc::ServerContextBase* ctx) {
    const auto& metadata = ctx->client_metadata();
    const auto it = metadata.find(wire::kAuthorizationHeader);
    std::string authorization;
    if (it != metadata.end()) authorization.assign(it->second.data(), std::min<size_t>(it->second.size(), 2048));
    Status s = c_->access().CheckOperator(Peer(ctx), it != metadata.end() ? &authorization : nullptr);
    if (!s.ok()) refused_operators_.Warn("{} (from {})", s.message(), EscapeUntrusted(ctx->peer()));
    return s;
  }

  Coordinator* c_;
  RefusalLog refused_operators_;
};

}  // namespace

std::unique_ptr<v1::JobService::Service> MakeJobService(Coordinator* coordinator) {
  return std::make_unique<JobServiceImpl>(coordinator);
}


}  // namespace tessera::server
