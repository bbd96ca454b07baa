#include "worker/coordinator_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "proto/byte_buffers.h"
#include "proto/grpc_status.h"
#include "proto/tensor_transfer.h"
#include "proto/update_chunk_reader.h"
#include "tessera/v1/worker_service.grpc.pb.h"
#include "worker/cancelled_task.h"
#include "worker/round_deadline.h"

namespace tessera::worker {
namespace {

using wire::FromGrpc;

constexpr auto kCallDeadline = std::chrono::seconds(10);
// WorkerService.DownloadModel's full name, for reading its messages raw.
constexpr char kDownloadModelMethod[] = "/tessera.v1.WorkerService/DownloadModel";
constexpr char kUploadUpdateMethod[] = "/tessera.v1.WorkerService/UploadUpdate";

void SetDeadline(grpc::ClientContext* ctx, std::chrono::system_clock::duration d) {
  ctx->set_deadline(std::chrono::system_clock::now() + d);
}

class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  GrpcCoordinatorClient(const std::string& address, const wire::ClientTls& tls, std::shared_ptr<grpc::Channel> channel,
                        GrpcClientOptions options)
      : address_(address),
        tls_(tls),
        options_(options),
        channel_(std::move(channel)),
        stub_(v1::WorkerService::NewStub(channel_)),
        download_method_(kDownloadModelMethod, grpc::internal::RpcMethod::SERVER_STREAMING, channel_) {}

  static grpc::ChannelArguments Arguments() {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(2 << 20);
    // Reconnect quickly after the coordinator comes back.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    // A ping every 10 s; the connection is given up when the answer (or the acknowledgement of
    // data sent) takes over 20 s: gRPC also makes this the socket's TCP_USER_TIMEOUT, and a
    // coordinator busy with a hundred 10 MiB uploads can leave a socket unread for seconds.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    return args;
  }

  Result<v1::JoinResponse> Join(const v1::JoinRequest& request) override {
    {
      // A cancel that found no channel open was for the session that has ended (a heartbeat
      // refused as its channel closed): the new session's channel starts uncancelled. A
      // stopping worker sees its stop after the join instead.
      std::lock_guard<std::mutex> lock(mu_);
      cancel_pending_ = false;
      // The same goes for the tasks it cancelled: a restarted coordinator resumes a round under
      // the same attempt, and hands its task out again to the new session.
      cancelled_uploads_.clear();
    }
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kCallDeadline);
    v1::JoinResponse response;
    grpc::Status s = stub_->Join(&ctx, request, &response);
    if (!s.ok()) return FromGrpc(s, "join " + address_);
    upload_admission_ = response.upload_admission();
    upload_connection_min_bytes_ = response.upload_connection_min_bytes();
    // Bounded here: a coordinator's offer past what a receiver takes in one message would have
    // any update sent as one (see kMaxInlineUpdateBytes).
    inline_update_max_bytes_ = std::min(response.inline_update_max_bytes(), kMaxInlineUpdateBytes);
    return response;
  }

  Status Heartbeat(const v1::HeartbeatRequest& request) override {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kCallDeadline);
    v1::HeartbeatResponse response;
    return FromGrpc(stub_->Heartbeat(&ctx, request, &response), "heartbeat");
  }

  // A task session when the coordinator takes inline updates (JoinResponse.
  // inline_update_max_bytes), else a task channel. A session's verdicts for the update in
  // flight (UploadUpdate) are that call's answer, not tasks. A coordinator that offers inline
  // updates but answers the session UNIMPLEMENTED gets a task channel in its place: ending the
  // call would have the worker join again, be offered the same, and never keep a session.
  Status RunTaskChannel(const v1::TaskChannelRequest& request,
                        const std::function<void(const v1::Task&)>& on_task) override {
    auto ctx = std::make_shared<grpc::ClientContext>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      channel_ctx_ = ctx;
      channel_cancelled_ = false;
      // A cancel that came before the channel was open (a stop between join and this call)
      // still ends it: the call starts cancelled and returns at once.
      if (cancel_pending_) {
        cancel_pending_ = false;
        channel_cancelled_ = true;
        ctx->TryCancel();
      }
    }
    grpc::Status s;
    bool plain = inline_update_max_bytes_.load() == 0;
    if (!plain) {
      bool stood = false;
      s = RunTaskSession(ctx, request, on_task, &stood);
      if (!stood && s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
        if (!session_refusal_logged_.exchange(true)) {
          spdlog::warn("the coordinator at {} offers inline updates but does not serve task sessions ({}): tasks come "
                       "by a task channel and every update by an upload call", address_,
                       FromGrpc(s, "task session").ToString());
        }
        ctx = std::make_shared<grpc::ClientContext>();
        std::lock_guard<std::mutex> lock(mu_);
        channel_ctx_ = ctx;
        if (channel_cancelled_) ctx->TryCancel();  // a cancel of the session ends its stand-in too
        plain = true;
      } else if (stood) {
        session_refusal_logged_ = false;  // a coordinator that stops serving them is told of again
      }
    }
    if (plain) {
      auto reader = stub_->OpenTaskChannel(ctx.get(), request);
      v1::Task task;
      while (reader->Read(&task)) on_task(task);
      s = reader->Finish();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      channel_ctx_.reset();
    }
    if (s.ok()) return UnavailableError("task channel closed by the coordinator");
    return FromGrpc(s, "task channel");
  }

  Status StoreSet(const v1::StoreRequest& request) override {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kCallDeadline);
    v1::StoreResponse response;
    return FromGrpc(stub_->StoreSet(&ctx, request, &response), "store set '" + request.key() + "'");
  }

  Result<std::string> StoreGet(const v1::StoreRequest& request) override {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kCallDeadline + std::chrono::milliseconds(request.wait_ms()));
    v1::StoreResponse response;
    grpc::Status s = stub_->StoreGet(&ctx, request, &response);
    if (!s.ok()) return FromGrpc(s, "store get '" + request.key() + "'");
    return response.value();
  }

  Result<int64_t> StoreAdd(const v1::StoreRequest& request) override {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kCallDeadline);
    v1::StoreResponse response;
    grpc::Status s = stub_->StoreAdd(&ctx, request, &response);
    if (!s.ok()) return FromGrpc(s, "store add '" + request.key() + "'");
    return response.counter();
  }

  void CancelTaskChannel() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (channel_ctx_) {
      channel_cancelled_ = true;
      channel_ctx_->TryCancel();
    } else {
      cancel_pending_ = true;  // for the channel about to open
    }
  }

  void CancelTransfers() override {
    std::lock_guard<std::mutex> lock(mu_);
    transfers_cancelled_ = true;
    for (grpc::ClientContext* ctx : transfers_) ctx->TryCancel();
  }

  void CancelUpload(const std::string& job_id, uint32_t round, uint32_t attempt) override {
    std::lock_guard<std::mutex> lock(mu_);
    const CancelledTask cancel{job_id, round, attempt};
    // Remembered for an upload that has not started yet (the cancel came while it was being
    // encoded); a few are enough, as a cancel only matters to the task it names.
    cancelled_uploads_.push_back(cancel);
    while (cancelled_uploads_.size() > kMaxCancelledUploads) cancelled_uploads_.pop_front();
    for (TaskScope* transfer : task_transfers_) {
      if (cancel.Covers(transfer->job_id(), transfer->round(), transfer->attempt())) transfer->Cancel();
    }
    // An update sent inside the task session is not waited for either: a coordinator that
    // cancelled its task may never answer it, and the wait would hold the task thread for the
    // whole transfer deadline.
    if (inline_wait_ && !inline_wait_->verdict &&
        cancel.Covers(inline_wait_->job_id, inline_wait_->round, inline_wait_->attempt)) {
      inline_wait_->cancelled = true;
      inline_cv_.notify_all();
    }
  }

  Result<TensorSet> DownloadModel(const v1::DownloadModelRequest& request, uint64_t max_bytes, uint32_t round,
                                  uint32_t attempt, int64_t deadline_unix_ms) override {
    grpc::ClientContext ctx;
    // The transfer's deadline, or the task's where that is nearer (a coordinator that neither
    // serves the model nor cancels the task held the task thread for the whole transfer's).
    const TransferLimit limit = LimitFor(deadline_unix_ms);
    const bool task_deadline = limit.task_deadline;
    SetDeadline(&ctx, limit.left);
    TransferScope in_flight(this, &ctx);
    TaskScope task(this, &ctx, request.job_id(), round, attempt);
    // Read raw: each chunk's bytes go from gRPC's buffers straight into the model's tensors
    // (wire::AddModelChunkMessage), where a parsed message would first copy them into a
    // 1 MiB string of its own, mapped and faulted in again for every chunk.
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel_.get(), download_method_, &ctx, request));
    const std::string what = "model version " + std::to_string(request.model_version()) + " of job " + request.job_id();
    wire::TensorAssembler assembler(what, max_bytes);
    assembler.AcceptEncoded(max_bytes);  // a job whose model travels compressed
    grpc::ByteBuffer message;
    Status status;
    bool have_manifest = false;
    while (reader->Read(&message)) {
      if (!status.ok()) {
        ctx.TryCancel();  // the download is refused: the rest of it is not waited for
        continue;         // Read ends at once, then Finish
      }
      if (have_manifest) {
        status = wire::AddModelChunkMessage(message, assembler, what);
        continue;
      }
      v1::ModelChunkMessage first;
      if (!wire::FromByteBuffer(message, &first)) {
        status = DataLossError(what + ": a message that is not a ModelChunkMessage");
      } else if (first.has_manifest() && first.model_version() != request.model_version()) {
        // Another version than the task's would be trained from, and the update reported as
        // based on the task's.
        status = DataLossError(what + ": the coordinator sent model version " + std::to_string(first.model_version()));
      } else if (first.has_manifest()) {
        status = assembler.Start(first.manifest());
        have_manifest = true;
      } else if (first.has_chunk()) {
        status = DataLossError(what + ": chunk before the manifest");
      }
    }
    grpc::Status finished = reader->Finish();
    if (!status.ok()) return status;  // what was wrong with it, not the cancel that followed
    if (task.cancelled()) return CancelledError("download " + what + ": the coordinator cancelled the task");
    if (task_deadline && finished.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return DeadlineExceededError("download " + what + ": the task's deadline_unix_ms " +
                                   std::to_string(deadline_unix_ms) + " passed on this worker's clock before the " +
                                   "model arrived");
    }
    if (!finished.ok()) return FromGrpc(finished, "download " + what);
    return assembler.Finish();
  }

  Result<v1::UploadResult> UploadUpdate(const v1::UpdateHeader& header, std::shared_ptr<const wire::UpdateBytes> shared,
                                        uint32_t chunk_bytes, int64_t deadline_unix_ms) override {
    const wire::UpdateBytes& tensors = *shared;
    if (header.sets_size() == 0 && !tensors.empty()) {
      return InvalidArgumentError("upload: tensors without the header's sets that describe them");
    }
    // The transfer's deadline, or the task's where that is nearer, as a download's: a round
    // that is over takes no update, and a slow upload would hold the task thread past it.
    if (LimitFor(deadline_unix_ms).left.count() == 0) {
      return TaskDeadlinePassed(header, deadline_unix_ms, "the update was sent");
    }
    uint64_t bytes = 0;
    for (const std::string& set : tensors) bytes += set.size();
    // A small update inside the task session (JoinResponse.inline_update_max_bytes).
    if (auto sent = UploadInline(header, tensors, bytes, chunk_bytes, deadline_unix_ms)) return *sent;
    // A large update on a connection of its own (JoinResponse.upload_connection_min_bytes),
    // closed when this call returns: the coordinator's read buffers for it go with it.
    const uint64_t own_from = upload_connection_min_bytes_;
    v1::UploadResult result;
    if (own_from > 0 && bytes >= own_from) {
      grpc::ChannelArguments args = Arguments();
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a new connection, not the shared one
      ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> own, wire::MakeChannel(address_, tls_, std::move(args)));
      const TransferLimit limit = LimitFor(deadline_unix_ms);
      grpc::Status s = UploadOn(own, header, shared, chunk_bytes, limit.left, &result);
      if (s.ok()) return result;
      if (limit.task_deadline && s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        return TaskDeadlinePassed(header, deadline_unix_ms, "its verdict came");
      }
      // A new connection can fail where the worker's own still stands (a connect or a handshake
      // refused, a certificate that expired since the worker's connection was verified): the
      // update goes on the worker's connection then, as it would without the threshold. The
      // coordinator keeps no part of an upload that did not finish.
      const grpc::StatusCode code = s.error_code();
      if (code != grpc::StatusCode::UNAVAILABLE && code != grpc::StatusCode::UNAUTHENTICATED &&
          code != grpc::StatusCode::PERMISSION_DENIED) {
        return FromGrpc(s, "upload");
      }
      spdlog::warn("upload on a connection of its own failed ({}); sending it on the worker's connection",
                   FromGrpc(s, "upload").ToString());
      result.Clear();
    }
    const TransferLimit limit = LimitFor(deadline_unix_ms);
    grpc::Status s = UploadOn(channel_, header, shared, chunk_bytes, limit.left, &result);
    if (limit.task_deadline && s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return TaskDeadlinePassed(header, deadline_unix_ms, "its verdict came");
    }
    if (!s.ok()) return FromGrpc(s, "upload");
    return result;
  }

 private:
  // A download or upload in flight, known to CancelTransfers() for as long as it runs.
  class TransferScope {
   public:
    TransferScope(GrpcCoordinatorClient* client, grpc::ClientContext* ctx) : client_(client), ctx_(ctx) {
      std::lock_guard<std::mutex> lock(client_->mu_);
      client_->transfers_.insert(ctx_);
      if (client_->transfers_cancelled_) ctx_->TryCancel();
    }
    ~TransferScope() {
      std::lock_guard<std::mutex> lock(client_->mu_);
      client_->transfers_.erase(ctx_);
    }
    TransferScope(const TransferScope&) = delete;
    TransferScope& operator=(const TransferScope&) = delete;

   private:
    GrpcCoordinatorClient* const client_;
    grpc::ClientContext* const ctx_;
  };


  // How long a transfer for a task of deadline `deadline_unix_ms` (0 or less: none) may take
  // from now: the transfer deadline, or the time left until the task's where that is nearer.
  struct TransferLimit {
    std::chrono::milliseconds left;
    bool task_deadline = false;  // the task's deadline sets it
  };
  TransferLimit LimitFor(int64_t deadline_unix_ms) const {
    TransferLimit limit{std::chrono::duration_cast<std::chrono::milliseconds>(options_.transfer_deadline)};
    if (deadline_unix_ms > 0) {
      const auto left = TimeLeftUntil(deadline_unix_ms, NowUnixMs());
      if (left < limit.left) limit = {left, true};
    }
    return limit;
  }
  // An upload's task deadline passed before `before`, naming the task and the deadline.
  static Status TaskDeadlinePassed(const v1::UpdateHeader& header, int64_t deadline_unix_ms,
                                   const std::string& before) {
    return DeadlineExceededError("upload of job " + header.job_id() + " round " + std::to_string(header.round()) +
                                 " attempt " + std::to_string(header.attempt()) + ": the task's deadline_unix_ms " +
                                 std::to_string(deadline_unix_ms) + " passed on this worker's clock before " + before);
  }

  // Whether the task (job, round, attempt) has been cancelled in this session. Under mu_.
  bool TaskCancelledLocked(const std::string& job_id, uint32_t round, uint32_t attempt) const {
    return std::any_of(cancelled_uploads_.begin(), cancelled_uploads_.end(),
                       [&](const CancelledTask& c) { return c.Covers(job_id, round, attempt); });
  }
  bool UploadCancelledLocked(const v1::UpdateHeader& header) const {
    return TaskCancelledLocked(header.job_id(), header.round(), header.attempt());
  }

  // An upload or download call in flight, known to CancelUpload() by its task for as long as
  // it runs; one whose task is cancelled already starts cancelled.
  class TaskScope {
   public:
    TaskScope(GrpcCoordinatorClient* client, grpc::ClientContext* ctx, std::string job_id, uint32_t round,
              uint32_t attempt)
        : client_(client), ctx_(ctx), job_id_(std::move(job_id)), round_(round), attempt_(attempt) {
      std::lock_guard<std::mutex> lock(client_->mu_);
      client_->task_transfers_.insert(this);
      if (client_->TaskCancelledLocked(job_id_, round_, attempt_)) Cancel();
    }
    ~TaskScope() {
      std::lock_guard<std::mutex> lock(client_->mu_);
      client_->task_transfers_.erase(this);
    }
    TaskScope(const TaskScope&) = delete;
    TaskScope& operator=(const TaskScope&) = delete;

    const std::string& job_id() const { return job_id_; }
    uint32_t round() const { return round_; }
    uint32_t attempt() const { return attempt_; }
    // Under the client's mu_.
    void Cancel() {
      cancelled_ = true;
      ctx_->TryCancel();
    }
    bool cancelled() const { return cancelled_.load(); }

   private:
    GrpcCoordinatorClient* const client_;
    grpc::ClientContext* const ctx_;
    const std::string job_id_;
    const uint32_t round_;
    const uint32_t attempt_;
    std::atomic<bool> cancelled_{false};
  };

  // An open task session: the stream with its context, which must outlive every write, and
  // whether the reader has finished the call (guarded by session_write_mu_).
  struct OpenSession {
    std::shared_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReaderWriter<v1::TaskSessionMessage, v1::Task>> stream;
    bool finished = false;
  };

  // The task session on `ctx`, until it ends; its status. *stood: the coordinator took the
  // session's open (its first message came down it).
  grpc::Status RunTaskSession(const std::shared_ptr<grpc::ClientContext>& ctx, const v1::TaskChannelRequest& request,
                              const std::function<void(const v1::Task&)>& on_task, bool* stood) {
    auto open_session = std::make_shared<OpenSession>();
    open_session->ctx = ctx;  // the stream's context lives as long as any holder of the session
    open_session->stream = stub_->TaskSession(ctx.get());
    auto& stream = open_session->stream;
    v1::TaskSessionMessage open;
    *open.mutable_open() = request;
    if (stream->Write(open)) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        session_ = open_session;
        session_id_ = request.session();
        session_reader_ = std::this_thread::get_id();
      }
      v1::Task task;
      while (stream->Read(&task)) {
        *stood = true;
        if (task.has_verdict() && AnswersInlineUpdate(task.verdict())) continue;
        on_task(task);
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      session_.reset();
      if (inline_wait_) inline_wait_->ended = true;  // the update in flight has no verdict coming
      inline_cv_.notify_all();
    }
    std::lock_guard<std::mutex> writing(session_write_mu_);  // no write is in flight
    open_session->finished = true;  // and none starts after the call is finished
    return stream->Finish();
  }

  // An update sent inside the task session, waiting for its verdict.
  struct InlineWait {
    std::string job_id;
    uint32_t round = 0;
    uint32_t attempt = 0;
    std::optional<v1::UpdateVerdict> verdict;
    bool ended = false;      // the session ended first
    bool cancelled = false;  // CancelUpload named its task first
  };

  // The update inside the open task session, with its answer; nullopt when it does not go
  // that way (no session, or larger than the coordinator takes): an upload call carries it.
  // Its verdict is waited for until the transfer deadline, or the task's (`deadline_unix_ms`)
  // where that is nearer.
  std::optional<Result<v1::UploadResult>> UploadInline(const v1::UpdateHeader& header, const wire::UpdateBytes& tensors,
                                                       uint64_t bytes, uint32_t chunk_bytes, int64_t deadline_unix_ms) {
    const uint64_t limit = inline_update_max_bytes_.load();
    if (limit == 0 || bytes > limit) return std::nullopt;
    std::shared_ptr<OpenSession> session;
    std::thread::id reader;
    {
      std::lock_guard<std::mutex> lock(mu_);
      session = session_;
      reader = session_reader_;
      // An update of an earlier session (trained before a rejoin) goes by a call, which
      // refuses it as before; a session carries only its own.
      if (header.session() != session_id_) session.reset();
    }
    // From the thread that reads the session (inside on_task), the verdict could never be read.
    if (!session || std::this_thread::get_id() == reader) return std::nullopt;
    v1::TaskSessionMessage message;
    v1::InlineUpdate& update = *message.mutable_update();
    *update.mutable_header() = header;
    wire::AppendChunks(tensors, chunk_bytes, update.mutable_chunks());
    if (message.ByteSizeLong() > limit) return std::nullopt;
    auto wait = std::make_shared<InlineWait>();
    wait->job_id = header.job_id();
    wait->round = header.round();
    wait->attempt = header.attempt();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (session_ != session) return std::nullopt;  // the session ended meanwhile
      if (UploadCancelledLocked(header)) {
        return Result<v1::UploadResult>(CancelledError("upload: the coordinator cancelled the task"));
      }
      inline_wait_ = wait;
    }
    bool written = false;
    {
      // The reader may have finished the call since (the session ended): no write then.
      std::lock_guard<std::mutex> writing(session_write_mu_);
      written = !session->finished && session->stream->Write(message);
    }
    const TransferLimit waits = LimitFor(deadline_unix_ms);
    std::unique_lock<std::mutex> lock(mu_);
    if (written) {
      inline_cv_.wait_for(lock, waits.left,
                          [&] { return wait->verdict.has_value() || wait->ended || wait->cancelled; });
    }
    if (inline_wait_ == wait) inline_wait_.reset();
    if (!wait->verdict && wait->cancelled) {
      // Sent whole, but cancelled before its verdict: its fate is unknown, as an upload call's
      // that a cancel ended.
      return Result<v1::UploadResult>(
          CancelledError("upload inside the task session: the coordinator cancelled the task before its verdict"));
    }
    if (!wait->verdict && written && !wait->ended && waits.task_deadline) {
      return Result<v1::UploadResult>(
          TaskDeadlinePassed(header, deadline_unix_ms, "its verdict came inside the task session"));
    }
    if (!wait->verdict && written && !wait->ended) {
      // The session still stands: the coordinator has not answered in time (as an upload call
      // that ran past the same deadline).
      return Result<v1::UploadResult>(DeadlineExceededError(
          "upload inside the task session: no verdict from the coordinator within the transfer deadline of " +
          std::to_string(options_.transfer_deadline.count()) + " ms"));
    }
    if (!wait->verdict) {
      return Result<v1::UploadResult>(UnavailableError(
          "upload inside the task session: " + std::string(written ? "the session ended before the coordinator's verdict"
                                                                    : "the session broke while sending")));
    }
    v1::UploadResult result;
    result.set_accepted(wait->verdict->accepted());
    result.set_reason(wait->verdict->reason());
    return Result<v1::UploadResult>(std::move(result));
  }

  // On the session's reader: true when `verdict` answers the update in flight.
  bool AnswersInlineUpdate(const v1::UpdateVerdict& verdict) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!inline_wait_ || inline_wait_->verdict || inline_wait_->job_id != verdict.job_id() ||
        inline_wait_->round != verdict.round() || inline_wait_->attempt != verdict.attempt()) {
      return false;
    }
    inline_wait_->verdict = verdict;
    inline_cv_.notify_all();
    return true;
  }

  // Streams the header then the chunks of `tensors` on `channel`'s connection, for at most `limit`.
  // Raw messages: each chunk goes out as a small slice of its fields and its bytes where they
  // lie in `tensors`, not copied into a message and again into a serialized one (each copy a
  // new 1 MiB buffer, mapped and faulted in per chunk). The slices hold `tensors` for as long
  // as gRPC holds them (wire::ForEachChunkMessage).
  grpc::Status UploadOn(const std::shared_ptr<grpc::Channel>& channel, const v1::UpdateHeader& header,
                        const std::shared_ptr<const wire::UpdateBytes>& tensors, uint32_t chunk_bytes,
                        std::chrono::milliseconds limit, v1::UploadResult* result) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, limit);
    TransferScope in_flight(this, &ctx);
    TaskScope upload(this, &ctx, header.job_id(), header.round(), header.attempt());
    const grpc::internal::RpcMethod method(kUploadUpdateMethod, grpc::internal::RpcMethod::CLIENT_STREAMING, channel);
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel.get(), method, &ctx, result));
    v1::UpdateChunkMessage message;
    *message.mutable_header() = header;
    grpc::ByteBuffer first;
    if (!wire::ToByteBuffer(message, &first)) return grpc::Status(grpc::StatusCode::INTERNAL, "upload: header");
    bool open = writer->Write(first);
    // Admission: no tensor leaves before the coordinator has room for them; it says so with
    // the stream's initial metadata (or ends the call, which ends the wait too).
    if (open && !tensors->empty() && upload_admission_) writer->WaitForInitialMetadata();
    if (open) {
      wire::ForEachChunkMessage(tensors, chunk_bytes, [&](const grpc::ByteBuffer& chunk) {
        // A cancelled task's upload sends no further chunk (the cancelled call would refuse
        // its writes too; this does not rely on it).
        if (upload.cancelled()) return CancelledError("the coordinator cancelled the task");
        if (!writer->Write(chunk)) return CancelledError("the coordinator closed the upload");
        return Status::Ok();
      }).ok();  // a write that fails ends the call: Finish() says why
    }
    writer->WritesDone();
    return writer->Finish();
  }

  std::string address_;
  wire::ClientTls tls_;
  const GrpcClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  // DownloadModel as a method of raw messages, registered with the channel once, as the
  // generated stub registers its own. gRPC's internal API (RpcMethod, ClientReaderFactory),
  // which the generated code uses too: the download tests run through it.
  const grpc::internal::RpcMethod download_method_;
  std::mutex mu_;
  std::shared_ptr<grpc::ClientContext> channel_ctx_;
  bool cancel_pending_ = false;  // CancelTaskChannel with no channel open (guarded by mu_)
  bool channel_cancelled_ = false;  // CancelTaskChannel for the channel open now (guarded by mu_)
  // A task session answered UNIMPLEMENTED has been logged; one that stood since clears it.
  std::atomic<bool> session_refusal_logged_{false};
  std::set<grpc::ClientContext*> transfers_;  // downloads and uploads in flight (guarded by mu_)
  bool transfers_cancelled_ = false;          // CancelTransfers() was called (guarded by mu_)
  std::set<TaskScope*> task_transfers_;       // upload and download calls in flight (guarded by mu_)
  // CancelUpload's tasks in this session, newest last (guarded by mu_).
  static constexpr size_t kMaxCancelledUploads = 16;
  std::deque<CancelledTask> cancelled_uploads_;
  std::atomic<bool> upload_admission_{false};  // from the last JoinResponse
  std::atomic<uint64_t> upload_connection_min_bytes_{0};  // from the last JoinResponse; 0: never
  std::atomic<uint64_t> inline_update_max_bytes_{0};      // from the last JoinResponse; 0: no session
  // The open task session (guarded by mu_), its writes (one at a time, under
  // session_write_mu_), and the inline update waiting for its verdict (guarded by mu_).
  std::shared_ptr<OpenSession> session_;
  std::string session_id_;          // the session it was opened with
  std::thread::id session_reader_;  // the thread in RunTaskChannel reading it
  std::mutex session_write_mu_;
  std::shared_ptr<InlineWait> inline_wait_;
  std::condition_variable inline_cv_;
};

}  // namespace

Result<std::unique_ptr<CoordinatorClient>> MakeGrpcCoordinatorClient(const std::string& address,
                                                                     const wire::ClientTls& tls,
                                                                     GrpcClientOptions options) {
  if (options.transfer_deadline <= std::chrono::milliseconds::zero()) {
    return InvalidArgumentError("coordinator client: the transfer deadline must be positive, not " +
                                std::to_string(options.transfer_deadline.count()) + " ms");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   wire::MakeChannel(address, tls, GrpcCoordinatorClient::Arguments()));
  return std::unique_ptr<CoordinatorClient>(
      std::make_unique<GrpcCoordinatorClient>(address, tls, std::move(channel), options));
}

}  // namespace tessera::worker
