// The workers the coordinator knows: their sessions, liveness and task channels.
//
// A worker's name is its identity: a worker that joins again under the same name (after a
// restart, or after the coordinator restarted) takes over its seat, with a new session and a
// new session generation. Work handed to the old generation is considered lost.
//
// Task channels are pushed to, not polled: the server end of each open channel registers a
// TaskChannelSink, and the registry tells it when a task is queued and when it must finish.
// No call blocks. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "proto/list_reply.h"
#include "tessera/v1/job_service.pb.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::server {

struct WorkerRegistryOptions {
  // A worker is lost at once when its task channel closes (it died, its connection broke);
  // heartbeats catch what a connection does not say (a host that vanished, a half-open NAT
  // mapping). Every 5 s, 15 s of silence: 1,000 idle workers cost the coordinator 200
  // calls a second, not 1,000.
  // Dead connections are found by the coordinator's keepalive pings (within 30 s) and a closed
  // task channel drops its worker at once; heartbeats catch a hung worker process.
  uint32_t heartbeat_interval_ms = 15000;
  uint32_t heartbeat_timeout_ms = 45000;  // no heartbeat for this long: the worker is lost
  // Worker names the registry knows at most (joined, lost, or known from before a restart): a
  // join under a new name past it is refused, so that whoever holds a join token cannot grow
  // the coordinator's memory and state store without bound by inventing names. Known names
  // always rejoin.
  size_t max_workers = 100000;
  // Where liveness reads the time (tests move a ManualClock instead of sleeping); must
  // outlive the registry.
  const Clock* clock = &SteadyClock();
  // The coordinator's own pauses (the process stopped, its VM paused, starved of CPU) are not
  // counted as its workers' silence: the heartbeats sent meanwhile wait unread in its sockets,
  // and a round looking at liveness as it wakes would otherwise drop every worker it has. A
  // thread ticks every pause_tick; the time by which a tick comes later than pause_tick +
  // pause_slack (or is overdue so, while it is) is a pause, and a worker's silence is the time
  // since it was last heard less the pauses since. Unset: 250 ms on the steady clock, not
  // watched on another (a test moving a ManualClock far at once means the workers' silence);
  // 0: not watched.
  std::optional<std::chrono::milliseconds> pause_tick;
  std::chrono::milliseconds pause_slack{1000};
};

// The server end of one open task channel, as the registry sees it. The registry calls these
// from the thread that queued the task (or rejoined, or shut down), never while holding its
// own lock, so an implementation may call back into the registry (TakeTask, CloseChannel).
// They must not block. The registry keeps the sink alive while it is attached; a call may
// still arrive just after the channel closed, and must then do nothing.
class TaskChannelSink {
 public:
  virtual ~TaskChannelSink() = default;
  // One or more tasks are waiting in TakeTask.
  virtual void TasksQueued() = 0;
  // A newer session of the worker, a newer channel of the same session, or Shutdown():
  // TakeTask now reports the channel closed, and the stream should finish.
  virtual void Superseded() = 0;
};

// A message for a worker's task channel and what rides with it.
struct OutgoingTask {
  v1::Task task;
  // A TrainTask as bytes instead of `task` (then left empty): the round's shared part,
  // serialized once and shared by every worker's task, and this worker's own fields after it
  // (wire::TrainTaskWire).
  std::shared_ptr<const std::string> train_shared;
  std::string train_own;
  // A serialized v1::InlineModel the channel writes as the TrainTask's inline_model, shared
  // with every other task of the same model version (no copy per worker); null for none.
  std::shared_ptr<const std::string> inline_model;
  // Called as the message is handed to the transport, just before its write starts (not when
  // it is dropped): the worker may answer it before the write's completion runs.
  std::function<void()> on_written;
};

class WorkerRegistry {
 public:
  explicit WorkerRegistry(WorkerRegistryOptions options);
  ~WorkerRegistry();  // stops the pause watch
  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;

  // Workers known from before a restart: listed, not alive, with no session until they join.
  void Restore(const std::vector<v1::WorkerStatus>& workers);
  // The worker's status as List() shows it (for persisting after a join).
  std::optional<v1::WorkerStatus> Describe(const std::string& worker_id) const;
  // RESOURCE_EXHAUSTED when `name` is new and the registry knows max_workers names already;
  // asked before a join binds the name in the state store (Join asks again under its lock).
  Status Admits(const std::string& name) const;
  // Admits a worker (the join token was already checked). Returns its id and a new session.
  Result<v1::JoinResponse> Join(const v1::JoinRequest& request);
  // UNAUTHENTICATED when `session` is not the worker's current one.
  // `generation`, when given, receives the session's generation, read under the same lock: a
  // join that supersedes the session cannot fall between the check and the read.
  Status Authenticate(const std::string& worker_id, const std::string& session, uint64_t* generation = nullptr) const;
  Status Heartbeat(const std::string& worker_id, const std::string& session, const std::string& state);

  // The current session generation, or 0 for an unknown worker.
  uint64_t Generation(const std::string& worker_id) const;
  // Alive: heard from within the heartbeat timeout, its task channel not lost, and still on
  // `generation` when given.
  bool IsAlive(const std::string& worker_id, uint64_t generation = 0) const;
  // Alive workers with an open task channel, sorted by id.
  std::vector<std::string> ReadyWorkers() const;

  // Messages queued for one worker's channel at most; past it the oldest is dropped.
  static constexpr size_t kMaxOutbox = 1024;

  // Queues a task for the worker's channel and tells its sink, if one is attached. Fails
  // when the worker is unknown. A worker with kMaxOutbox messages waiting loses its oldest.
  Status Send(const std::string& worker_id, v1::Task task);
  Status Send(const std::string& worker_id, OutgoingTask task);
  // The worker joined saying it takes small models inside its tasks
  // (JoinRequest.accepts_inline_model).
  bool AcceptsInlineModel(const std::string& worker_id) const;
  // Marks the worker's task channel open for `generation` and attaches `sink` to it (the
  // registry shares its ownership until the channel closes or is superseded). A sink already
  // attached for the worker is told Superseded(). UNAUTHENTICATED when `generation` is
  // stale, UNAVAILABLE after Shutdown(). Tasks already queued are announced to `sink`.
  Status OpenChannel(const std::string& worker_id, uint64_t generation, std::shared_ptr<TaskChannelSink> sink);
  // The channel of `generation` is gone (the worker went away or the stream ended): the
  // worker counts as lost until it joins again or reopens its channel, and `sink` is
  // detached if it is the one attached. Idempotent; a stale generation, or a `sink` that a
  // newer channel of the same session already replaced, changes nothing.
  void CloseChannel(const std::string& worker_id, uint64_t generation, const TaskChannelSink* sink = nullptr);
  // The next queued task for the channel of `generation`, or nullopt. *closed is set (and
  // nullopt returned) once that generation is superseded or the registry has shut down.
  std::optional<OutgoingTask> TakeOutgoing(const std::string& worker_id, uint64_t generation, bool* closed);
  // Messages dropped from full outboxes since the registry started.
  uint64_t outbox_dropped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return outbox_dropped_;
  }
  // TakeOutgoing as one message: an inline model is parsed into the task.
  std::optional<v1::Task> TakeTask(const std::string& worker_id, uint64_t generation, bool* closed);

  // A refused or failed update of the worker's, for `tessera workers`' REJECTED column.
  void RecordRejected(const std::string& worker_id);
  // A committed round or asynchronous step: every worker whose update it folded ("accepted"
  // in its report) has one more round completed. Counted here, not when an update is
  // accepted, so that an attempt retried or discarded adds nothing.
  void RecordCommitted(const v1::RoundRecord& record);
  // The cohort the worker joined with ("" for none).
  std::string Cohort(const std::string& worker_id) const;
  // Every worker's status, in name order.
  std::vector<v1::WorkerStatus> List() const;
  // The first workers' statuses, in name order, as one list reply carries them (at most
  // `max_entries`, and bounded as every list reply is, proto/list_reply.h), copying no more
  // than it sends; returns how many workers were left out.
  size_t ListInto(google::protobuf::RepeatedPtrField<v1::WorkerStatus>* out,
                  size_t max_entries = wire::kMaxListEntries) const;
  // How many workers are alive and how many are not, without copying their statuses (what
  // the metrics endpoint reads on every scrape).
  struct Counts {
    size_t alive = 0;
    size_t gone = 0;
  };
  Counts CountByLiveness() const;
  const WorkerRegistryOptions& options() const { return options_; }

  // Removes a worker gone for good, so that its name no longer counts toward max_workers
  // and a worker joining under it later is a new one. FAILED_PRECONDITION naming it while it
  // is alive (its session would go on); NOT_FOUND for a name the registry does not know. A
  // channel still attached (a worker that stopped heartbeating) is told Superseded().
  // `removed`, when given, receives the worker's status as List() showed it.
  Status Forget(const std::string& name, v1::WorkerStatus* removed = nullptr);

  // Tells every attached sink Superseded() and refuses channels from now on.
  void Shutdown();

 private:
  struct Worker {
    std::string session;
    uint64_t generation = 0;
    std::chrono::steady_clock::time_point last_heard;
    std::chrono::nanoseconds paused_at_heard{0};  // PausedLocked() when last heard
    int64_t last_heard_unix_ms = 0;
    bool channel_open = false;
    bool channel_lost = false;  // its task channel closed: the worker died or must rejoin
    bool accepts_inline_model = false;
    std::deque<OutgoingTask> outbox;
    std::shared_ptr<TaskChannelSink> sink;  // the open channel of `generation`, if any
    v1::WorkerStatus status;
  };
  Status AdmitsLocked(const std::string& name) const;  // Admits(), under mu_
  bool IsAliveLocked(const Worker& w) const;
  // Marks `w` heard now, for its liveness (under mu_); a heartbeat or a join also sets its
  // last_heard_unix_ms, which List() shows.
  void HeardLocked(Worker& w);
  // The coordinator's pauses so far, the one under way included (under mu_).
  std::chrono::nanoseconds PausedLocked(Clock::TimePoint now) const;
  void WatchPauses();  // the pause watch's thread
  // The worker's status as List() shows it. Under mu_.
  v1::WorkerStatus StatusLocked(const Worker& w) const;

  WorkerRegistryOptions options_;
  mutable std::mutex mu_;  // guards everything below; never held while calling a sink
  std::map<std::string, Worker> workers_;
  uint64_t next_generation_ = 1;
  bool shutdown_ = false;
  uint64_t outbox_dropped_ = 0;
  std::chrono::milliseconds pause_tick_{0};  // 0: pauses not watched
  Clock::TimePoint last_tick_;               // the pause watch's last tick
  std::chrono::nanoseconds paused_{0};       // the pauses of ticks that came late

  std::mutex pause_mu_;  // the pause watch's wait; taken before mu_, never while holding it
  std::condition_variable pause_cv_;
  bool pause_stop_ = false;  // guarded by pause_mu_
  std::thread pause_thread_;
};

std::string RandomHex(size_t bytes);  // from the OS's random source
int64_t UnixMillis();

}  // namespace tessera::server
