#include "server/rpc/task_channels.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "base/escape.h"
#include "proto/byte_buffers.h"
#include "proto/grpc_status.h"
#include "proto/revocation.h"
#include "proto/task_wire.h"
#include "proto/transport_security.h"
#include "proto/update_chunk_reader.h"
#include "server/coordinator.h"
#include "server/rpc/service_doors.h"

namespace tessera::server {
namespace {

using wire::ToGrpc;

// SetTaskChannelWriteDoneHookForTesting's hook; empty outside tests.
std::function<void()>& WriteDoneHook() {
  static std::function<void()> hook;
  return hook;
}

// A long-lived server stream is written by whichever thread has something for it (the one
// that queued a task or published an event, or gRPC's own after a write completes), never by
// a thread parked on it. Both streams below share one discipline:
//  - their state lives in an object shared by the reactor and by whoever notifies it, so a
//    late notification finds the state, sees the reactor gone, and does nothing;
//  - under the state's lock a thread claims the right to start the single write, or to call
//    Finish() once; it calls them after releasing the lock, because gRPC may run
//    OnWriteDone() and even OnDone() inline, on the calling thread;
//  - the reactor is alive while Finish() has not been called (OnDone() comes only after it),
//    so whoever holds that right may use the reactor; after Finish() no one touches it.

// How a task channel writes to its stream: a server stream (OpenTaskChannel) or the write
// side of a task session (TaskSession). Valid until the stream is done.
struct TaskStream {
  std::function<void(const grpc::ByteBuffer*)> write;
  std::function<void(const grpc::Status&)> finish;
};

template <typename Reactor>
TaskStream StreamOf(Reactor* reactor) {
  return {[reactor](const grpc::ByteBuffer* message) { reactor->StartWrite(message); },
          [reactor](const grpc::Status& status) { reactor->Finish(status); }};
}

// One worker's task channel: what its reactor and the registry share.
class TaskChannel final : public TaskChannelSink {
 public:
  TaskChannel(WorkerRegistry* registry, std::string worker_id, uint64_t generation, TaskStream stream,
              grpc::CallbackServerContext* ctx)
      : registry_(registry), worker_id_(std::move(worker_id)), generation_(generation), stream_(std::move(stream)),
        ctx_(ctx) {}

  void TasksQueued() override { Pump(); }
  void Superseded() override { Close(); }

  // Under mutual TLS with a revocation list: the channel's certificate (its serial), checked
  // before each task goes down the channel. A call is checked as it starts; a channel is one
  // long call, so without this a certificate revoked after the channel opened would still be
  // sent tasks, and the models inside them, until its refused heartbeats lost the worker.
  void WatchRevocation(wire::RevocationFile* list, std::string serial) {
    revocation_ = list;
    serial_ = std::move(serial);
  }

  // Writes the next queued task, or finishes once closing, unless a write is in flight.
  void Pump() {
    const std::optional<grpc::Status> revoked = Revoked();  // outside the lock: may reread the list
    bool finish = false;
    std::function<void()> handed;  // the task's on_written, run as it goes to the transport
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (revoked && !finish_called_) {
        finish_status_ = *revoked;
        closing_ = true;
      }
      if (done_ || writing_ || finish_called_) return;
      while (!closing_) {
        bool closed = false;
        std::optional<OutgoingTask> task = registry_->TakeOutgoing(worker_id_, generation_, &closed);
        if (closed) {
          closing_ = true;
        } else if (!task) {
          return;
        } else if (!Serialize(*task)) {
          spdlog::error("task channel of worker '{}': a task could not be serialized; dropped", worker_id_);
          continue;
        } else {
          handed = std::move(task->on_written);
          writing_ = true;
          write_started_ = std::chrono::steady_clock::now();
          break;
        }
      }
      finish = closing_;
      finish_called_ = finish;
    }
    // (The stream is not done: Finish() has not been called, and only this thread may.)
    if (finish) {
      stream_.finish(finish_status_);  // the worker sees its channel closed and rejoins
    } else {
      // Before the write, not once it is done: a worker that has the task (a small model inside
      // it) can train, report, and see its round commit before gRPC runs the write's
      // completion on a loaded machine, and the round's record would then miss the model's
      // bytes. A stream that breaks during this write has them counted all the same.
      if (handed) handed();
      stream_.write(&in_flight_);
    }
  }

  // A limit passed (server/rpc/stream_limits.h): the channel ends with `why`; a write the worker
  // does not take is cancelled.
  void Expire(const Status& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_ || finish_called_) return;
      finish_status_ = ToGrpc(why);
      closing_ = true;
      if (writing_) ctx_->TryCancel();
    }
    spdlog::info("ended {}", why.message());
    Pump();
  }

  // Idle but well: no write has waited on the worker for `idle`, and it heartbeats.
  bool Alive(std::chrono::milliseconds idle) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (writing_ && std::chrono::steady_clock::now() - write_started_ >= idle) return false;
    }
    return registry_->IsAlive(worker_id_, generation_);
  }

  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    Pump();
  }

  // Ends the channel with `why` (a task session whose worker broke its rules).
  void CloseWith(const grpc::Status& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!finish_called_) finish_status_ = why;
      closing_ = true;
    }
    Pump();
  }

  const std::string& worker_id() const { return worker_id_; }

  // PERMISSION_DENIED naming the revocation when the channel's certificate is revoked now.
  std::optional<grpc::Status> Revoked() {
    if (revocation_ == nullptr) return std::nullopt;
    std::string problem;
    const bool revoked = revocation_->Revoked(serial_, &problem);
    if (!problem.empty()) spdlog::error("{}", problem);  // a changed list that does not load
    if (!revoked) return std::nullopt;
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "task channel of worker '" + worker_id_ + "': its certificate " + revocation_->RevokedReason(serial_));
  }

  void WriteDone(bool ok) {
    if (const auto& hook = WriteDoneHook()) hook();
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok) closing_ = true;  // the stream broke
      in_flight_.Clear();  // an inline model's slice goes back to its version
    }
    Pump();
  }

  // The worker went away: it leaves its round at once, as when its heartbeat stops.
  void Cancelled() {
    registry_->CloseChannel(worker_id_, generation_, this);
    Close();
  }

  // The reactor is being deleted.
  void Done() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    registry_->CloseChannel(worker_id_, generation_, this);
  }

 private:
  // The task as the channel's next message; a small model rides inside it, shared.
  bool Serialize(const OutgoingTask& task) {
    if (task.train_shared) return wire::TrainTaskWire(*task.train_shared, task.train_own, task.inline_model, &in_flight_);
    if (task.inline_model) return wire::TaskWithInlineModel(task.task, task.inline_model, &in_flight_);
    return wire::ToByteBuffer(task.task, &in_flight_);
  }

  WorkerRegistry* const registry_;
  const std::string worker_id_;
  const uint64_t generation_;
  const TaskStream stream_;
  wire::RevocationFile* revocation_ = nullptr;  // set before the channel is shared; null: not watched
  std::string serial_;
  std::mutex mu_;  // guards the fields below; held while taking a task from the registry
  bool done_ = false;                             // the stream is done: nothing may touch it
  grpc::CallbackServerContext* const ctx_;       // valid until done
  grpc::Status finish_status_ = grpc::Status::OK;
  bool writing_ = false;        // a write is in flight; in_flight_ belongs to it
  std::chrono::steady_clock::time_point write_started_;
  bool closing_ = false;        // finish as soon as no write is in flight
  bool finish_called_ = false;
  grpc::ByteBuffer in_flight_;          // the message being written
};

// What an open task channel holds: its place among the caller's streams, the channel, and
// the limits the watchdog keeps for it.
struct OpenedChannel {
  std::unique_ptr<StreamCounter::Slot> slot;
  std::shared_ptr<TaskChannel> channel;
  std::shared_ptr<StreamDeadline> deadline;
};

// Opens worker request.worker_id()'s task channel on `stream` (the caller's credential
// checked by the service already): its session authenticated, a stream slot taken, the
// channel handed to `keep` (before anything can write to the stream, so that the reactor's
// completions find it), then registered with the registry and watched. `send_metadata`
// starts the stream's initial metadata (the worker's sign that the channel is open) before
// the channel is kept: from then on another thread may finish the stream (a session's
// cancel), and gRPC aborts the process when initial metadata is started after a finish. An
// error: nothing was kept, and the caller finishes its stream with it. Once kept, every end
// of the stream goes through the channel (a refused registration closes it).
Status OpenTaskChannelOn(Coordinator* c, grpc::CallbackServerContext* ctx, const v1::TaskChannelRequest& request,
                         TaskStream stream, const std::function<void()>& send_metadata,
                         const std::function<void(OpenedChannel)>& keep) {
  WorkerRegistry& registry = c->registry();
  uint64_t generation = 0;
  RETURN_IF_ERROR(registry.Authenticate(request.worker_id(), request.session(), &generation));
  OpenedChannel opened;
  ASSIGN_OR_RETURN(opened.slot, c->streams().Open(CallerOf(ctx), "task channel of worker '" + request.worker_id() + "'"));
  auto channel = std::make_shared<TaskChannel>(&registry, request.worker_id(), generation, std::move(stream), ctx);
  if (c->revocation() != nullptr) {
    const wire::PeerIdentity peer = wire::IdentifyPeer(ctx->auth_context().get());
    if (peer.has_certificate) channel->WatchRevocation(c->revocation(), peer.serial);
  }
  // Idle by nature: it ends when a write is not taken for the idle timeout, when its worker
  // has stopped heartbeating by then, or at the channel's maximum age.
  std::weak_ptr<TaskChannel> weak = channel;
  auto deadline = StreamDeadline::Create(
      "task channel of worker '" + request.worker_id() + "'", c->options().streams.idle_timeout,
      c->options().streams.channel_max_age, "maximum age (channel_max_age)", [weak](const Status& why) {
        if (auto channel = weak.lock()) channel->Expire(why);
      });
  deadline->SetAliveProbe([weak, idle = c->options().streams.idle_timeout] {
    auto channel = weak.lock();
    return channel && channel->Alive(idle);
  });
  opened.channel = channel;
  opened.deadline = deadline;
  send_metadata();
  keep(std::move(opened));
  if (Status s = registry.OpenChannel(request.worker_id(), generation, channel); !s.ok()) {
    channel->CloseWith(ToGrpc(s));
    return Status::Ok();
  }
  c->watchdog().Watch(deadline);
  return Status::Ok();
}

class TaskChannelReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `admitted`: the caller's checks (worker id, certificate), done by the service.
  TaskChannelReactor(Coordinator* c, grpc::CallbackServerContext* ctx, const v1::TaskChannelRequest& request,
                     const Status& admitted) {
    if (!admitted.ok()) {
      Finish(ToGrpc(admitted));
      return;
    }
    // (In the constructor no completion can run before it returns.)
    Status s = OpenTaskChannelOn(c, ctx, request, StreamOf(this), [this] { StartSendInitialMetadata(); },
                                 [this](OpenedChannel opened) { opened_ = std::move(opened); });
    if (!s.ok()) Finish(ToGrpc(s));
  }

  void OnWriteDone(bool ok) override {
    opened_.deadline->Progress();
    opened_.channel->WriteDone(ok);
  }
  void OnCancel() override {
    if (opened_.channel) opened_.channel->Cancelled();
  }
  void OnDone() override {
    if (opened_.deadline) opened_.deadline->ClaimFinish();  // the watchdog forgets it
    if (opened_.channel) opened_.channel->Done();
    delete this;
  }

 private:
  OpenedChannel opened_;  // no channel when it was refused
};

// A task session (TaskSession): the task channel as a two-way stream. Its first message opens
// the channel; tasks go down as on OpenTaskChannel, and each later message is a small update
// (InlineUpdate), taken whole through the same intake as an upload's (update_intake.h) and
// answered by an UpdateVerdict down the channel. One update is taken at a time: the next
// message is read once the last one is judged. Every update's bytes are already here when it
// is read, so it does not wait for the upload budget; it counts in it while it is folded.
class TaskSessionReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  TaskSessionReactor(Coordinator* c, grpc::CallbackServerContext* ctx,
                     std::function<Status(const std::string&)> check_caller, UploadChecks checks)
      : c_(c), ctx_(ctx), check_caller_(std::move(check_caller)), checks_(std::move(checks)) {
    // Until its first message opens the channel, the session counts as a stream of its caller
    // and must send that message within the idle timeout: a caller cannot hold sessions that
    // never speak outside the stream limits. (In the constructor no completion can run yet.)
    auto slot = c->streams().Open(CallerOf(ctx), "task session");
    if (!slot.ok()) {
      Finish(ToGrpc(slot.status()));
      return;
    }
    first_slot_ = std::move(slot).value();
    const auto idle = c->options().streams.idle_timeout;
    first_deadline_ = StreamDeadline::Create("task session (its first message)", idle, idle,
                                             "idle timeout (no first message)",
                                             [this](const Status& why) { Finish(ToGrpc(why)); });
    c->watchdog().Watch(first_deadline_);
    StartRead(&raw_);
  }

  void OnReadDone(bool ok) override {
    if (!opened_.channel) {  // only this reaction sets it
      if (!first_deadline_->ClaimFinish()) return;  // the watchdog ended the session: nothing came
      first_slot_.reset();  // the channel takes a slot of its own as it opens
      Open(ok);
      return;
    }
    if (!ok) return;  // the worker sends nothing more (or went away: OnCancel says so)
    if (!TakeUpdate()) return;  // the session is ending: nothing more is read
    raw_.Clear();
    StartRead(&raw_);
  }
  // Writes start only once the channel is kept (OpenTaskChannelOn), so opened_ is set.
  void OnWriteDone(bool ok) override {
    opened_.deadline->Progress();
    opened_.channel->WriteDone(ok);
  }
  // May run while the first message is being read, before the channel exists or is kept.
  void OnCancel() override {
    std::shared_ptr<TaskChannel> channel;
    {
      std::lock_guard<std::mutex> lock(cancel_mu_);
      cancelled_ = true;
      channel = kept_;
    }
    if (channel) channel->Cancelled();
  }
  void OnDone() override {
    if (first_deadline_) first_deadline_->ClaimFinish();  // the watchdog forgets them
    if (opened_.deadline) opened_.deadline->ClaimFinish();
    if (opened_.channel) opened_.channel->Done();
    delete this;
  }

 private:
  // The first message: the channel's request. Until the channel opens, only this reactor
  // may finish the stream.
  void Open(bool ok) {
    v1::TaskSessionMessage first;
    if (!ok || !wire::FromByteBuffer(raw_, &first) || !first.has_open()) {
      Finish(ToGrpc(InvalidArgumentError("task session: the first message must be 'open' (a TaskChannelRequest)")));
      return;
    }
    const v1::TaskChannelRequest& request = first.open();
    if (Status s = check_caller_(request.worker_id()); !s.ok()) {
      Finish(ToGrpc(s));
      return;
    }
    session_ = request.session();
    bool cancelled = false;
    Status s = OpenTaskChannelOn(c_, ctx_, request, StreamOf(this), [this] { StartSendInitialMetadata(); },
                                 [this, &cancelled](OpenedChannel opened) {
                                   opened_ = std::move(opened);
                                   std::lock_guard<std::mutex> lock(cancel_mu_);
                                   kept_ = opened_.channel;
                                   cancelled = cancelled_;
                                 });
    if (!s.ok()) {
      Finish(ToGrpc(s));
      return;
    }
    if (cancelled) {  // the worker went away while the channel opened
      opened_.channel->Cancelled();
      return;
    }
    raw_.Clear();
    StartRead(&raw_);
  }

  // An inline update, judged whole; the verdict goes down the channel. False: the session
  // broke the protocol and is ending.
  bool TakeUpdate() {
    const std::string& worker = opened_.channel->worker_id();
    const auto start = std::chrono::steady_clock::now();
    wire::InlineUpdateReader reader("inline update from worker '" + worker + "'");
    v1::UpdateHeader header;
    const uint64_t message_bytes = raw_.Length();
    if (Status read = reader.Start(std::move(raw_), &header); !read.ok()) {
      opened_.channel->CloseWith(ToGrpc(read));  // not this protocol: the session ends
      return false;
    }
    UpdateIntake intake(c_, checks_, "session");
    const v1::UpdateHeader* judged = &header;  // what the verdict names (not copied: its manifest is long)
    const uint64_t limit = c_->options().inline_update_max_bytes;
    std::optional<UpdateIntake::Answer> answer;
    if (header.worker_id() != worker || header.session() != session_) {
      // Refused, not the session ended: an update trained in an earlier session of this
      // worker (it rejoined meanwhile) is stale, as it would be by an upload call.
      answer = UpdateIntake::Answer{
          ToGrpc(UnauthenticatedError("inline update on the task session of worker '" + worker + "' names worker " +
                                      QuoteUntrusted(header.worker_id(), 64) +
                                      (header.worker_id() == worker ? " and an earlier session" : "") +
                                      ": a session carries its own worker's updates of that session")),
          {}, false};
    } else if (message_bytes > limit) {
      // Checked after the header, so that the refusal names its round.
      answer = UpdateIntake::Answer{ToGrpc(InvalidArgumentError(
          "inline update from worker '" + worker + "' for job " + QuoteUntrusted(header.job_id(), 64) + " round " +
          std::to_string(header.round()) + ": " + std::to_string(message_bytes) + " bytes, expected at most " +
          std::to_string(limit) + " (JoinResponse.inline_update_max_bytes); larger updates go by UploadUpdate")), {}, false};
    } else {
      answer = intake.Admit(std::move(header));
      judged = &intake.header();
    }
    if (!answer) {
      c_->upload_budget().Take(intake.budget_bytes());
      Status added = reader.AddChunks(intake.assembler());
      answer = added.ok() ? intake.Complete(start) : intake.Reject(added);
      c_->upload_budget().Release(intake.budget_bytes());
    }
    if (answer->verdict_sent) return true;  // a refusal went down the channel already
    v1::Task verdict;
    v1::UpdateVerdict& v = *verdict.mutable_verdict();
    v.set_job_id(judged->job_id());
    v.set_round(judged->round());
    v.set_attempt(judged->attempt());
    v.set_accepted(answer->status.ok() && answer->result.accepted());
    v.set_reason(answer->status.ok() ? answer->result.reason() : answer->status.error_message());
    if (!answer->status.ok()) checks_.refused(answer->status.error_message());
    c_->registry().Send(worker, std::move(verdict)).ok();
    return true;
  }

  Coordinator* const c_;
  grpc::CallbackServerContext* const ctx_;
  const std::function<Status(const std::string&)> check_caller_;
  const UploadChecks checks_;
  grpc::ByteBuffer raw_;   // the message being read
  std::string session_;    // the session the channel was opened with
  std::unique_ptr<StreamCounter::Slot> first_slot_;  // until the first message is read
  std::shared_ptr<StreamDeadline> first_deadline_;   // the same; null when no slot was free
  OpenedChannel opened_;   // no channel until the first message opens it, or when refused
  std::mutex cancel_mu_;   // guards the two below, which OnCancel reads on any thread
  bool cancelled_ = false;
  std::shared_ptr<TaskChannel> kept_;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartTaskChannel(Coordinator* c, grpc::CallbackServerContext* ctx,
                                                             const v1::TaskChannelRequest& request,
                                                             const Status& admitted) {
  return new TaskChannelReactor(c, ctx, request, admitted);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartTaskSession(
    Coordinator* c, grpc::CallbackServerContext* ctx, std::function<Status(const std::string&)> check_caller,
    UploadChecks checks) {
  return new TaskSessionReactor(c, ctx, std::move(check_caller), std::move(checks));
}

void SetTaskChannelWriteDoneHookForTesting(std::function<void()> hook) { WriteDoneHook() = std::move(hook); }

}  // namespace tessera::server
