#include "server/workers/worker_registry.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>
#include <utility>

#include "base/escape.h"
#include "base/names.h"

namespace tessera::server {

std::string RandomHex(size_t bytes) {
  static thread_local std::random_device device;
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes * 2);
  for (size_t i = 0; i < bytes; ++i) {
    unsigned v = device() & 0xff;
    out.push_back(kHex[v >> 4]);
    out.push_back(kHex[v & 15]);
  }
  return out;
}

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

WorkerRegistry::WorkerRegistry(WorkerRegistryOptions options) : options_(options) {
  const bool steady = options_.clock == &SteadyClock();
  pause_tick_ = options_.pause_tick.value_or(steady ? std::chrono::milliseconds(250) : std::chrono::milliseconds(0));
  if (pause_tick_.count() > 0) {
    last_tick_ = options_.clock->Now();
    pause_thread_ = std::thread([this] { WatchPauses(); });
  }
}

WorkerRegistry::~WorkerRegistry() {
  {
    std::lock_guard<std::mutex> lock(pause_mu_);
    pause_stop_ = true;
  }
  pause_cv_.notify_all();
  if (pause_thread_.joinable()) pause_thread_.join();
}

void WorkerRegistry::WatchPauses() {
  std::unique_lock<std::mutex> wait_lock(pause_mu_);
  while (!pause_stop_) {
    Clock::TimePoint last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = last_tick_;
    }
    options_.clock->WaitUntil(wait_lock, pause_cv_, last + pause_tick_, [this] { return pause_stop_; });
    if (pause_stop_) break;
    const Clock::TimePoint now = options_.clock->Now();
    std::chrono::nanoseconds paused{0};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (now - last_tick_ > pause_tick_ + options_.pause_slack) {
        paused = now - last_tick_ - pause_tick_;
        paused_ += paused;
      }
      last_tick_ = now;
    }
    if (paused.count() > 0) {
      spdlog::warn("the coordinator did not run for {} ms (stopped, paused, or starved of CPU): its workers' "
                   "silence over that time is not held against them",
                   std::chrono::duration_cast<std::chrono::milliseconds>(paused).count());
    }
  }
}

std::chrono::nanoseconds WorkerRegistry::PausedLocked(Clock::TimePoint now) const {
  if (pause_tick_.count() == 0) return paused_;
  // A tick overdue past the slack: the pause is still under way, or has just ended and the
  // watch has not run since (a round looking at liveness may wake before it).
  const auto overdue = now - last_tick_ - pause_tick_;
  return overdue > options_.pause_slack ? paused_ + overdue : paused_;
}

void WorkerRegistry::HeardLocked(Worker& w) {
  w.last_heard = options_.clock->Now();
  w.paused_at_heard = PausedLocked(w.last_heard);
}

void WorkerRegistry::Restore(const std::vector<v1::WorkerStatus>& workers) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& status : workers) {
    Worker& w = workers_[status.worker_id()];
    if (w.generation != 0) continue;  // already joined in this process
    w.status = status;
    w.status.set_state("not joined since restart");
    w.last_heard = std::chrono::steady_clock::time_point{};
  }
}

std::optional<v1::WorkerStatus> WorkerRegistry::Describe(const std::string& worker_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return std::nullopt;
  return it->second.status;
}

Status WorkerRegistry::AdmitsLocked(const std::string& name) const {
  if (workers_.size() < options_.max_workers || workers_.count(name) != 0) return Status::Ok();
  return ResourceExhaustedError("join refused for worker " + QuoteUntrusted(name, kMaxNameBytes) +
                                ": the coordinator knows " + std::to_string(workers_.size()) +
                                " worker names, its limit (--max-workers " + std::to_string(options_.max_workers) +
                                "); a known name may still rejoin");
}

Status WorkerRegistry::Admits(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return AdmitsLocked(name);
}

Result<v1::JoinResponse> WorkerRegistry::Join(const v1::JoinRequest& request) {
  const std::string& name = request.name();
  if (!request.cohort().empty() && !IsName(request.cohort())) {
    return InvalidArgumentError("join: field 'cohort' " + QuoteUntrusted(request.cohort()) +
                                ": expected at most 128 letters, digits, '-', '_' or '.'");
  }
  if (name.empty() || name.size() > kMaxNameBytes) {
    return InvalidArgumentError("join: field 'name': expected 1 to 128 characters, got " +
                                std::to_string(name.size()));
  }
  if (!IsName(name)) {
    return InvalidArgumentError("join: field 'name' " + QuoteUntrusted(name) + ": expected letters, digits, '-', '_' or '.'");
  }
  std::unique_lock<std::mutex> lock(mu_);
  RETURN_IF_ERROR(AdmitsLocked(name));
  Worker& w = workers_[name];
  const bool rejoin = w.generation != 0;
  std::shared_ptr<TaskChannelSink> previous = std::move(w.sink);
  w.sink.reset();
  w.session = RandomHex(16);
  w.generation = next_generation_++;
  HeardLocked(w);
  w.last_heard_unix_ms = UnixMillis();
  w.channel_open = false;
  w.channel_lost = false;
  w.outbox.clear();
  w.accepts_inline_model = request.accepts_inline_model();
  w.status.set_worker_id(name);
  w.status.set_name(name);
  *w.status.mutable_device() = request.device();
  w.status.set_cohort(request.cohort());
  w.status.set_state("joined");
  spdlog::info("worker {} {} ({}{})", name, rejoin ? "rejoined" : "joined", request.device().name(),
               request.device().emulated() ? ", emulated" : "");
  v1::JoinResponse response;
  response.set_worker_id(name);
  response.set_session(w.session);
  response.set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
  response.set_heartbeat_timeout_ms(options_.heartbeat_timeout_ms);
  response.set_upload_admission(true);  // the upload service admits every update (server/rpc/transfers.cc)
  response.set_upload_xxh3(true);       // and checks xxh3_128 digests (proto/update_assembler.h)
  lock.unlock();
  if (previous) previous->Superseded();  // the previous generation's channel finishes
  return response;
}

namespace {

// A session is a bearer credential: compared in time that does not depend on where it differs.
bool SameSession(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
}

}  // namespace

Status WorkerRegistry::Authenticate(const std::string& worker_id, const std::string& session,
                                    uint64_t* generation) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.generation == 0) {
    return UnauthenticatedError("worker '" + worker_id + "' is not joined (the coordinator may have restarted); join again");
  }
  if (it->second.session.empty() || !SameSession(it->second.session, session)) {
    return UnauthenticatedError("worker '" + worker_id + "': session credential is not current; join again");
  }
  if (generation != nullptr) *generation = it->second.generation;  // the session's, under the same lock
  return Status::Ok();
}

Status WorkerRegistry::Heartbeat(const std::string& worker_id, const std::string& session, const std::string& state) {
  std::lock_guard<std::mutex> lock(mu_);  // once: authenticate and record under one lock
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.generation == 0) {
    return UnauthenticatedError("worker '" + worker_id.substr(0, 128) +
                                "' is not joined (the coordinator may have restarted); join again");
  }
  Worker& w = it->second;
  if (w.session.empty() || !SameSession(w.session, session)) {
    return UnauthenticatedError("worker '" + worker_id.substr(0, 128) + "': session credential is not current; join again");
  }
  HeardLocked(w);
  w.last_heard_unix_ms = UnixMillis();
  // Escaped and capped by the service. A worker whose task channel closed stays listed as
  // "disconnected", whatever its heartbeats say, until it reopens its channel or joins again:
  // it is not alive, and a state such as "idle" beside that would read as if it were.
  if (!w.channel_lost && !state.empty() && state != w.status.state()) w.status.set_state(state);
  return Status::Ok();
}

bool WorkerRegistry::IsAliveLocked(const Worker& w) const {
  // A worker known from before a restart and not joined since (generation 0) is never alive,
  // however early the clock reads: the steady clock counts from boot, so a coordinator started
  // within a heartbeat timeout of boot would otherwise find its restored workers alive.
  if (w.generation == 0 || w.channel_lost) return false;
  const Clock::TimePoint now = options_.clock->Now();
  const auto silence = (now - w.last_heard) - (PausedLocked(now) - w.paused_at_heard);
  return silence <= std::chrono::milliseconds(options_.heartbeat_timeout_ms);
}

uint64_t WorkerRegistry::Generation(const std::string& worker_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? 0 : it->second.generation;
}

bool WorkerRegistry::IsAlive(const std::string& worker_id, uint64_t generation) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return false;
  if (generation != 0 && it->second.generation != generation) return false;
  return IsAliveLocked(it->second);
}

std::vector<std::string> WorkerRegistry::ReadyWorkers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> ready;
  for (const auto& [id, w] : workers_) {
    if (w.channel_open && IsAliveLocked(w)) ready.push_back(id);
  }
  return ready;
}

Status WorkerRegistry::Send(const std::string& worker_id, v1::Task task) {
  OutgoingTask outgoing;
  outgoing.task = std::move(task);
  return Send(worker_id, std::move(outgoing));
}

bool WorkerRegistry::AcceptsInlineModel(const std::string& worker_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  return it != workers_.end() && it->second.accepts_inline_model;
}

Status WorkerRegistry::Send(const std::string& worker_id, OutgoingTask task) {
  std::shared_ptr<TaskChannelSink> sink;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = workers_.find(worker_id);
    if (it == workers_.end()) return NotFoundError("no worker '" + worker_id + "'");
    std::deque<OutgoingTask>& outbox = it->second.outbox;
    // A worker that takes nothing (no channel open, or one it does not read) while its calls
    // keep making verdicts must not grow the coordinator's memory: past the bound the oldest
    // message goes. The newest are what a worker acts on (only a job's newest task is trained).
    if (outbox.size() >= kMaxOutbox) {
      outbox.pop_front();
      ++outbox_dropped_;
    }
    outbox.push_back(std::move(task));
    sink = it->second.sink;
  }
  if (sink) sink->TasksQueued();
  return Status::Ok();
}

Status WorkerRegistry::OpenChannel(const std::string& worker_id, uint64_t generation,
                                   std::shared_ptr<TaskChannelSink> sink) {
  std::shared_ptr<TaskChannelSink> previous;
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return UnavailableError("worker '" + worker_id + "': the coordinator is shutting down");
    auto it = workers_.find(worker_id);
    if (it == workers_.end() || it->second.generation != generation) {
      return UnauthenticatedError("worker '" + worker_id + "': session superseded; join again");
    }
    Worker& w = it->second;
    previous = std::exchange(w.sink, sink);
    w.channel_open = true;
    w.channel_lost = false;  // a channel reopened in the same session
    HeardLocked(w);
    w.status.set_state("idle");
    queued = !w.outbox.empty();
  }
  if (previous) previous->Superseded();
  if (queued) sink->TasksQueued();
  return Status::Ok();
}

void WorkerRegistry::CloseChannel(const std::string& worker_id, uint64_t generation, const TaskChannelSink* sink) {
  std::shared_ptr<TaskChannelSink> detached;  // released outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it != workers_.end() && it->second.generation == generation) {
    // A channel of this session that another one already replaced: its late close must not
    // mark the worker lost.
    if (sink != nullptr && it->second.sink.get() != sink) return;
    it->second.channel_open = false;
    it->second.channel_lost = true;
    it->second.status.set_state("disconnected");
    if (sink != nullptr && it->second.sink.get() == sink) detached = std::move(it->second.sink);
  }
}

std::optional<OutgoingTask> WorkerRegistry::TakeOutgoing(const std::string& worker_id, uint64_t generation,
                                                         bool* closed) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  *closed = shutdown_ || it == workers_.end() || it->second.generation != generation;
  if (*closed || it->second.outbox.empty()) return std::nullopt;
  OutgoingTask task = std::move(it->second.outbox.front());
  it->second.outbox.pop_front();
  return task;
}

std::optional<v1::Task> WorkerRegistry::TakeTask(const std::string& worker_id, uint64_t generation, bool* closed) {
  std::optional<OutgoingTask> outgoing = TakeOutgoing(worker_id, generation, closed);
  if (!outgoing) return std::nullopt;
  if (outgoing->train_shared) {  // as the worker parses TrainTaskWire's bytes: merged
    auto* train = outgoing->task.mutable_train();
    train->ParseFromString(*outgoing->train_shared);
    train->MergeFromString(outgoing->train_own);
  }
  if (outgoing->inline_model && outgoing->task.has_train()) {
    outgoing->task.mutable_train()->mutable_inline_model()->ParseFromString(*outgoing->inline_model);
  }
  if (outgoing->on_written) outgoing->on_written();
  return std::move(outgoing->task);
}

void WorkerRegistry::RecordRejected(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  it->second.status.set_updates_rejected(it->second.status.updates_rejected() + 1);
}

void WorkerRegistry::RecordCommitted(const v1::RoundRecord& record) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& report : record.workers()) {
    if (report.outcome().rfind("accepted", 0) != 0) continue;
    auto it = workers_.find(report.worker_id());
    if (it == workers_.end()) continue;
    it->second.status.set_rounds_completed(it->second.status.rounds_completed() + 1);
  }
}

std::string WorkerRegistry::Cohort(const std::string& worker_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? std::string() : it->second.status.cohort();
}

std::vector<v1::WorkerStatus> WorkerRegistry::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::WorkerStatus> out;
  out.reserve(workers_.size());
  for (const auto& [id, w] : workers_) out.push_back(StatusLocked(w));
  return out;
}

size_t WorkerRegistry::ListInto(google::protobuf::RepeatedPtrField<v1::WorkerStatus>* out, size_t max_entries) const {
  std::vector<v1::WorkerStatus> first;
  size_t total = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    total = workers_.size();
    first.reserve(std::min(max_entries, total));
    for (auto it = workers_.begin(); it != workers_.end() && first.size() < max_entries; ++it) {
      first.push_back(StatusLocked(it->second));
    }
  }
  const size_t listed = first.size();
  return total - listed + wire::AddBounded(first, out);
}

v1::WorkerStatus WorkerRegistry::StatusLocked(const Worker& w) const {
  v1::WorkerStatus s = w.status;
  s.set_alive(IsAliveLocked(w));
  s.set_last_heartbeat_unix_ms(w.last_heard_unix_ms);
  return s;
}

WorkerRegistry::Counts WorkerRegistry::CountByLiveness() const {
  std::lock_guard<std::mutex> lock(mu_);
  Counts counts;
  for (const auto& [id, w] : workers_) ++(IsAliveLocked(w) ? counts.alive : counts.gone);
  return counts;
}

Status WorkerRegistry::Forget(const std::string& name, v1::WorkerStatus* removed) {
  std::shared_ptr<TaskChannelSink> sink;  // told outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = workers_.find(name);
    if (it == workers_.end()) return NotFoundError("forget worker " + QuoteUntrusted(name, kMaxNameBytes) + ": no such worker");
    Worker& w = it->second;
    // A worker restored from the store and not joined since has no session to go on with.
    if (w.generation != 0 && IsAliveLocked(w)) {
      return FailedPreconditionError("forget worker " + QuoteUntrusted(name, kMaxNameBytes) +
                                     ": it is alive (joined, and heard from within the heartbeat timeout); stop it "
                                     "first, and forget it once it is no longer alive");
    }
    if (removed != nullptr) {
      *removed = w.status;
      removed->set_alive(false);
      removed->set_last_heartbeat_unix_ms(w.last_heard_unix_ms);
    }
    sink = std::move(w.sink);
    workers_.erase(it);
  }
  if (sink) sink->Superseded();  // TakeOutgoing now reports the channel closed
  return Status::Ok();
}

void WorkerRegistry::Shutdown() {
  std::vector<std::shared_ptr<TaskChannelSink>> sinks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    for (auto& [id, w] : workers_) {
      if (w.sink) sinks.push_back(std::move(w.sink));
      w.sink.reset();
    }
  }
  for (auto& sink : sinks) sink->Superseded();
}

}  // namespace tessera::server
