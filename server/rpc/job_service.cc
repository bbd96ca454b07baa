// JobService: what the `tessera` command line calls (server/rpc/services.h).
#include "server/rpc/services.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/escape.h"
#include "proto/grpc_status.h"
#include "proto/job_mapping.h"
#include "proto/list_reply.h"
#include "proto/record_bounds.h"
#include "proto/tensor_transfer.h"
#include "server/coordinator.h"
#include "server/rpc/service_doors.h"

namespace tessera::server {
namespace {

using wire::ToGrpc;

// List replies stay well under gRPC's default 4 MiB receive limit, whatever is stored:
// at most this many entries and bytes; the reply's trailing metadata says how many more
// there were (kMoreEntriesTrailer).
using wire::kMaxListBytes;

// A watch reads the committed rounds from the state store a page at a time, as the watcher
// takes them, so that a job of many rounds and many clients (a round's record is about 640
// bytes a client) is never held whole in memory.
constexpr size_t kWatchPageBytes = 4 << 20;

// One `tessera watch`: the committed rounds, then the job's live events until it ends.
//
// The committed rounds come from the state store, a page at a time: the first page when the
// watch starts, each next one when the watcher has taken the last (WriteDone, on a gRPC
// thread). The watch takes its position in the job's live log before it reads the first page,
// and a round is stored before its event is published: a round committed after a read is in
// the log from that position on (sent once, as the rounds are told apart by number), so once
// a page comes back empty every later round is in the log, or was dropped from it and is
// read from the store again (below). A watcher that falls behind the log (it keeps the
// last events within a budget, server/jobs/job_events.h) goes back to the store for the rounds
// it missed; only progress events and notes are skipped, and it is told so: how many events,
// and how many notes among them.
//
// A job moved back to an older checkpoint as it resumed (JobEvent.rewind) has deleted its
// records of the rounds after it, and runs them again: the watch then sends every round after
// it committed from then on, read from the store again, even those it sent before or was not
// asked for (the rounds before from_round, which its watcher showed before it reconnected).
// The rewind's event goes first, so that the watcher forgets the rounds after it before it is
// sent them again: one already in the log when the watch starts, past rounds its watcher holds,
// is sent before the committed rounds; one published later is sent in its place in the log
// (or with the note of the events missed, when the log dropped it: it keeps the rewinds it
// drops), and the rounds after it are read again unless every one sent was read from the
// store after the job moved back.
class JobWatch final {
 public:
  using RoundPages = std::function<Result<std::vector<v1::RoundRecord>>(uint32_t from_round, size_t max_bytes)>;

  JobWatch(std::shared_ptr<JobRunner> runner, v1::Job job, RoundPages pages,
           grpc::ServerWriteReactor<v1::JobEvent>* reactor, grpc::CallbackServerContext* ctx)
      : runner_(std::move(runner)), job_(WithoutLastRound(std::move(job))), pages_(std::move(pages)), reactor_(reactor),
        ctx_(ctx) {}

  // Before the first Pump(): the position in the job's live log from which events are taken
  // once the rounds are sent, then the first page of rounds from `from_round`. In this order:
  // an event published between the two is in the log from that position (or, dropped from
  // it, counted as missed), never between a position taken after the read and the read.
  Status Start(uint32_t from_round) {
    uint32_t first = from_round;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_round_ = from_round > 0 ? from_round - 1 : 0;  // older rounds in the live log are not asked for
      stale_through_ = last_round_;  // the watcher's own, from before this watch
      if (runner_) {
        seen_ = runner_->events().OldestWithNotesDropped(&notes_before_seen_);
        if (HoistRewindLocked()) first = last_round_ + 1;
        read_at_ = runner_->events().published();
      }
    }
    ASSIGN_OR_RETURN(auto page, pages_(first, kWatchPageBytes));
    std::lock_guard<std::mutex> lock(mu_);
    TakePageLocked(std::move(page));
    return Status::Ok();
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
  // left), unless a write is in flight. With `may_read_store` (the start and WriteDone, on
  // gRPC's threads), an empty outbox is refilled from the state store while rounds are owed;
  // the job's own thread, publishing, never reads it.
  void Pump(bool may_read_store = false) {
    grpc::ServerWriteReactor<v1::JobEvent>* reactor = nullptr;
    bool finish = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (reactor_ == nullptr || writing_ || finish_called_ || reading_store_) return;
      if (!cancelled_ && outbox_.empty() && rounds_owed_) {
        if (!may_read_store) return;
        reading_store_ = true;
        const uint32_t from = last_round_ + 1;
        if (read_at_pending_ && runner_) read_at_ = runner_->events().published();
        read_at_pending_ = false;
        lock.unlock();
        auto page = pages_(from, kWatchPageBytes);
        lock.lock();
        reading_store_ = false;
        if (!page.ok()) {
          finish_status_ = ToGrpc(page.status());
          cancelled_ = true;
        } else {
          TakePageLocked(std::move(page).value());
        }
        if (reactor_ == nullptr) return;
      }
      if (!cancelled_ && outbox_.empty() && !rounds_owed_ && !log_ended_) {
        if (!runner_) {  // a job not running here: its rounds, then its end
          v1::JobEvent event;
          *event.mutable_job() = job_;
          event.set_message(wire::BoundedText("job " + job_.id() + " " + wire::JobStateName(job_.state()) +
                                                  (job_.error().empty() ? "" : ": " + job_.error()),
                                              wire::kMaxNoteBytes));
          outbox_.push_back(std::move(event));
          log_ended_ = true;
        } else {
          TakeLiveEventsLocked();
        }
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
    Pump(/*may_read_store=*/true);
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
  // What every event of the watch carries as its job: not the last round's record, which the
  // round events carry themselves (as the job's live events do).
  static v1::Job WithoutLastRound(v1::Job job) {
    job.clear_last_round();
    return job;
  }

  // Queues a page of committed rounds; an empty page means the store has no more.
  void TakePageLocked(std::vector<v1::RoundRecord> page) {
    rounds_owed_ = !page.empty();
    for (auto& r : page) {
      if (r.round() <= last_round_) continue;
      last_round_ = r.round();
      v1::JobEvent event;
      *event.mutable_job() = job_;
      *event.mutable_round() = std::move(r);
      outbox_.push_back(std::move(event));
    }
  }

  // Queues what is new in the job's live log. Rounds already sent from the store are skipped;
  // when the log dropped events this watch had not read, the rounds among them are read from
  // the store again (rounds_owed_), before anything newer.
  void TakeLiveEventsLocked() {
    bool ended = false;
    size_t missed = 0;
    size_t notes_dropped = 0;
    std::vector<v1::JobEvent> events = runner_->events().Since(seen_, &ended, &missed, &notes_dropped);
    if (missed > 0) {
      // The notes among the missed events are counted (the log counts those it dropped), so
      // that the watcher knows what it did not see, not only that it fell behind.
      const size_t notes = notes_dropped - notes_before_seen_;
      v1::JobEvent note;
      *note.mutable_job() = events.empty() ? job_ : events.front().job();
      note.set_message("this watch fell " + std::to_string(missed) +
                       " events behind the job's live log (it keeps the last " +
                       std::to_string(runner_->events().capacity()) + " events within " +
                       std::to_string(runner_->events().max_bytes() >> 20) +
                       " MiB): the committed rounds among them follow from the state store; " + std::to_string(notes) +
                       (notes == 1 ? " note" : " notes") + " and the progress among them are skipped");
      outbox_.push_back(std::move(note));
      // A rewind among the missed events (the log keeps those it dropped) is sent all the same.
      size_t number = 0;
      auto rewind = runner_->events().LowestRewindIn(seen_, seen_ + missed, &number);
      if (rewind && number + 1 != hoisted_) {
        if (!rewind->has_job()) *rewind->mutable_job() = outbox_.back().job();  // the note's: it was dropped
        TakeRewindLocked(std::move(*rewind), number);
      }
      seen_ += missed;  // the rest of `events` are read again once the rounds are sent
      notes_before_seen_ = notes_dropped;
      rounds_owed_ = true;
      stale_through_ = last_round_;
      read_at_pending_ = true;
      return;
    }
    for (auto& event : events) {
      const size_t number = seen_++;
      notes_before_seen_ += JobEvents::IsNote(event) ? 1 : 0;
      if (event.has_rewind()) {
        if (number + 1 == hoisted_) continue;  // sent first
        // The rest of `events` are read again once the rounds after the rewind are sent.
        if (TakeRewindLocked(std::move(event), number)) return;
        continue;
      }
      if (event.has_round()) {  // already sent from the committed rounds
        if (event.round().round() <= last_round_) continue;
        last_round_ = stale_through_ = event.round().round();
      }
      outbox_.push_back(std::move(event));
    }
    log_ended_ = ended;
  }

  // A rewind published before the watch starts (in the live log, or dropped from it), to a
  // round before the last its watcher holds (from_round - 1): queued first, and the committed
  // rounds are read from the round after it. Returns whether there was one.
  bool HoistRewindLocked() {
    size_t number = 0;
    std::optional<v1::JobEvent> rewind = runner_->events().LowestRewindIn(0, SIZE_MAX, &number);
    if (!rewind || rewind->rewind().to_round() >= last_round_) return false;
    last_round_ = stale_through_ = rewind->rewind().to_round();
    hoisted_ = number + 1;
    if (!rewind->has_job()) *rewind->mutable_job() = job_;  // one the log dropped
    outbox_.push_back(std::move(*rewind));
    return true;
  }

  // Queues the rewind numbered `number` in the live log. The rounds after it this watch has
  // queued may be of before it: the watcher's own, those of the live log and, when the store
  // was read before the rewind was published, those read from it. When there are any, the
  // rounds after it not yet sent are dropped and those committed are read from the store again
  // (returns true); else the rounds sent after it are those run again.
  bool TakeRewindLocked(v1::JobEvent event, size_t number) {
    const uint32_t to = event.rewind().to_round();
    const uint32_t stale = number < read_at_ ? stale_through_ : last_round_;
    if (stale <= to) {
      outbox_.push_back(std::move(event));
      return false;
    }
    std::erase_if(outbox_, [to](const v1::JobEvent& e) { return e.has_round() && e.round().round() > to; });
    outbox_.push_back(std::move(event));
    last_round_ = stale_through_ = to;
    rounds_owed_ = true;
    read_at_pending_ = true;
    return true;
  }

  std::mutex mu_;  // guards the fields below; held while reading the job's events
  std::shared_ptr<JobRunner> runner_;  // null for a job that is not running here
  const v1::Job job_;                  // as it was when the watch started, without last_round
  const RoundPages pages_;
  grpc::ServerWriteReactor<v1::JobEvent>* reactor_;  // null once done
  grpc::CallbackServerContext* const ctx_;           // valid while reactor_ is set
  grpc::Status finish_status_ = grpc::Status::OK;
  std::chrono::steady_clock::time_point write_started_;
  uint64_t subscription_ = 0;
  std::deque<v1::JobEvent> outbox_;
  size_t seen_ = 0;          // the number of the next event to take from the job's log
  size_t notes_before_seen_ = 0;  // the notes (JobEvents::IsNote) among the log's events before seen_
  uint32_t last_round_ = 0;  // the last round queued
  // The rounds up to this one may be of before a rewind not yet taken from the live log: the
  // watcher's own (before from_round) and those queued from the log; those after it, up to
  // last_round_, were read from the store at read_at_.
  uint32_t stale_through_ = 0;
  size_t read_at_ = 0;            // the log's published events when the store's rounds were first read
  bool read_at_pending_ = false;  // the next read of the store sets read_at_
  size_t hoisted_ = 0;            // 1 + the number of the rewind queued first (HoistRewindLocked); 0: none
  bool rounds_owed_ = false;    // the store may hold rounds after last_round_ not yet queued
  bool reading_store_ = false;  // a page is being read, with mu_ released
  bool log_ended_ = false;
  bool cancelled_ = false;
  bool writing_ = false;  // a write is in flight; in_flight_ belongs to it
  bool finish_called_ = false;
  v1::JobEvent in_flight_;
};

// A watch's from_round: 0 (from the first round) or a round the job has or may yet commit, up
// to the one after its last (where a watcher that has seen every round goes on: the job's end).
// A later one would wait for a round that never comes.
Status CheckFromRound(const v1::Job& job, uint32_t from_round) {
  const uint64_t most = uint64_t{job.spec().rounds()} + 1;
  if (from_round <= most) return Status::Ok();
  return InvalidArgumentError("watch of job " + job.id() + ": field 'from_round': " + std::to_string(from_round) +
                              "; expected at most " + std::to_string(most) + " (the job has " +
                              std::to_string(job.spec().rounds()) + " rounds; 0: from the first)");
}

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
    if (Status s = CheckFromRound(*job, request.from_round()); !s.ok()) {
      Finish(ToGrpc(s));
      return;
    }
    auto runner = c->Runner(request.job_id());
    const std::string job_id = request.job_id();
    auto pages = [c, job_id](uint32_t from_round, size_t max_bytes) {
      auto page = c->ListRounds(job_id, from_round, max_bytes);
      if (c->options().watch_page_read_hook) c->options().watch_page_read_hook(job_id);
      return page;
    };
    watch_ = std::make_shared<JobWatch>(std::move(runner), std::move(job).value(), std::move(pages), this, ctx);
    if (Status s = watch_->Start(request.from_round()); !s.ok()) {
      watch_.reset();
      Finish(ToGrpc(s));
      return;
    }
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
    watch_->Pump(/*may_read_store=*/true);
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
      // Without the last round's per-worker reports, as the list gives it: the round's own
      // record holds them, and a round of thousands of clients would pass 4 MiB.
      auto job = c_->ListedJob(request->job_id());
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
    auto listed = c_->JobsReply();
    if (!listed.ok()) return ToGrpc(listed.status());
    *response = std::move(*listed);
    if (response->more() > 0) ctx->AddTrailingMetadata(wire::kMoreEntriesTrailer, std::to_string(response->more()));
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

  grpc::Status DeleteJob(grpc::ServerContext* ctx, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override {
    if (Status s = CheckOperator(ctx); !s.ok()) return ToGrpc(s);
    if (Status s = CheckJobId("delete job", request->job_id()); !s.ok()) return ToGrpc(s);
    auto job = c_->DeleteJob(request->job_id());
    if (!job.ok()) return ToGrpc(job.status());
    *response->mutable_job() = std::move(*job);
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
    const size_t more = c_->registry().ListInto(response->mutable_workers());
    response->set_more(more);
    if (more > 0) ctx->AddTrailingMetadata(wire::kMoreEntriesTrailer, std::to_string(more));
    return grpc::Status::OK;
  }

  grpc::Status ForgetWorker(grpc::ServerContext* ctx, const v1::ForgetWorkerRequest* request,
                            v1::ForgetWorkerResponse*) override {
    if (Status s = CheckOperator(ctx); !s.ok()) return ToGrpc(s);
    if (Status s = CheckName("forget worker", "name", request->name()); !s.ok()) return ToGrpc(s);
    return ToGrpc(c_->ForgetWorker(request->name()));
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
