#include "worker/agent.h"

#include <spdlog/spdlog.h>

#ifdef __GLIBC__
#include <malloc.h>  // malloc_trim
#endif
#include <stdlib.h>

#include <algorithm>
#include <random>
#include <map>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "base/escape.h"
#include "base/names.h"
#include "core/data/dataset_source.h"
#include "device/emulated/factory.h"
#include "device/measure.h"
#include "device/registry.h"
#include "proto/job_mapping.h"
#include "worker/error_feedback.h"
#include "worker/heartbeat.h"
#include "worker/join_retry.h"
#include "worker/task_checks.h"
#include "worker/worker_metrics.h"

namespace tessera::worker {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

std::string WorkerAgent::SeatOf(const v1::TrainTask& task) {
  return task.job_id() + "#" + std::to_string(task.party_index());
}

WorkerAgent::WorkerAgent(WorkerOptions options, std::unique_ptr<CoordinatorClient> client)
    : options_(std::move(options)), client_(std::move(client)) {}

WorkerAgent::~WorkerAgent() {
  Stop();
  if (trainer_.joinable()) trainer_.join();
  if (metrics_collector_ != 0) RemoveDeviceCollector(metrics_collector_);
  external_.clear();  // each trainer process is told to exit, and waited for
  if (!external_dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(external_dir_, ignored);
  }
}

void WorkerAgent::SetStopped() {
  {
    // Under the lock: a waiter between its check of stop_ and its sleep would miss the notify.
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
}

void WorkerAgent::Stop() {
  SetStopped();
  client_->CancelTaskChannel();
  client_->CancelTransfers();  // a download or upload in flight would hold Run() for its deadline
}

std::string WorkerAgent::device_name() const { return device_ ? device_->capabilities().name : ""; }

void WorkerAgent::SleepFor(uint32_t ms) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return stop_.load(); });
}

Result<std::unique_ptr<Device>> WorkerAgent::CreateWorkerDevice(const std::string& name) const {
  if (options_.pace_real_time && IsEmulatedDeviceName(name)) {
    return CreateEmulatedDeviceByName(name, EmulatedDeviceOptions{.pace_real_time = true});
  }
  return CreateDevice(name);
}

Status WorkerAgent::OpenDevice() {
  auto device = CreateWorkerDevice(options_.device);
  if (!device.ok()) {
    // Only a device that is not usable here falls back; a name that is wrong stays an error.
    if (device.status().code() != StatusCode::kUnavailable || options_.fallback_device.empty() ||
        options_.fallback_device == options_.device) {
      return device.status();
    }
    spdlog::warn("device '{}' is not usable here ({}); falling back to '{}'", options_.device,
                 device.status().message(), options_.fallback_device);
    device = CreateWorkerDevice(options_.fallback_device);
    if (!device.ok()) return device.status().WithContext("fallback device '" + options_.fallback_device + "'");
  }
  device_ = std::move(device).value();
  if (metrics_collector_ == 0) {
    metrics_collector_ = AddDeviceCollector([this](const std::function<void(Device&)>& read) { read(*device_); });
  }
  // What the coordinator shows for this worker: the device, its measured figures beside its
  // profile's, and what it runs natively.
  const DeviceCapabilities& caps = device_->capabilities();
  device_info_.set_kind(caps.kind);
  device_info_.set_name(caps.name);
  device_info_.set_emulated(caps.emulated);
  // A paced emulated device measures at its modelled speed, which a slow profile makes minutes:
  // a stop of the worker ends the wait.
  SetEmulatedPacingStop(*device_, [this] { return stop_.load(); });
  auto measured = MeasureDevice(*device_, 256);
  SetEmulatedPacingStop(*device_, nullptr);
  if (measured.ok()) {
    device_info_.set_measured_gflops(measured->gemm_gflops);
    device_info_.set_measured_bandwidth_gbps(measured->copy_gbps);
  }
  auto& properties = *device_info_.mutable_properties();
  properties["native_ops"] = std::to_string(caps.native_ops.size()) + "/" + std::to_string(AllOps().size());
  properties["compute_precision"] = std::string(DTypeName(caps.compute_precision));
  if (const DeviceProfile* profile = EmulatedProfile(*device_)) {
    properties["profile"] = profile->name;
    properties["profile_peak_gflops"] = std::to_string(profile->PeakFlops(profile->precision) / 1e9);
    properties["profile_bandwidth_gbps"] = std::to_string(profile->memory_bandwidth_gbps);
    properties["profile_power_w"] = std::to_string(profile->power_watts);
    properties["pace_real_time"] = EmulatedPacesRealTime(*device_) ? "true" : "false";
  }
  return Status::Ok();
}

Status WorkerAgent::Run() {
  // A backoff of 0 would rejoin a coordinator that is down with no wait at all, and keep
  // doing so: doubling 0 gives 0.
  if (options_.backoff_initial_ms == 0 || options_.backoff_max_ms < options_.backoff_initial_ms) {
    return InvalidArgumentError("worker options: backoff_initial_ms must be at least 1 and backoff_max_ms at least "
                                "backoff_initial_ms; got " + std::to_string(options_.backoff_initial_ms) + " and " +
                                std::to_string(options_.backoff_max_ms));
  }
  RETURN_IF_ERROR(OpenDevice());
  spdlog::info("worker {} on device {}", options_.name, device_name());
  trainer_ = std::thread([this] { TrainerLoop(); });
  uint32_t backoff = options_.backoff_initial_ms;
  std::minstd_rand jitter(static_cast<uint32_t>(std::random_device{}()));
  Status result;
  JoinRetryLog join_log;
  while (!stop_) {
    const auto started = Clock::now();
    bool joined = false;
    Status s = RunSession(&joined);
    if (stop_) break;
    // A join refused for a wrong token, a bad name or a certificate will not fix itself. The
    // same codes from a channel the join opened (a coordinator of another version) are retried:
    // a credential refused since is refused again at the next join.
    if (!joined && (s.code() == StatusCode::kPermissionDenied || s.code() == StatusCode::kInvalidArgument)) {
      result = s;
      break;
    }
    if (Clock::now() - started > std::chrono::seconds(10)) backoff = options_.backoff_initial_ms;
    // Jittered (half to all of the backoff), so that the workers of a restarted coordinator do
    // not all rejoin at the same instants.
    const uint32_t wait = backoff / 2 + static_cast<uint32_t>(jitter() % (backoff / 2 + 1));
    if (joined) {
      join_log.Joined();
      spdlog::warn("disconnected from the coordinator ({}); retrying in {} ms", s.message(), wait);
    } else if (auto line = join_log.Failed(s, wait, Clock::now())) {
      spdlog::warn("{}", *line);  // said when it starts or changes, then once a minute (worker/join_retry.h)
    }
    SleepFor(wait);
    backoff = static_cast<uint32_t>(std::min<uint64_t>(uint64_t{backoff} * 2, options_.backoff_max_ms));
  }
  SetStopped();
  if (trainer_.joinable()) trainer_.join();
  return result;
}

Status WorkerAgent::RunSession(bool* joined_out) {
  v1::JoinRequest join;
  join.set_join_token(options_.join_token);
  join.set_name(options_.name);
  join.set_cohort(options_.cohort);
  join.set_local_data_path(options_.data_dir);
  join.set_accepts_inline_model(true);
  *join.mutable_device() = device_info_;
  ASSIGN_OR_RETURN(v1::JoinResponse joined, client_->Join(join));
  *joined_out = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    worker_id_ = joined.worker_id();
    session_ = joined.session();
    session_ended_ = false;
    // What the previous session said is over with it: its queued tasks are not this session's,
    // and its cancels must not stop a task this session hands out again under the same
    // (job, round, attempt), as a restarted coordinator does when it resumes a round.
    tasks_.clear();
    cancelled_.clear();
  }
  upload_xxh3_ = joined.upload_xxh3();
  spdlog::info("joined as {}", QuoteUntrusted(joined.worker_id()));
  if (stop_) return Status::Ok();  // stopped while joining: no channel to open
  std::atomic<bool> session_over{false};
  std::thread heartbeat([&, id = joined.worker_id(), session = joined.session(),
                         interval = HeartbeatIntervalMs(joined.heartbeat_interval_ms(), joined.heartbeat_timeout_ms())] {
    uint64_t failed_beats = 0;  // in a row
    StatusCode last_failure = StatusCode::kOk;
    while (!stop_ && !session_over) {
      v1::HeartbeatRequest beat;
      beat.set_worker_id(id);
      beat.set_session(session);
      {
        std::lock_guard<std::mutex> lock(mu_);
        beat.set_state(state_);
      }
      Status s = client_->Heartbeat(beat);
      if (s.code() == StatusCode::kUnauthenticated) {
        spdlog::warn("heartbeat refused: {}", s.message());
        // End the session (Run() joins again), unless it has ended already (a cancel that
        // finds the channel closed is forgotten at the next join).
        if (!session_over) client_->CancelTaskChannel();
        return;
      }
      // Any other failure (the coordinator unreachable, a refused certificate) is tried again
      // at the next beat: said when it starts or changes, and when beats get through again.
      if (!s.ok()) {
        if (failed_beats++ == 0 || s.code() != last_failure) {
          spdlog::warn("heartbeat failed: {} (tried again every {} ms; a coordinator that hears nothing for its "
                       "heartbeat timeout drops this worker from its rounds)", s.message(), interval);
        }
        last_failure = s.code();
      } else if (failed_beats > 0) {
        spdlog::info("heartbeats reach the coordinator again, after {} failed", failed_beats);
        failed_beats = 0;
      }
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(interval), [&] { return stop_.load() || session_over.load(); });
    }
  });
  v1::TaskChannelRequest open;
  open.set_worker_id(joined.worker_id());
  open.set_session(joined.session());
  Status ended = client_->RunTaskChannel(open, [&](const v1::Task& task) {
    std::lock_guard<std::mutex> lock(mu_);
    if (task.has_train() && !IsName(task.train().job_id(), kMaxJobIdBytes)) {
      // Job ids go into this worker's logs, its state line and an external trainer's errors as
      // they are: one outside the coordinator's own form is not taken.
      spdlog::warn("a task for job {} round {} was ignored: expected a job id of 1 to {} letters, digits, '-', '_' "
                   "or '.'", QuoteUntrusted(task.train().job_id(), 64), task.train().round(), kMaxJobIdBytes);
    } else if (task.has_train()) {
      // Only the newest task of a job matters: one still queued for the same job is superseded
      // now, so the queue holds a task per job. Past kMaxQueuedTasks jobs (a coordinator
      // handing out far more work than one worker does), the oldest task goes.
      const std::string& job = task.train().job_id();
      std::erase_if(tasks_, [&](const v1::TrainTask& queued) { return queued.job_id() == job; });
      if (tasks_.size() >= kMaxQueuedTasks) {
        spdlog::warn("{} tasks queued: dropped the task of job {} round {} for a newer one", tasks_.size(),
                     QuoteUntrusted(tasks_.front().job_id()), tasks_.front().round());
        tasks_.pop_front();
      }
      tasks_.push_back(task.train());
    } else if (task.has_cancel()) {
      const v1::CancelTask& cancel = task.cancel();
      const CancelledTask cancelled{cancel.job_id(), cancel.round(), cancel.attempt()};
      // A job's end matters only where something is held for it (or its task is in hand, which
      // may keep some for it yet); that bounds ended_jobs_ without dropping the end of a job
      // whose data is held.
      if (cancel.round() == 0 && HoldsJobLocked(cancel.job_id())) ended_jobs_.insert(cancel.job_id());
      // A queued task it covers goes now: past kMaxCancels later cancels, it would be trained.
      std::erase_if(tasks_,
                    [&](const v1::TrainTask& q) { return cancelled.Covers(q.job_id(), q.round(), q.attempt()); });
      cancelled_.push_back(cancelled);
      while (cancelled_.size() > kMaxCancels) {
        const auto other = std::find_if(cancelled_.begin(), cancelled_.end(), [&](const CancelledTask& c) {
          return !in_hand_ || !c.Covers(in_hand_->job, in_hand_->round, in_hand_->attempt);
        });
        cancelled_.erase(other != cancelled_.end() ? other : cancelled_.begin());
      }
      // The task's download or upload in flight stops now: the coordinator would refuse its
      // update, and the remaining chunks (up to the whole model's size) would hold the link and
      // the coordinator's admission for nothing.
      client_->CancelUpload(cancel.job_id(), cancel.round(), cancel.attempt());
      // The coordinator's words, escaped and bounded: a reason may quote what a job or a
      // worker said, and a line break in it would forge log lines.
      // A job's end (round 0) is logged by ReleaseEndedJobs, once its data is released. Rate-
      // limited: nothing bounds how many cancels a coordinator sends.
      uint64_t suppressed = 0;
      if (cancel.round() != 0 && cancels_log_.Allow(&suppressed)) {
        spdlog::info("round {} attempt {} of job {} cancelled: {}{}", cancel.round(), cancel.attempt(),
                     QuoteUntrusted(cancel.job_id()), EscapeUntrusted(cancel.reason(), kMaxReasonChars),
                     HeldBackNote(suppressed, "cancels"));
      }
    } else if (task.has_verdict() && !task.verdict().accepted()) {
      // Rate-limited: nothing bounds how many a coordinator sends (of updates never sent too),
      // and an update of this worker's that is refused is logged by its upload as well.
      uint64_t suppressed = 0;
      if (refused_verdicts_log_.Allow(&suppressed)) {
        spdlog::warn("update for job {} round {} refused: {}{}", QuoteUntrusted(task.verdict().job_id()),
                     task.verdict().round(), EscapeUntrusted(task.verdict().reason(), kMaxReasonChars),
                     HeldBackNote(suppressed, "refusals"));
      }
    }
    cv_.notify_all();
  });
  {
    // The task in hand stops at its next step (WorkerAgent::Train): its update would be refused.
    // The queued tasks go now: each would download its model only to stop before its first
    // step, and the next join would clear them anyway.
    std::lock_guard<std::mutex> lock(mu_);
    session_ended_ = true;
    if (!tasks_.empty()) {
      spdlog::info("the task session ended: {} queued task(s) dropped, as the coordinator takes no update of an ended "
                   "session", tasks_.size());
      tasks_.clear();
    }
  }
  session_over = true;
  cv_.notify_all();
  heartbeat.join();
  return ended;
}

void WorkerAgent::TrainerLoop() {
  while (true) {
    v1::TrainTask task;
    Identity identity;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const auto ready = [&] { return stop_.load() || !tasks_.empty() || !ended_jobs_.empty(); };
      if (memory_kept_ && !cv_.wait_for(lock, std::chrono::milliseconds(options_.idle_release_ms), ready)) {
#ifdef __GLIBC__
        lock.unlock();
        malloc_trim(0);  // idle: the kept buffers go back to the kernel
        lock.lock();
#endif
        memory_kept_ = false;
        ++idle_releases_;
      }
      cv_.wait(lock, ready);
      if (stop_) return;
      if (!ended_jobs_.empty()) {  // a job ended: what was held for it goes first
        lock.unlock();
        ReleaseEndedJobs();
        continue;
      }
      // The queue holds the newest task of each job only (a newer one replaces it as it comes).
      task = std::move(tasks_.front());
      tasks_.pop_front();
      if (IsCancelledLocked(task.job_id(), task.round(), task.attempt())) {
        spdlog::info("job {} round {} attempt {}: cancelled before it started", task.job_id(), task.round(),
                     task.attempt());
        continue;
      }
      state_ = "training " + task.job_id() + " round " + std::to_string(task.round());
      in_hand_ = CancelledTask{task.job_id(), task.round(), task.attempt()};
      // Every queued task is this session's: the end of a session and a new one clear the queue.
      identity = {worker_id_, session_};
    }
    v1::UpdateHeader header;
    UpdateParts parts;
    NonNegativeBases bases;
    // A paced emulated device sleeps until its modelled time since its clock was reset has
    // passed: reset at each task, so that the time it sat idle between rounds is not banked
    // as slack that lets its next round run at the host's speed.
    ResetEmulatedClock(*device_);
    Status s = Train(task, identity, &header, &parts, &bases, device_.get());
    if (!s.ok() && reached_device_ &&
        (s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kInternal)) {
      // The device failed (out of memory, a driver error): train this round on the job's
      // fallback device class instead of giving up.
      const std::string fallback = task.spec().fallback_device().empty() ? "cpu" : task.spec().fallback_device();
      if (fallback == device_->capabilities().kind || fallback == options_.device) {
        // The device that failed, or the one this worker was told to use: nothing else to try.
      } else if (!IsDeviceClass(fallback)) {
        // A job names a device class, never a file: "emu:FILE.toml" would have this worker
        // read a file of the job's choosing, and the profile's errors (which quote what the
        // file holds) would go back to the coordinator in the round's failure.
        s = Status(s.code(), s.message() + "; the job's fallback device " + QuoteUntrusted(fallback) +
                                 " is not a device class of this worker (cpu, cuda, xrt or emu:PROFILE), so none "
                                 "was tried");
      } else {
        spdlog::warn("job {} round {}: device {} failed ({}); falling back to '{}' for this round", task.job_id(),
                     task.round(), device_name(), s.message(), fallback);
        // Made as this worker's own device is: an emulated fallback is paced as that one is.
        if (auto other = CreateWorkerDevice(fallback); other.ok()) {
          spdlog::info("job {} round {}: training on the fallback device {}{}", task.job_id(), task.round(),
                       (*other)->capabilities().name, EmulatedPacesRealTime(**other) ? ", paced in real time" : "");
          header.Clear();
          parts.clear();
          bases.clear();
          s = Train(task, identity, &header, &parts, &bases, other->get());
        } else {
          s = other.status().WithContext("fallback device '" + fallback + "'");
        }
      }
    }
    if (s.ok() && options_.after_training) options_.after_training(task);
    if (!s.ok() && options_.after_failed_training) options_.after_failed_training(task, s);
    if (!s.ok()) {
      spdlog::warn("job {} round {}: {}", task.job_id(), task.round(), s.ToString());
      // A broken connection to the coordinator or a cancelled round needs no report; anything
      // else (unreadable data, a device error, a cohort peer's closed connection) is told to
      // the coordinator so the round does not wait for us. A cohort's failure is its leader's
      // to report; a lone worker's task reports its own, whatever rank a task refused for its
      // cohort fields gave it.
      const bool reports = task.cohort().empty() || task.cohort_rank() == 0;
      if (reports && s.code() != StatusCode::kCancelled &&
          (s.code() != StatusCode::kUnavailable || cohort_failed_) && s.code() != StatusCode::kUnauthenticated) {
        ReportFailure(task, identity, s);
      }
    } else if (!task.cohort().empty() && task.cohort_rank() != 0) {
      spdlog::info("job {} round {}: trained my slice; the cohort's leader uploads", task.job_id(), task.round());
    } else if (Status up = Upload(task, std::move(header), std::move(parts), bases); !up.ok()) {
      spdlog::warn("job {} round {}: {}", task.job_id(), task.round(), up.ToString());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      state_ = "idle";
      in_hand_.reset();
      PublishSeatJobsLocked();  // in the same step: a job's seats are in hand or published
    }
#ifdef __GLIBC__
    // The round's buffers (model copies, the update's bytes) are freed; for a large model, hand
    // the pages back so that an idle worker holds its data share and little else (or, keeping
    // them for the next round, once it has been idle a while).
    if (large_model_ && !options_.keep_round_memory) malloc_trim(0);
#endif
    if (options_.keep_round_memory) memory_kept_ = true;
  }
}

bool WorkerAgent::IsCancelledLocked(const std::string& job, uint32_t round, uint32_t attempt) const {
  return std::any_of(cancelled_.begin(), cancelled_.end(),
                     [&](const CancelledTask& c) { return c.Covers(job, round, attempt); });
}

bool WorkerAgent::UploadCancelled(const v1::TrainTask& task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!IsCancelledLocked(task.job_id(), task.round(), task.attempt())) return false;
  }
  spdlog::info("job {} round {} attempt {}: cancelled after training; its update is not uploaded",
               QuoteUntrusted(task.job_id()), task.round(), task.attempt());
  return true;
}

void WorkerAgent::ReportFailure(const v1::TrainTask& task, const Identity& identity, const Status& why) {
  v1::UpdateHeader header;
  wire::IdentifyUpdate(task, identity.worker_id, identity.session, &header);
  header.set_failure(why.ToString());
  // Not bounded by the round's deadline: a report is a header alone, and often says that the
  // deadline passed.
  auto sent = client_->UploadUpdate(header, std::make_shared<const wire::UpdateBytes>(), options_.chunk_bytes, 0);
  if (!sent.ok()) spdlog::warn("could not report the failure to the coordinator: {}", sent.status().message());
}

}  // namespace tessera::worker
