#include "bench/loadgen/simulated_client.h"

#include "bench/loadgen/client_calls.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <utility>

#include "proto/byte_buffers.h"
#include "proto/task_wire.h"
#include "proto/update_envelope.h"

namespace tessera::loadgen {
namespace {

using client_calls::Clock;
using client_calls::kCallDeadline;
using client_calls::MillisSince;
using client_calls::SetDeadline;

std::string Describe(const grpc::Status& status) {
  static const char* const kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                       "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
                                       "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const int code = static_cast<int>(status.error_code());
  const std::string name = code >= 0 && code <= 16 ? kNames[code] : std::to_string(code);
  return name + ": " + status.error_message();
}

template <typename Request, typename Response>
struct UnaryCall {
  grpc::ClientContext context;
  Request request;
  Response response;
  Clock::time_point started = Clock::now();
};

}  // namespace


void SimulatedClient::Join(bool first) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) {
      if (first) fleet_->FirstJoinAnswered(false);
      return;
    }
  }
  auto call = std::make_shared<UnaryCall<v1::JoinRequest, v1::JoinResponse>>();
  call->request.set_join_token(fleet_->options().join_token);
  call->request.set_name(name_);
  v1::DeviceInfo& device = *call->request.mutable_device();
  device.set_kind("simulated");
  device.set_name("tessera-loadgen client (no device, no training)");
  call->request.set_accepts_inline_model(!fleet_->options().always_download);
  SetDeadline(&call->context, kCallDeadline);
  fleet_->CallStarted();
  stub_->async()->Join(&call->context, &call->request, &call->response, [this, first, call](grpc::Status status) {
    ClientFleet* fleet = fleet_;
    OnJoined(first, status, call->response);
    fleet->CallEnded();
  });
}

void SimulatedClient::OnJoined(bool first, const grpc::Status& status, const v1::JoinResponse& response) {
  if (!status.ok()) {
    const bool for_good = status.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
                          status.error_code() == grpc::StatusCode::INVALID_ARGUMENT;
    fleet_->Add(for_good ? Counter::kJoinRefusals : Counter::kJoinFailures);
    fleet_->RecordError("join: " + Describe(status));
    if (first) fleet_->FirstJoinAnswered(for_good);
    if (!for_good) RejoinLater();
    return;
  }
  fleet_->Add(Counter::kJoins);
  if (first) fleet_->FirstJoinAnswered(false);
  std::shared_ptr<TaskChannelCall> channel;
  uint64_t epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return;
    epoch = ++epoch_;
    worker_id_ = response.worker_id();
    session_ = response.session();
    heartbeat_interval_ms_ = std::max<uint32_t>(100, response.heartbeat_interval_ms());  // as the worker
    upload_admission_ = response.upload_admission();
    upload_connection_min_bytes_ = response.upload_connection_min_bytes();
    upload_xxh3_ = response.upload_xxh3();
    inline_update_max_bytes_ = fleet_->options().always_upload_call ? 0 : response.inline_update_max_bytes();
    backoff_ms_ = kBackoffInitialMs;
    v1::TaskChannelRequest open;
    open.set_worker_id(worker_id_);
    open.set_session(session_);
    channel = std::make_shared<TaskChannelCall>(this, epoch, open, inline_update_max_bytes_ > 0);
    channel_ = channel;
  }
  fleet_->CallStarted();
  channel->Begin(channel);
  Heartbeat(epoch);  // the first beat at once, as the worker sends it
}

void SimulatedClient::Heartbeat(uint64_t epoch) {
  auto call = std::make_shared<UnaryCall<v1::HeartbeatRequest, v1::HeartbeatResponse>>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_ || epoch != epoch_) return;
    call->request.set_worker_id(worker_id_);
    call->request.set_session(session_);
    call->request.set_state(state_);
  }
  SetDeadline(&call->context, kCallDeadline);
  fleet_->CallStarted();
  stub_->async()->Heartbeat(&call->context, &call->request, &call->response, [this, epoch, call](grpc::Status status) {
    ClientFleet* fleet = fleet_;
    if (status.ok()) {
      fleet->Add(Counter::kHeartbeats);
      fleet->Record(Latency::kHeartbeat, MillisSince(call->started));
    } else {
      fleet->Add(Counter::kHeartbeatFailures);
      fleet->RecordError("heartbeat: " + Describe(status));
    }
    std::shared_ptr<TaskChannelCall> channel;
    uint32_t interval = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!cancelled_ && epoch == epoch_) {
        interval = heartbeat_interval_ms_;
        // A refused session ends the session; the channel's end brings a new join.
        if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) channel = channel_;
      }
    }
    if (channel) {
      channel->Cancel();
    } else if (interval > 0) {
      fleet->timers().After(std::chrono::milliseconds(interval), [this, epoch] { Heartbeat(epoch); });
    }
    fleet->CallEnded();
  });
}

void SimulatedClient::RejoinLater() {
  uint32_t backoff = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return;
    backoff = backoff_ms_;
    backoff_ms_ = std::min(backoff_ms_ * 2, kBackoffMaxMs);
  }
  fleet_->timers().After(std::chrono::milliseconds(backoff), [this] { Join(false); });
}

void SimulatedClient::OnChannelOpen(uint64_t epoch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (epoch != epoch_ || channel_ready_) return;
    channel_ready_ = true;
  }
  fleet_->ChannelReadyChanged(+1);
}

void SimulatedClient::OnChannelEnded(uint64_t epoch, const grpc::Status& status) {
  bool was_ready = false;
  bool cancelled = false;
  std::optional<InlineUpload> lost;  // an inline update the session ended under
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (epoch != epoch_) return;
    ++epoch_;  // the session is over: its heartbeats stop
    was_ready = channel_ready_;
    channel_ready_ = false;
    channel_.reset();
    cancelled = cancelled_;
    lost = std::exchange(inline_upload_, std::nullopt);
  }
  if (lost) {
    OnUploaded(lost->work, grpc::Status(grpc::StatusCode::UNAVAILABLE, "the task session ended before the verdict"), {},
               MillisSince(lost->started), lost->failure_report);
  }
  if (was_ready) fleet_->ChannelReadyChanged(-1);
  if (cancelled || fleet_->stopping()) return;
  fleet_->Add(Counter::kChannelDrops);
  fleet_->RecordError("task channel ended: " + (status.ok() ? std::string("closed by the coordinator") : Describe(status)));
  RejoinLater();
}

void SimulatedClient::OnTask(uint64_t epoch, v1::Task task, grpc::ByteBuffer* inline_model) {
  if (task.has_train()) {
    fleet_->Add(Counter::kTrainTasks);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_) return;
      if (busy_) {  // taken when the work in hand ends; a newer task replaces an older one
        if (next_task_) fleet_->Add(Counter::kSupersededTasks);
        next_task_ = std::move(*task.mutable_train());
        next_model_.Clear();
        next_model_.Swap(inline_model);
        return;
      }
      busy_ = true;
    }
    StartWork(std::move(*task.mutable_train()), inline_model);
  } else if (task.has_cancel()) {
    if (task.cancel().round() == 0) return;  // the job ended: a simulated client holds nothing for it
    fleet_->Add(Counter::kCancels);
    std::lock_guard<std::mutex> lock(mu_);
    const auto& cancel = task.cancel();
    // A cancel names its attempt; attempt 0 (an older coordinator) means every attempt.
    auto cancels = [&cancel](const v1::TrainTask& t) {
      return t.job_id() == cancel.job_id() && t.round() == cancel.round() &&
             (cancel.attempt() == 0 || cancel.attempt() == t.attempt());
    };
    if (next_task_ && cancels(*next_task_)) {
      next_task_.reset();
      next_model_.Clear();
    }
    if (busy_ && cancels(task_)) task_cancelled_ = true;
  } else if (task.has_verdict()) {
    const v1::UpdateVerdict& verdict = task.verdict();
    std::optional<InlineUpload> answered;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (inline_upload_ && inline_upload_->job_id == verdict.job_id() && inline_upload_->round == verdict.round() &&
          inline_upload_->attempt == verdict.attempt()) {
        answered = std::exchange(inline_upload_, std::nullopt);
      }
    }
    if (answered) {  // the answer to the update sent inside the session: its upload's result
      v1::UploadResult result;
      result.set_accepted(verdict.accepted());
      result.set_reason(verdict.reason());
      OnUploaded(answered->work, grpc::Status::OK, result, MillisSince(answered->started), answered->failure_report);
      return;
    }
    fleet_->Add(task.verdict().accepted() ? Counter::kVerdictsAccepted : Counter::kVerdictsRefused);
    if (!task.verdict().accepted()) fleet_->RecordError("update refused (verdict): " + task.verdict().reason());
  }
}

void SimulatedClient::StartWork(v1::TrainTask task, grpc::ByteBuffer* inline_model) {
  std::shared_ptr<DownloadCall> download;
  grpc::ByteBuffer model;  // a small model came inside the task: its serialized bytes
  model.Swap(inline_model);
  const bool has_model = model.Valid();
  uint64_t work = 0;
  std::string what;
  uint64_t version = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) {
      busy_ = false;
      return;
    }
    work = ++work_;
    task_ = std::move(task);
    task_cancelled_ = false;
    payload_.reset();
    state_ = "training";
    version = task_.model_version();
    what = "model version " + std::to_string(version) + " of job " + task_.job_id() + " for " + name_;
    if (!has_model) {
      v1::DownloadModelRequest request;
      request.set_worker_id(worker_id_);
      request.set_session(session_);
      request.set_job_id(task_.job_id());
      request.set_model_version(version);
      download = std::make_shared<DownloadCall>(this, work, request, what, fleet_->options().verify_downloads);
      download_ = download;
    }
  }
  if (has_model) {
    DownloadCheck check(what + " (in its task)", version, fleet_->options().verify_downloads);
    const Status checked = check.AddInlineWire(model);
    OnDownloaded(work, grpc::Status::OK, checked, check, 0.0);
    return;
  }
  fleet_->CallStarted();
  download->Begin(download);
}

void SimulatedClient::OnDownloaded(uint64_t work, const grpc::Status& status, const Status& checked,
                                   const DownloadCheck& check, double ms) {
  Status outcome = checked;
  if (outcome.ok() && status.ok()) outcome = check.Finish();
  {
    std::lock_guard<std::mutex> lock(mu_);
    download_.reset();
  }
  if (!status.ok()) {
    // A broken connection or a refused session: the worker logs it and reports nothing.
    fleet_->Add(Counter::kDownloadFailures);
    fleet_->RecordError("download: " + Describe(status));
    FinishWork(work);
    return;
  }
  if (!outcome.ok()) {
    fleet_->Add(Counter::kDownloadFailures);
    fleet_->RecordError("download: " + outcome.ToString());
    v1::TrainTask task;
    {
      std::lock_guard<std::mutex> lock(mu_);
      task = task_;
    }
    ReportFailure(task, work, outcome.ToString());
    return;
  }
  fleet_->Add(Counter::kDownloads);
  fleet_->Add(Counter::kBytesDownloaded, check.bytes_received());
  fleet_->Record(Latency::kDownload, ms);
  bool xxh3 = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    xxh3 = upload_xxh3_;
  }
  auto payload = fleet_->payloads().For(check.manifest(), work + std::hash<std::string>()(name_),
                                        xxh3 ? wire::UpdateDigest::kXxh3 : wire::UpdateDigest::kSha256);
  if (!payload.ok()) {
    fleet_->RecordError("building the update: " + payload.status().ToString());
    v1::TrainTask task;
    {
      std::lock_guard<std::mutex> lock(mu_);
      task = task_;
    }
    ReportFailure(task, work, payload.status().ToString());
    return;
  }
  const uint32_t compute_ms = fleet_->options().compute_ms;
  {
    std::lock_guard<std::mutex> lock(mu_);
    download_ms_ = ms;
    payload_ = *payload;
    compute_start_ = Clock::now();
  }
  if (compute_ms == 0) {
    Upload(work);
  } else {
    fleet_->timers().After(std::chrono::milliseconds(compute_ms), [this, work] { Upload(work); });
  }
}

v1::UpdateChunkMessage SimulatedClient::HeaderFor(const v1::TrainTask& task) {
  v1::UpdateChunkMessage message;
  wire::IdentifyUpdate(task, worker_id_, session_, message.mutable_header());
  message.mutable_header()->set_trained_weights(fleet_->options().trained_weights && task.takes_trained_weights());
  return message;
}

void SimulatedClient::Upload(uint64_t work) {
  std::shared_ptr<UploadCall> upload;
  bool own_connection = false;
  std::shared_ptr<TaskChannelCall> session;
  std::optional<grpc::ByteBuffer> inline_message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (work != work_) return;
    if (cancelled_ || task_cancelled_) {
      if (!cancelled_) fleet_->Add(Counter::kUploadsSkipped);
    } else {
      v1::UpdateChunkMessage message = HeaderFor(task_);
      v1::UpdateHeader& header = *message.mutable_header();
      header.set_samples(fleet_->options().samples);
      header.set_compute_ms(MillisSince(compute_start_));
      header.set_download_ms(download_ms_);
      header.set_train_loss(0);
      *header.mutable_manifest() = payload_->manifest;
      state_ = "uploading";
      inline_message = InlineUpdateLocked(work, message, payload_.get());
      if (inline_message) session = channel_;
      own_connection = upload_connection_min_bytes_ > 0 && payload_->bytes >= upload_connection_min_bytes_;
      if (!inline_message) {
        upload = std::make_shared<UploadCall>(this, work, std::move(message), payload_, upload_admission_);
        upload_ = upload;
      }
    }
  }
  if (session) {  // started outside the lock: gRPC may complete the write on this thread
    session->Send(std::move(*inline_message));
    return;
  }
  if (!upload) {
    FinishWork(work);
    return;
  }
  if (own_connection) upload->OnItsOwnConnection(fleet_->NewChannel());
  fleet_->CallStarted();
  upload->Begin(upload);
}

std::optional<grpc::ByteBuffer> SimulatedClient::InlineUpdateLocked(uint64_t work, const v1::UpdateChunkMessage& header,
                                                                     const UpdatePayload* payload) {
  if (!channel_ || !channel_->session()) return std::nullopt;
  // The header's message and the payload's chunk messages, shared (wire::SessionUpdateMessage).
  grpc::ByteBuffer head;
  if (!wire::ToByteBuffer(header, &head)) return std::nullopt;
  grpc::ByteBuffer message =
      payload ? wire::SessionUpdateMessage(head, payload->wire_chunks) : wire::SessionUpdateMessage(head, {});
  if (message.Length() > inline_update_max_bytes_) return std::nullopt;
  const v1::UpdateHeader& h = header.header();
  inline_upload_ = InlineUpload{work, h.job_id(), h.round(), h.attempt(), Clock::now(), payload == nullptr};
  if (payload) fleet_->Add(Counter::kBytesUploaded, payload->bytes);
  return message;
}

void SimulatedClient::ReportFailure(const v1::TrainTask& task, uint64_t work, const std::string& why) {
  std::shared_ptr<UploadCall> upload;
  std::shared_ptr<TaskChannelCall> session;
  std::optional<grpc::ByteBuffer> inline_message;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!cancelled_) {
      v1::UpdateChunkMessage message = HeaderFor(task);
      message.mutable_header()->set_failure(why);
      inline_message = InlineUpdateLocked(work, message, nullptr);
      if (inline_message) {
        session = channel_;
      } else {
        upload = std::make_shared<UploadCall>(this, work, std::move(message), nullptr, false);
        upload_ = upload;
      }
    }
  }
  if (session) {
    fleet_->Add(Counter::kFailuresReported);
    session->Send(std::move(*inline_message));
    return;
  }
  if (!upload) {
    FinishWork(work);
    return;
  }
  fleet_->Add(Counter::kFailuresReported);
  fleet_->CallStarted();
  upload->Begin(upload);
}

void SimulatedClient::OnUploaded(uint64_t work, const grpc::Status& status, const v1::UploadResult& result, double ms,
                                 bool failure_report) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    upload_.reset();
  }
  if (!failure_report) {
    if (!status.ok()) {
      fleet_->Add(Counter::kUploadFailures);
      fleet_->RecordError("upload: " + Describe(status));
    } else if (!result.accepted()) {
      fleet_->Add(Counter::kUploadsRefused);
      fleet_->RecordError("upload refused: " + result.reason());
    } else {
      fleet_->Add(Counter::kUploadsAccepted);
      fleet_->Record(Latency::kUpload, ms);
    }
  } else if (!status.ok()) {
    fleet_->RecordError("failure report: " + Describe(status));
  }
  FinishWork(work);
}

void SimulatedClient::FinishWork(uint64_t work) {
  std::optional<v1::TrainTask> next;
  grpc::ByteBuffer next_model;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (work != work_) return;
    state_ = "idle";
    payload_.reset();
    next = std::move(next_task_);
    next_task_.reset();
    next_model.Swap(&next_model_);
    busy_ = next.has_value() && !cancelled_;
    if (!busy_) return;
  }
  StartWork(std::move(*next), &next_model);
}

void SimulatedClient::Cancel() {
  std::shared_ptr<TaskChannelCall> channel;
  std::shared_ptr<DownloadCall> download;
  std::shared_ptr<UploadCall> upload;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    channel = channel_;
    download = download_;
    upload = upload_;
  }
  if (channel) channel->Cancel();
  if (download) download->Cancel();
  if (upload) upload->Cancel();
}

}  // namespace tessera::loadgen
