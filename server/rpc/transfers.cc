#include "server/rpc/transfers.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "base/escape.h"
#include "proto/byte_buffers.h"
#include "proto/grpc_status.h"
#include "proto/tensor_transfer.h"
#include "proto/update_chunk_reader.h"
#include "server/coordinator.h"
#include "server/monitoring/coordinator_metrics.h"

namespace tessera::server {
namespace {

using wire::ToGrpc;

// One model download, written from the version's pre-built messages: the manifest, then
// every chunk, each write started when the previous one completes. No thread waits on a
// slow worker, and no download hashes or copies the model again.
class DownloadReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `admitted`: the caller's credential and the request's fields, checked by the service.
  DownloadReactor(Coordinator* c, grpc::CallbackServerContext* ctx, const v1::DownloadModelRequest& request,
                  const Status& admitted, std::unique_ptr<StreamCounter::Slot> slot)
      : ctx_(ctx), worker_id_(request.worker_id()), resume_offset_(request.resume_offset()), slot_(std::move(slot)) {
    if (!admitted.ok()) {
      Finish(ToGrpc(admitted));
      return;
    }
    if (Status s = c->registry().Authenticate(request.worker_id(), request.session()); !s.ok()) {
      Finish(ToGrpc(s));
      return;
    }
    runner_ = c->Runner(request.job_id());
    if (!runner_) {
      Finish(ToGrpc(NotFoundError("job '" + request.job_id().substr(0, 64) + "' is not running on this coordinator")));
      return;
    }
    // Only a participant of the open round, for that round's model.
    const std::string what = "download of model version " + std::to_string(request.model_version()) + " of job " +
                             request.job_id();
    auto open = runner_->SelectedRound(worker_id_, what);
    if (!open.ok()) {
      Finish(ToGrpc(open.status()));
      return;
    }
    if (open->model_version != request.model_version()) {
      Finish(ToGrpc(PermissionDeniedError(what + " refused for worker '" + worker_id_ + "': its round " +
                                          std::to_string(open->round) + " trains model version " +
                                          std::to_string(open->model_version))));
      return;
    }
    auto model = runner_->Model(request.model_version(), worker_id_);
    if (!model.ok()) {
      Finish(ToGrpc(model.status()));
      return;
    }
    model_ = std::move(model).value();
    auto plan = model_->PlanDownload(request.resume_offset());
    if (!plan.ok()) {
      Finish(ToGrpc(plan.status()));
      return;
    }
    plan_ = std::move(plan).value();
    next_ = plan_.first_chunk;
    open_ = *open;
    what_ = what;
    job_id_ = request.job_id();
    const StreamLimits& limits = c->options().streams;
    // A write the worker does not take for the idle timeout ends the download: the worker is
    // not reading, so the call is cancelled as well as finished.
    deadline_ = StreamDeadline::Create("download by worker '" + worker_id_ + "'", limits.idle_timeout,
                                                 limits.transfer_timeout, "transfer timeout (transfer_timeout)",
                                                 [this](const Status& why) { Expire(why); });
    deadline_->Cap(open->deadline, "job " + request.job_id() + " round " + std::to_string(open->round) + " attempt " +
                                       std::to_string(open->attempt) + " reached its deadline");
    c->watchdog().Watch(deadline_);
    // (Not with WriteOptions::set_buffer_hint(), to send the manifest with the first chunk:
    // gRPC then completes the write only when something else flushes it, seconds later.)
    StartWrite(&model_->wire_manifest());
  }

  void OnWriteDone(bool ok) override {
    if (deadline_->finish_claimed()) return;  // the watchdog ended it
    deadline_->Progress();
    if (!ok) {
      End(ToGrpc(CancelledError("the worker went away mid-download")));
      return;
    }
    // A round that has ended (committed, failed, cancelled, or closed to this worker) takes
    // no update from it: the download stops at this chunk boundary, and its model goes.
    if (Status open = StillOpen(); !open.ok()) {
      End(ToGrpc(open));
      return;
    }
    const grpc::ByteBuffer* message = nullptr;
    if (plan_.first_partial) {
      partial_ = std::move(plan_.first_partial);
      message = partial_.get();
    } else if (next_ < model_->wire_chunks().size()) {
      message = &model_->wire_chunks()[next_++];
    }
    if (message != nullptr) {
      StartWrite(message);
      return;
    }
    // Every byte taken by the transport. (Not StartWriteAndFinish with the last chunk: the
    // watchdog could then no longer end a download whose worker stopped reading.)
    const uint64_t sent = model_->total_bytes() - std::min<uint64_t>(resume_offset_, model_->total_bytes());
    runner_->RecordDownload(worker_id_, model_->version(), sent);
    RecordDownloadBytes(worker_id_, sent);
    End(grpc::Status::OK);
  }

  void OnDone() override { delete this; }

 private:
  void End(const grpc::Status& status) {
    if (deadline_->ClaimFinish()) Finish(status);
  }

  // FAILED_PRECONDITION, as for an update that comes after its round closed, unless the
  // worker still takes part in the round the download started in.
  Status StillOpen() const {
    auto now = runner_->SelectedRound(worker_id_, what_);
    if (now.ok() && now->round == open_.round && now->attempt == open_.attempt &&
        now->model_version == open_.model_version) {
      return Status::Ok();
    }
    return FailedPreconditionError(what_ + " by worker '" + worker_id_ + "' stopped: job " + job_id_ + " round " +
                                   std::to_string(open_.round) + " attempt " + std::to_string(open_.attempt) +
                                   " has ended for this worker");
  }

  // On the watchdog's thread, which has claimed the finish; a write is in flight.
  void Expire(const Status& why) {
    spdlog::warn("ended {}", why.message());
    ctx_->TryCancel();
    Finish(ToGrpc(why));
  }

  grpc::CallbackServerContext* const ctx_;
  const std::string worker_id_;
  const uint64_t resume_offset_;  // bytes the worker held already: not sent again
  const std::unique_ptr<StreamCounter::Slot> slot_;
  std::shared_ptr<JobRunner> runner_;
  std::shared_ptr<const ModelVersion> model_;  // kept alive until the download ends
  ModelVersion::Plan plan_;
  std::unique_ptr<grpc::ByteBuffer> partial_;  // the resumed first chunk, while it is written
  size_t next_ = 0;
  JobRunner::OpenRound open_;  // the round the download serves
  std::string what_;           // "download of model version 3 of job J"
  std::string job_id_;
  std::shared_ptr<StreamDeadline> deadline_;  // set once the download starts writing
};

// One upload, read with the callback API: each chunk is checked and placed as it arrives, on
// whichever thread completed the read; no thread waits for a slow worker's next chunk. The
// header is checked before any tensor bytes are taken (UpdateIntake, update_intake.h); the
// verdict goes back in the reply and, for a refusal, down the worker's task channel.
class UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  // `slot`: this upload's place among the coordinator's open streams, or why it has none.
  UploadReactor(Coordinator* c, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response, UploadChecks checks,
                const std::string& caller, Result<std::unique_ptr<StreamCounter::Slot>> slot)
      : c_(c), ctx_(ctx), response_(response), refused_(checks.refused), intake_(c, std::move(checks), "call"),
        start_(std::chrono::steady_clock::now()) {
    const StreamLimits& limits = c->options().streams;
    deadline_ = StreamDeadline::Create("upload from " + caller, limits.idle_timeout, limits.transfer_timeout,
                                                 "transfer timeout (transfer_timeout)",
                                                 [this](const Status& why) { Expire(why); });
    if (!slot.ok()) {
      refused_(slot.status().message());
      End(ToGrpc(slot.status()));
      return;
    }
    slot_ = std::move(slot).value();
    c->watchdog().Watch(deadline_);
    StartRead(&raw_);
  }

  void OnReadDone(bool ok) override {
    if (deadline_->finish_claimed()) return;  // the watchdog ended it
    deadline_->Progress();
    if (!have_header_) {
      v1::UpdateChunkMessage first;
      if (!ok || !wire::FromByteBuffer(raw_, &first) || !first.has_header()) {
        End(ToGrpc(InvalidArgumentError("an upload must start with its header")));
        return;
      }
      have_header_ = true;
      // A newer upload of the same update ends this one (UpdatesInFlight): the call is
      // cancelled, and the read in flight, or the wait for memory, ends with it.
      auto superseded = [this] {
        superseded_ = true;
        ctx_->TryCancel();
      };
      if (auto answer = intake_.Admit(std::move(*first.mutable_header()), superseded)) {
        Reply(*answer);
        return;
      }
      admitted_ = true;
      const v1::UpdateHeader& header = intake_.header();
      deadline_->Rename("upload from worker '" + header.worker_id() + "'");
      // A selected worker's upload ends at its round's deadline, buffers and all.
      if (auto open = intake_.runner()->SelectedRound(header.worker_id(), "upload"); open.ok()) {
        deadline_->Cap(open->deadline, "job " + header.job_id() + " round " + std::to_string(open->round) +
                                           " attempt " + std::to_string(open->attempt) + " reached its deadline");
        c_->watchdog().Watch(deadline_);  // looked at again by then
      }
      // Nothing more is read until the upload's bytes fit the coordinator's budget; the
      // watchdog leaves it alone meanwhile (the wait is not the worker's doing). Workers
      // wait for the initial metadata sent at the grant before sending their tensors
      // (JoinResponse.upload_admission), so a waiting update holds no receive buffers here.
      if (!deadline_->Hold()) return;  // the watchdog has just ended it
      c_->upload_budget().Acquire(intake_.budget_bytes(), [this] { Granted(); });
      return;
    }
    if (!ok) {  // the worker has sent everything, or the call went away
      // The finish is claimed before the update is judged: a deadline that passes while it is
      // checked and folded must not answer DEADLINE_EXCEEDED for an update the round took (the
      // worker would count it as not taken, and its error feedback would send it again).
      if (!deadline_->ClaimFinish()) return;  // the watchdog ended it first
      judged_ = true;
      // The worker cancelled the call or its connection broke (gRPC says so on the failed
      // read), or a newer upload replaced this one: the update is not judged. The worker may
      // send it again (on its own connection's failure it does, on its main one), and a
      // refusal now would have its round refuse that too.
      if (superseded_ || ctx_->IsCancelled()) {
        FinishClaimed(ToGrpc(CancelledError(intake_.what() + ": the upload ended before its last chunk" +
                                            (superseded_ ? ", replaced by a newer upload of it" : ""))));
        return;
      }
      const UpdateIntake::Answer answer = intake_.Complete(start_);
      result_ = answer.result;
      FinishClaimed(answer.status);
      return;
    }
    // Read from the transport's slices into the update's tensors.
    Status added = wire::AddChunkMessage(raw_, intake_.assembler(), intake_.what());
    raw_.Clear();
    if (!added.ok()) {
      judged_ = true;
      Reply(intake_.Reject(added));
      return;
    }
    StartRead(&raw_);
  }

  // A cancel while waiting for the budget is handled when the budget is granted (the grant
  // holds this reactor); in every other state a read in flight fails and says so.
  void OnCancel() override { cancelled_ = true; }

  void OnDone() override {
    // An admitted update whose upload the watchdog ended is refused in its job as any
    // incomplete one is: its worker does not send it again, and its round must not wait for it
    // until the deadline. (Here rather than on the watchdog's thread, which must not block.)
    intake_.ReleaseClaim();  // first: a newer upload no longer ends this one
    if (expired_ && admitted_ && !judged_ && !superseded_) intake_.Reject(*expired_);
    intake_.Abandon();
    if (holding_budget_) c_->upload_budget().Release(intake_.budget_bytes());
    delete this;
  }

 private:
  // The upload's bytes are reserved: its buffers may be allocated and its chunks read. The
  // watchdog is held until the admission and the read are started: its Finish() sends the
  // initial metadata when none was sent, and gRPC aborts the process when it is started again.
  void Granted() {
    holding_budget_ = true;
    deadline_->Progress();  // the wait was not the worker's doing
    if (cancelled_) {
      End(ToGrpc(CancelledError("the worker went away while its upload waited for memory")));
      return;
    }
    if (auto expired = deadline_->Expired()) {
      End(ToGrpc(*expired));
      return;
    }
    // Kept here: once the read is started, the reactor may finish and be gone.
    const std::shared_ptr<StreamDeadline> deadline = deadline_;
    // The admission: a worker told of it at join sends no chunk before this metadata.
    StartSendInitialMetadata();
    StartRead(&raw_);
    deadline->Release();
  }

  // The intake's answer ends the call: its status, or its result in the reply.
  void Reply(const UpdateIntake::Answer& answer) {
    result_ = answer.result;
    End(answer.status);
  }

  // Every end but the watchdog's goes through here: the stream is finished once, its
  // result written to the reply when it ends OK.
  void End(const grpc::Status& status) {
    if (deadline_->ClaimFinish()) FinishClaimed(status);
  }

  // The end, once this reactor holds the right to finish: the result in the reply when OK.
  void FinishClaimed(const grpc::Status& status) {
    if (status.ok()) {
      grpc::ByteBuffer reply;
      if (!wire::ToByteBuffer(result_, &reply)) {
        Finish(grpc::Status(grpc::StatusCode::INTERNAL, "the upload's result could not be serialized"));
        return;
      }
      response_->Swap(&reply);
    }
    Finish(status);
  }

  // On the watchdog's thread, which has claimed the finish; a read is in flight, and fails
  // once the status is sent.
  void Expire(const Status& why) {
    expired_ = why;  // read in OnDone, which follows Finish()
    if (!admitted_) refused_(why.message());  // an admitted update's refusal is its job's to log
    Finish(ToGrpc(why));
  }

  Coordinator* const c_;
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer* const response_;  // the serialized UploadResult, once it ends OK
  v1::UploadResult result_;
  const std::function<void(const std::string&)> refused_;
  UpdateIntake intake_;
  const std::chrono::steady_clock::time_point start_;
  grpc::ByteBuffer raw_;  // the message being read
  bool have_header_ = false;
  std::atomic<bool> admitted_{false};  // the header was admitted: the job knows of the update
  bool judged_ = false;                // the reactor itself ended the update (judged or not)
  std::optional<Status> expired_;      // why the watchdog ended the upload, if it did
  bool holding_budget_ = false;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> superseded_{false};  // a newer upload of the update ended this one
  std::unique_ptr<StreamCounter::Slot> slot_;
  std::shared_ptr<StreamDeadline> deadline_;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartDownload(Coordinator* c, grpc::CallbackServerContext* ctx,
                                                          const v1::DownloadModelRequest& request,
                                                          const Status& admitted,
                                                          std::unique_ptr<StreamCounter::Slot> slot) {
  return new DownloadReactor(c, ctx, request, admitted, std::move(slot));
}

grpc::ServerReadReactor<grpc::ByteBuffer>* StartUpload(Coordinator* c, grpc::CallbackServerContext* ctx,
                                                      grpc::ByteBuffer* response, UploadChecks checks,
                                                      const std::string& caller,
                                                      Result<std::unique_ptr<StreamCounter::Slot>> slot) {
  return new UploadReactor(c, ctx, response, std::move(checks), caller, std::move(slot));
}

}  // namespace tessera::server
