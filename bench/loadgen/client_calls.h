// The calls of one simulated client (SimulatedClient, simulated_client.h), on gRPC's callback
// API: its task channel or task session, its model downloads and its update uploads. Each
// call owns itself until gRPC is done with it and reports to its client; only
// simulated_client.cc includes this.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bench/loadgen/client_fleet.h"
#include "bench/loadgen/download_check.h"
#include "bench/loadgen/simulated_client.h"
#include "bench/loadgen/update_payload.h"
#include "proto/byte_buffers.h"
#include "proto/task_wire.h"

namespace tessera::loadgen {
namespace client_calls {

using Clock = std::chrono::steady_clock;

inline constexpr auto kCallDeadline = std::chrono::seconds(10);     // as tessera-worker's
inline constexpr auto kTransferDeadline = std::chrono::minutes(5);  // as tessera-worker's

inline double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

inline void SetDeadline(grpc::ClientContext* context, Clock::duration after) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::duration_cast<std::chrono::system_clock::duration>(after));
}

}  // namespace client_calls

using client_calls::kTransferDeadline;
using client_calls::MillisSince;
using client_calls::SetDeadline;

// The task channel, on the generic stub: OpenTaskChannel (the request written, then tasks
// read until the stream ends) or, when the coordinator takes inline updates, a TaskSession
// (the `open` message first, then small updates written into it as the client has them).
// Owned by itself until OnDone and by its client while open. A hold keeps the call from
// ending while a write may still start: it is let go once the reads have ended and no write
// is in flight, so a Send() never meets a finished call (it is dropped once the reads end).
class SimulatedClient::TaskChannelCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  TaskChannelCall(SimulatedClient* client, uint64_t epoch, const v1::TaskChannelRequest& request, bool session)
      : client_(client), epoch_(epoch), session_(session), writing_(session) {  // Sends before Begin queue
    if (session) {
      v1::TaskSessionMessage open;
      *open.mutable_open() = request;
      serialized_ = wire::ToByteBuffer(open, &first_);
    } else {
      serialized_ = wire::ToByteBuffer(request, &first_);
    }
  }

  bool session() const { return session_; }

  void Begin(std::shared_ptr<TaskChannelCall> self) {
    self_ = std::move(self);
    client_->generic()->PrepareBidiStreamingCall(
        &context_, session_ ? "/tessera.v1.WorkerService/TaskSession" : "/tessera.v1.WorkerService/OpenTaskChannel",
        grpc::StubOptions(), this);
    if (!serialized_) context_.TryCancel();
    AddHold();
    if (session_) {
      StartWrite(&first_);  // writing_ is already set: Sends wait for it
    } else {
      StartWriteLast(&first_, grpc::WriteOptions());
    }
    StartRead(&incoming_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }

  // A session's inline update: written after the writes before it; dropped once the call's
  // reads have ended (the client then counts the update as lost, OnChannelEnded).
  void Send(grpc::ByteBuffer message) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reads_ended_) return;
      if (writing_) {
        queued_.push_back(std::move(message));
        return;
      }
      writing_ = true;
      out_ = std::move(message);
    }
    StartWrite(&out_);
  }

  void OnReadInitialMetadataDone(bool ok) override {
    if (ok) client_->OnChannelOpen(epoch_);
  }
  void OnWriteDone(bool ok) override {
    if (!session_) return;
    bool release = false, next = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ok || reads_ended_ || queued_.empty()) {  // a broken stream drops what waits
        queued_.clear();
        writing_ = false;
        release = reads_ended_ && !released_;
        released_ = released_ || release;
      } else {
        out_ = std::move(queued_.front());
        queued_.erase(queued_.begin());
        next = true;
      }
    }
    if (release) RemoveHold();
    if (next) StartWrite(&out_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {  // the call is ending: OnDone follows once no write is in flight
      bool release = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        reads_ended_ = true;
        release = !writing_ && !released_;
        released_ = released_ || release;
      }
      if (release) RemoveHold();
      return;
    }
    v1::Task task;
    grpc::ByteBuffer model;  // the model inside a task, left in the transport's slices
    const bool parsed = wire::ReadTask(incoming_, &task, &model);
    incoming_.Clear();
    if (parsed) {
      client_->OnTask(epoch_, std::move(task), &model);
    } else {
      client_->fleet()->RecordError("task channel: a message that is not a Task");
    }
    StartRead(&incoming_);
  }
  void OnDone(const grpc::Status& status) override {
    ClientFleet* fleet = client_->fleet();
    client_->OnChannelEnded(epoch_, status);
    self_.reset();  // may delete this
    fleet->CallEnded();
  }

 private:
  SimulatedClient* const client_;
  const uint64_t epoch_;
  const bool session_;
  grpc::ClientContext context_;
  grpc::ByteBuffer first_;  // the channel's request, or the session's `open`
  bool serialized_ = false;
  grpc::ByteBuffer incoming_;
  std::mutex mu_;  // guards the five below
  bool writing_;                          // a write is in flight (or Begin's is to come)
  bool reads_ended_ = false;
  bool released_ = false;                 // the hold is let go
  grpc::ByteBuffer out_;                  // the write in flight after the first
  std::vector<grpc::ByteBuffer> queued_;  // writes waiting for it
  std::shared_ptr<TaskChannelCall> self_;
};

// One download, on the generic stub: the request goes out serialized, the chunks come in as
// gRPC's buffers and are checked in place (DownloadCheck::AddWire), as the bytes of a model
// the client does not keep need no copy.
class SimulatedClient::DownloadCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  DownloadCall(SimulatedClient* client, uint64_t work, const v1::DownloadModelRequest& request, std::string what,
               bool verify_hashes)
      : client_(client), work_(work), check_(std::move(what), request.model_version(), verify_hashes) {
    serialized_ = wire::ToByteBuffer(request, &request_);
  }

  void Begin(std::shared_ptr<DownloadCall> self) {
    self_ = std::move(self);
    SetDeadline(&context_, kTransferDeadline);
    client_->generic()->PrepareBidiStreamingCall(&context_, "/tessera.v1.WorkerService/DownloadModel",
                                                 grpc::StubOptions(), this);
    if (!serialized_) checked_ = InternalError("the download request could not be serialized");
    StartWriteLast(&request_, grpc::WriteOptions());
    StartRead(&incoming_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    if (checked_.ok()) checked_ = check_.AddWire(incoming_);  // after a failure, drain as the worker does
    incoming_.Clear();
    StartRead(&incoming_);
  }
  void OnDone(const grpc::Status& status) override {
    ClientFleet* fleet = client_->fleet();
    client_->OnDownloaded(work_, status, checked_, check_, MillisSince(started_));
    self_.reset();  // may delete this
    fleet->CallEnded();
  }

 private:
  SimulatedClient* const client_;
  const uint64_t work_;
  const Clock::time_point started_ = Clock::now();
  grpc::ClientContext context_;
  grpc::ByteBuffer request_;
  bool serialized_ = false;
  grpc::ByteBuffer incoming_;
  DownloadCheck check_;
  Status checked_;
  std::shared_ptr<DownloadCall> self_;
};

// One upload, on the generic stub (or on a connection of its own, made for it and closed with
// it, as the worker sends a large update): the header, then the shared payload's serialized
// chunks, one write in flight at a time. Without a payload, the header goes alone (a failure
// report). With admission (as the worker, worker/coordinator_client.cc), the first chunk waits
// for the coordinator's initial metadata as well as for the header's write.
class SimulatedClient::UploadCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  UploadCall(SimulatedClient* client, uint64_t work, const v1::UpdateChunkMessage& header,
             std::shared_ptr<const UpdatePayload> payload, bool admission)
      : client_(client), work_(work), payload_(std::move(payload)), admitted_(!admission) {
    serialized_ = wire::ToByteBuffer(header, &header_);
  }

  // Before Begin: the call goes on `own`'s connection instead of the client's.
  void OnItsOwnConnection(std::shared_ptr<grpc::Channel> own) {
    own_stub_ = std::make_unique<grpc::GenericStub>(std::move(own));
  }

  void Begin(std::shared_ptr<UploadCall> self) {
    self_ = std::move(self);
    SetDeadline(&context_, kTransferDeadline);
    grpc::GenericStub* stub = own_stub_ ? own_stub_.get() : client_->generic();
    stub->PrepareBidiStreamingCall(&context_, "/tessera.v1.WorkerService/UploadUpdate",
                                                 grpc::StubOptions(), this);
    if (!payload_ || payload_->wire_chunks.empty()) {
      StartWriteLast(&header_, grpc::WriteOptions());
    } else {
      StartWrite(&header_);
    }
    StartRead(&reply_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }

  void OnReadInitialMetadataDone(bool ok) override {
    if (!ok || !payload_) return;
    bool start = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      admitted_ = true;
      start = header_written_;
    }
    if (start) WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok || !payload_) return;  // the coordinator ended the call (a refusal); OnDone follows
    if (next_ == 0) {
      bool start = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        header_written_ = true;
        start = admitted_;
      }
      if (start) WriteNext();
      return;
    }
    client_->fleet()->Add(Counter::kBytesUploaded, payload_->chunk_bytes[next_ - 1]);
    WriteNext();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    got_result_ = wire::FromByteBuffer(reply_, &result_);
  }
  void OnDone(const grpc::Status& status) override {
    ClientFleet* fleet = client_->fleet();
    grpc::Status outcome = status;
    if (!serialized_) {
      outcome = grpc::Status(grpc::StatusCode::INTERNAL, "the upload's header could not be serialized");
    } else if (status.ok() && !got_result_) {
      outcome = grpc::Status(grpc::StatusCode::INTERNAL, "the upload ended without a readable UploadResult");
    }
    client_->OnUploaded(work_, outcome, result_, MillisSince(started_), !payload_);
    self_.reset();  // may delete this
    fleet->CallEnded();
  }

 private:
  // The next chunk; called by one reaction at a time (the header's write and the metadata
  // decide together which one starts the first).
  void WriteNext() {
    if (next_ >= payload_->wire_chunks.size()) return;
    const grpc::ByteBuffer* chunk = &payload_->wire_chunks[next_++];
    if (next_ == payload_->wire_chunks.size()) {
      StartWriteLast(chunk, grpc::WriteOptions());
    } else {
      StartWrite(chunk);
    }
  }

  SimulatedClient* const client_;
  const uint64_t work_;
  const Clock::time_point started_ = Clock::now();
  grpc::ClientContext context_;
  grpc::ByteBuffer header_;
  bool serialized_ = false;
  const std::shared_ptr<const UpdatePayload> payload_;
  size_t next_ = 0;
  std::mutex mu_;  // guards the two below
  bool admitted_;
  bool header_written_ = false;
  grpc::ByteBuffer reply_;
  bool got_result_ = false;
  v1::UploadResult result_;
  std::shared_ptr<UploadCall> self_;
  std::unique_ptr<grpc::GenericStub> own_stub_;  // the call's own connection, if it has one
};

}  // namespace tessera::loadgen
