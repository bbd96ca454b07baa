#include "server/rpc/transfers.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "base/escape.h"
#include "proto/byte_buffers.h"
#include "proto/grpc_status.h"
#include "proto/tensor_transfer.h"
#include "proto/update_assembler.h"
#include "proto/update_chunk_reader.h"
#include "proto/update_envelope.h"
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
  std::shared_ptr<StreamDeadline> deadline_;  // set once the download starts writing
};

// One upload, read with the callback API: each chunk is checked and placed as it arrives, on
// whichever thread completed the read; no thread waits for a slow worker's next chunk. The
// header is checked before any tensor bytes are taken; the verdict goes back in the reply
// and down the worker's task channel.
class UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  // `slot`: this upload's place among the coordinator's open streams, or why it has none.
  UploadReactor(Coordinator* c, grpc::ByteBuffer* response, UploadChecks checks, const std::string& caller,
                Result<std::unique_ptr<StreamCounter::Slot>> slot)
      : c_(c), response_(response), checks_(std::move(checks)), start_(std::chrono::steady_clock::now()) {
    const StreamLimits& limits = c->options().streams;
    deadline_ = StreamDeadline::Create("upload from " + caller, limits.idle_timeout, limits.transfer_timeout,
                                                 "transfer timeout (transfer_timeout)",
                                                 [this](const Status& why) { Expire(why); });
    if (!slot.ok()) {
      checks_.refused(slot.status().message());
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
      header_ = std::move(*first.mutable_header());
      if (!Admit()) return;
      // Nothing more is read until the upload's bytes fit the coordinator's budget; the
      // watchdog leaves it alone meanwhile (the wait is not the worker's doing). Workers
      // wait for the initial metadata sent at the grant before sending their tensors
      // (JoinResponse.upload_admission), so a waiting update holds no receive buffers here.
      if (!deadline_->Hold()) return;  // the watchdog has just ended it
      c_->upload_budget().Acquire(budget_bytes_, [this] { Granted(); });
      return;
    }
    if (!ok) {  // the worker has sent everything
      Complete();
      return;
    }
    // Read from the transport's slices into the update's tensors.
    Status added = wire::AddChunkMessage(raw_, *assembler_, what_);
    raw_.Clear();
    if (!added.ok()) {
      runner_->RejectUpload(header_, added);
      Refuse(added);
      return;
    }
    StartRead(&raw_);
  }

  // A cancel while waiting for the budget is handled when the budget is granted (the grant
  // holds this reactor); in every other state a read in flight fails and says so.
  void OnCancel() override { cancelled_ = true; }

  void OnDone() override {
    assembler_.reset();
    if (holding_budget_) c_->upload_budget().Release(budget_bytes_);
    delete this;
  }

 private:
  // Checks the header; false when the upload has been answered already.
  bool Admit() {
    Status checked = checks_.header(header_);
    if (checked.ok()) checked = c_->registry().Authenticate(header_.worker_id(), header_.session());
    if (!checked.ok()) {
      End(ToGrpc(checked));
      return false;
    }
    deadline_->Rename("upload from worker '" + header_.worker_id() + "'");
    header_.set_failure(EscapeUntrusted(header_.failure(), 512));  // kept in the round's record
    runner_ = c_->Runner(header_.job_id());
    if (!runner_) {
      Refuse(NotFoundError("job '" + header_.job_id() + "' is not running on this coordinator"));
      return false;
    }
    // Refuse early, before reading the tensors, when the header alone disqualifies it.
    if (Status admitted = runner_->AdmitUpload(header_); !admitted.ok()) {
      if (admitted.code() == StatusCode::kInvalidArgument) {
        runner_->RejectUpload(header_, admitted);  // a selected worker's malformed update
      } else {
        checks_.refused(admitted.message());
        // An update that crossed its worker's cancel as over-selected is late by design, not
        // the worker's fault: it is refused without counting against the worker.
        if (!runner_->CancelledAsOverSelected(header_)) c_->registry().RecordRound(header_.worker_id(), false);
      }
      Refuse(admitted);
      return false;
    }
    if (!header_.failure().empty()) {
      Status noted = runner_->ReportFailure(header_);
      result_.set_accepted(noted.ok());
      result_.set_reason(noted.ok() ? "failure noted" : noted.message());
      End(grpc::Status::OK);
      return false;
    }
    // A selected worker's upload ends at its round's deadline, buffers and all.
    if (auto open = runner_->SelectedRound(header_.worker_id(), "upload"); open.ok()) {
      deadline_->Cap(open->deadline, "job " + header_.job_id() + " round " + std::to_string(open->round) +
                                         " attempt " + std::to_string(open->attempt) + " reached its deadline");
      c_->watchdog().Watch(deadline_);  // looked at again by then
    }
    what_ = "update from worker '" + header_.worker_id() + "' for job " + header_.job_id() + " round " +
            std::to_string(header_.round());
    auto sets = wire::UpdateSets(header_, what_);  // checked by AdmitUpload already
    if (!sets.ok()) {
      runner_->RejectUpload(header_, sets.status());
      Refuse(sets.status());
      return false;
    }
    // Each set is checked against its encoding's sizes now; its tensors take memory only as
    // their chunks arrive, decoded to float32.
    const double topk_fraction = runner_->DeltaEncoding().second;
    assembler_ = std::make_unique<wire::UpdateAssembler>(what_, runner_->update_bytes(), topk_fraction,
                                                         &runner_->update_buffers());
    if (Status started = assembler_->Start(*sets); !started.ok()) {
      runner_->RejectUpload(header_, started);
      Refuse(started);
      return false;
    }
    budget_bytes_ = std::min<uint64_t>(assembler_->decoded_bytes(), runner_->update_bytes());
    return true;
  }

  // The upload's bytes are reserved: its buffers may be allocated and its chunks read.
  void Granted() {
    holding_budget_ = true;
    deadline_->Release();
    if (cancelled_) {
      End(ToGrpc(CancelledError("the worker went away while its upload waited for memory")));
      return;
    }
    if (auto expired = deadline_->Expired(std::chrono::steady_clock::now())) {
      End(ToGrpc(*expired));
      return;
    }
    // The admission: a worker told of it at join sends no chunk before this metadata.
    StartSendInitialMetadata();
    StartRead(&raw_);
  }

  void Complete() {
    const uint64_t received = assembler_->bytes_received();
    RecordUploadBytes(header_.worker_id(), received);
    auto decoded = assembler_->Finish();
    const double upload_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
    if (!decoded.ok()) {
      runner_->RejectUpload(header_, decoded.status());
      Refuse(decoded.status());
      return;
    }
    std::map<std::string, TensorSet> sets = std::move(decoded).value();
    TensorSet delta = std::move(sets[wire::kDeltaSet]);
    sets.erase(wire::kDeltaSet);
    Status verdict = runner_->SubmitUpdate(header_, delta, upload_ms, sets, received);
    // Folded (or refused): the tensors' buffers serve the next uploads of the job.
    runner_->update_buffers().Give(std::move(delta));
    for (auto& [name, set] : sets) runner_->update_buffers().Give(std::move(set));
    if (!verdict.ok()) {
      Refuse(verdict);
      return;
    }
    result_.set_accepted(true);
    End(grpc::Status::OK);
  }

  // Every end but the watchdog's goes through here: the stream is finished once, its
  // result written to the reply when it ends OK.
  void End(const grpc::Status& status) {
    if (!deadline_->ClaimFinish()) return;
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
    checks_.refused(why.message());
    Finish(ToGrpc(why));
  }

  // The update is refused: the reply says why, and so does the worker's task channel.
  void Refuse(const Status& why) {
    result_.set_accepted(false);
    result_.set_reason(why.message());
    v1::Task verdict;
    verdict.mutable_verdict()->set_job_id(header_.job_id());
    verdict.mutable_verdict()->set_round(header_.round());
    verdict.mutable_verdict()->set_attempt(header_.attempt());
    verdict.mutable_verdict()->set_accepted(false);
    verdict.mutable_verdict()->set_reason(why.message());
    c_->registry().Send(header_.worker_id(), std::move(verdict)).ok();
    End(grpc::Status::OK);
  }

  Coordinator* const c_;
  grpc::ByteBuffer* const response_;  // the serialized UploadResult, once it ends OK
  v1::UploadResult result_;
  const UploadChecks checks_;
  const std::chrono::steady_clock::time_point start_;
  grpc::ByteBuffer raw_;  // the message being read
  bool have_header_ = false;
  v1::UpdateHeader header_;
  std::shared_ptr<JobRunner> runner_;
  std::string what_;
  uint64_t budget_bytes_ = 0;            // taken from the upload budget once granted
  bool holding_budget_ = false;
  std::atomic<bool> cancelled_{false};
  std::unique_ptr<wire::UpdateAssembler> assembler_;  // started once the header is admitted
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

grpc::ServerReadReactor<grpc::ByteBuffer>* StartUpload(Coordinator* c, grpc::ByteBuffer* response, UploadChecks checks,
                                                      const std::string& caller,
                                                      Result<std::unique_ptr<StreamCounter::Slot>> slot) {
  return new UploadReactor(c, response, std::move(checks), caller, std::move(slot));
}

}  // namespace tessera::server
