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
#include "core/data/idx.h"
#include "core/data/partition.h"
#include "core/model/model.h"
#include "core/train/client_algorithms.h"
#include "core/train/trainer.h"
#include "core/update_codec.h"
#include "device/emulated/factory.h"
#include "device/measure.h"
#include "device/registry.h"
#include "collectives/registry.h"
#include "proto/job_mapping.h"
#include "proto/update_envelope.h"
#include "worker/cohort.h"
#include "worker/error_feedback.h"
#include "worker/join_retry.h"
#include "worker/round_download.h"
#include "worker/task_checks.h"
#include "worker/worker_metrics.h"

namespace tessera::worker {
namespace {

using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

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
                         interval = std::clamp<uint32_t>(joined.heartbeat_interval_ms(), 100, 60000)] {
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
      // A job's end (round 0) is logged by ReleaseEndedJobs, once its data is released.
      if (cancel.round() != 0) {
        spdlog::info("round {} attempt {} of job {} cancelled: {}", cancel.round(), cancel.attempt(),
                     QuoteUntrusted(cancel.job_id()), EscapeUntrusted(cancel.reason(), kMaxReasonChars));
      }
    } else if (task.has_verdict() && !task.verdict().accepted()) {
      spdlog::warn("update for job {} round {} refused: {}", QuoteUntrusted(task.verdict().job_id()),
                   task.verdict().round(), EscapeUntrusted(task.verdict().reason(), kMaxReasonChars));
    }
    cv_.notify_all();
  });
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
      // Every queued task is this session's: a new session clears the queue.
      identity = {worker_id_, session_};
    }
    v1::UpdateHeader header;
    UpdateParts parts;
    // A paced emulated device sleeps until its modelled time since its clock was reset has
    // passed: reset at each task, so that the time it sat idle between rounds is not banked
    // as slack that lets its next round run at the host's speed.
    ResetEmulatedClock(*device_);
    Status s = Train(task, identity, &header, &parts, device_.get());
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
        if (auto other = CreateDevice(fallback); other.ok()) {
          header.Clear();
          parts.clear();
          s = Train(task, identity, &header, &parts, other->get());
        } else {
          s = other.status().WithContext("fallback device '" + fallback + "'");
        }
      }
    }
    if (s.ok() && options_.after_training) options_.after_training(task);
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
    } else if (Status up = Upload(task, std::move(header), std::move(parts)); !up.ok()) {
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
  auto sent = client_->UploadUpdate(header, std::make_shared<const wire::UpdateBytes>(), options_.chunk_bytes);
  if (!sent.ok()) spdlog::warn("could not report the failure to the coordinator: {}", sent.status().message());
}

Status WorkerAgent::Train(const v1::TrainTask& task, const Identity& identity, v1::UpdateHeader* out_header,
                          UpdateParts* out_parts, Device* device) {
  const std::string what = "job " + task.job_id() + " round " + std::to_string(task.round());
  const std::string& worker_id = identity.worker_id;
  const std::string& session = identity.session;
  reached_device_ = false;
  cohort_failed_ = false;
  RETURN_IF_ERROR(CheckTask(task, what));
  RETURN_IF_ERROR(CheckDeadline(task, what, std::chrono::system_clock::now()));
  // Whether to give up the round: a stop, its deadline passed, or a cancel of it. Training asks
  // between its steps; a paced emulated device asks while it sleeps, from the model's copy to
  // the device on, so that its modelled time does not hold the round past any of them.
  const std::function<bool()> round_over = [this, job = task.job_id(), round = task.round(),
                                            attempt = task.attempt(), deadline = task.deadline_unix_ms()] {
    if (stop_) return true;
    const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
    if (deadline > 0 && now > deadline) return true;
    std::lock_guard<std::mutex> lock(mu_);
    return IsCancelledLocked(job, round, attempt);
  };
  SetEmulatedPacingStop(*device, round_over);
  struct PacingStopReset {
    Device* device;
    ~PacingStopReset() { SetEmulatedPacingStop(*device, nullptr); }
  } pacing_stop_reset{device};
  // The global model: inside the task when it is small, else downloaded.
  const auto download_start = Clock::now();
  ASSIGN_OR_RETURN(const uint64_t max_download, DownloadBound(task, what));
  TensorSet downloaded;
  if (task.has_inline_model()) {
    ASSIGN_OR_RETURN(downloaded, wire::ReadInlineModel(task.inline_model(),
                                                       "model version " + std::to_string(task.model_version()) +
                                                           " of job " + task.job_id() + " (in its task)",
                                                       max_download));
  } else {
    v1::DownloadModelRequest request;
    request.set_worker_id(worker_id);
    request.set_session(session);
    request.set_job_id(task.job_id());
    request.set_model_version(task.model_version());
    ASSIGN_OR_RETURN(downloaded, client_->DownloadModel(request, max_download, task.round(), task.attempt()));
  }
  const double download_ms = MillisSince(download_start);
#ifdef __GLIBC__
  // The transport's buffers of a large download are freed in pieces that glibc keeps (5-20 MB
  // for a 10 MiB model): handed back before training allocates its own.
  if (!options_.keep_round_memory &&
      static_cast<uint64_t>(TotalElements(downloaded)) * sizeof(float) >= kReleaseAboveBytes) {
    malloc_trim(0);
  }
#endif
  TensorSet global;
  ASSIGN_OR_RETURN(auto sets, SplitDownload(std::move(downloaded), task, what, &global));

  // Train on this worker's share (the whole of the dataset it holds).
  const auto load_start = Clock::now();
  ASSIGN_OR_RETURN(auto data, TrainingShare(task));
  const double data_load_ms = MillisSince(load_start);
  if (!task.spec().model().trainer().empty()) {
    return TrainExternally(task, identity, global, *data, out_header, out_parts, download_ms, data_load_ms);
  }
  std::vector<int64_t> indices(static_cast<size_t>(data->count));
  for (int64_t i = 0; i < data->count; ++i) indices[static_cast<size_t>(i)] = i;
  reached_device_ = true;
  auto created =
      CreateModelWithState(wire::ToTrainingModelConfig(task.spec(), task.round(), task.party_index()), device, global);
  if (!created.ok()) return created.status().WithContext(what + ": the model from the global weights");
  std::unique_ptr<Model> model = std::move(created).value();
  // Memory is handed back after each round only for models of kReleaseAboveBytes or more:
  // for a small one the cost (page faults and system calls every round; a tenth of a
  // millisecond each, which slowed 50 workers' tiny rounds 1.5-2x on two cores) buys little.
  large_model_ = static_cast<uint64_t>(model->NumParameters()) * sizeof(float) >= kReleaseAboveBytes;
  // FedBN: tensors declared local keep this seat's own values from its last round.
  const std::string local_seat = SeatOf(task);
  if (const TensorSet* kept = local_tensors_.Find(local_seat)) {
    ASSIGN_OR_RETURN(TensorSet state, model->GetState());
    size_t restored = 0;
    for (NamedTensor& tensor : state) {
      for (const NamedTensor& own : *kept) {
        if (own.name == tensor.name && own.shape == tensor.shape) {
          tensor.values = own.values;
          ++restored;
        }
      }
    }
    if (restored == kept->size()) RETURN_IF_ERROR(model->SetState(state).WithContext(what + ": local tensors"));
  }
  // A coordinator that takes the trained model subtracts the global one itself: for float32
  // updates (not SCAFFOLD's, whose variates need the global model here) no copy of it is kept
  // while training. Not for a model sent compressed: the delta is from the model as decoded
  // here, which the coordinator does not hold.
  const bool scaffold = task.spec().strategy() == "scaffold";
  const bool send_trained = task.takes_trained_weights() && !scaffold &&
                            wire::JobUpdateEncoding(task.spec()) == UpdateEncoding::kFloat32 &&
                            wire::JobDownloadEncoding(task.spec()) == UpdateEncoding::kFloat32;
  if (send_trained) TensorSet().swap(global);
  // Federated evaluation: the global model as downloaded, on this worker's local test split.
  std::optional<EvalReport> local_eval;
  if (task.spec().evaluation().federated()) {
    auto test = LocalTestShare(task);
    if (!test.ok()) {
      spdlog::warn("{}: no federated evaluation: {}", what, test.status().message());
    } else if ((*test)->count > 0) {
      ASSIGN_OR_RETURN(EvalReport eval, Evaluate(*model, **test));
      local_eval = eval;
    }
  }
  TrainOptions options = wire::ToTrainOptions(task.spec(), task.round(), task.party_index());
  // SCAFFOLD: every local gradient is corrected by c - c_i, both from the download.
  std::vector<float> server_control, client_control;
  if (scaffold) {
    if (!sets.count(kServerControlSet) || !sets.count(kClientControlSet)) {
      return FailedPreconditionError(what + ": a scaffold round's model download must carry the sets '" +
                                     kServerControlSet + "' and '" + kClientControlSet + "'; this one has " +
                                     std::to_string(sets.size()) + " sets");
    }
    server_control = FlattenTensors(sets[kServerControlSet]);
    client_control = FlattenTensors(sets[kClientControlSet]);
    options.server_control = &server_control;
    options.client_control = &client_control;
  }
  const std::string job = task.job_id();
  const uint32_t round = task.round();
  const uint32_t attempt = task.attempt();
  options.should_stop = round_over;
  // A site cohort trains as one client: each member takes its slice of every batch and the
  // gradients are averaged across the cohort at each step.
  std::unique_ptr<collectives::Communicator> communicator;
  std::unique_ptr<CohortGradientSync> sync;
  if (!task.cohort().empty()) {
    collectives::CommunicatorOptions comm;
    comm.backend = task.collective_backend().empty() ? "auto" : task.collective_backend();
    // NCCL reduces the gradients where they are, on the GPU; every other backend on the host.
    const bool on_device = comm.backend == "nccl";
    comm.location = on_device ? collectives::BufferLocation::kDevice : collectives::BufferLocation::kHost;
    // The gradients live on this worker's device: NCCL must run on that same GPU.
    if (on_device) {
      comm.device_index = device->capabilities().device_index;
      if (comm.device_index < 0) {
        return FailedPreconditionError(what + ": cohort '" + task.cohort() + "' reduces over nccl, but this worker " +
                                       "computes on " + device->capabilities().name + ", not on a CUDA device");
      }
    }
    comm.rank = static_cast<int>(task.cohort_rank());
    comm.size = static_cast<int>(task.cohort_size());
    comm.prefix = task.rendezvous_prefix();
    comm.bind_address = options_.cohort_address;
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    const CohortWait wait = CohortWaitFor(options_.cohort_timeout_s, task.deadline_unix_ms(),
                                          std::chrono::duration_cast<std::chrono::milliseconds>(now).count());
    comm.timeout_ms = static_cast<int>(wait.timeout.count());
    // A cancel or a stop ends the wait for members that will not come (not the deadline,
    // which bounds the wait itself and is reported as such).
    auto store = std::make_shared<CoordinatorStore>(client_.get(), worker_id, session, [this, job, round, attempt] {
      if (stop_) return true;
      std::lock_guard<std::mutex> lock(mu_);
      return IsCancelledLocked(job, round, attempt);
    });
    auto created = collectives::CreateCommunicator(comm, store);
    if (!created.ok()) {
      cohort_failed_ = true;  // Gloo's rendezvous gives UNAVAILABLE for any failure
      return created.status().WithContext(what + ": cohort '" + task.cohort() + "' rendezvous, waiting " +
                                          wait.Describe());
    }
    communicator = std::move(created).value();
    sync = std::make_unique<CohortGradientSync>(communicator.get(), on_device, wait.round_deadline);
    options.gradient_hook = sync.get();
    options.shard_index = task.cohort_rank();
    options.shard_count = task.cohort_size();
    spdlog::info("{}: cohort '{}' rank {} of {} over {}", what, task.cohort(), task.cohort_rank(), task.cohort_size(),
                 communicator->backend_name());
  }
  spdlog::info("{}: training party {} ({} samples, {} epochs)", what, task.party_index(), indices.size(),
               options.epochs);
  auto local = TrainLocal(*model, *data, indices, options);
  if (!local.ok()) {
    if (!sync || !sync->failed()) return local.status();
    // The cohort's collective failed: a peer stalled, left or called differently. Its leader
    // reports that, whatever the code (a peer's closed connection is UNAVAILABLE).
    cohort_failed_ = true;
    return local.status().WithContext(what + ": cohort '" + task.cohort() + "' rank " +
                                      std::to_string(task.cohort_rank()) + " of " +
                                      std::to_string(task.cohort_size()));
  }
  TrainReport report = std::move(local).value();
  if (large_model_) device->ReleaseCachedMemory();  // the optimiser's state, freed by now
  RecordTraining(report.compute_ms / 1000.0, download_ms / 1000.0);
  if (sync) {
    const double collective = sync->collective_seconds();
    RecordCohortRound(collective, std::max(0.0, report.compute_ms / 1000.0 - collective));
  }

  // The update is the change to the global model, computed in the trained copy's place (or
  // the trained copy itself, for a coordinator that subtracts). The model (parameters, device
  // buffers) goes first: a worker holds at most the global model, one trained copy and the
  // training state at once.
  ASSIGN_OR_RETURN(TensorSet trained, model->GetState());
  {
    TensorSet own;
    for (const ParameterView& view : model->parameter_views()) {
      if (!view.local) continue;
      for (const NamedTensor& tensor : trained) {
        if (tensor.name == view.name) own.push_back(tensor);
      }
    }
    if (!own.empty()) local_tensors_.Keep(local_seat, std::move(own));
  }
  std::set<std::string> buffers;  // SCAFFOLD's: the model's running statistics, which no optimiser steps
  if (scaffold) {
    for (const ParameterView& view : model->parameter_views()) {
      if (!view.trainable) buffers.insert(view.name);
    }
  }
  model.reset();
  if (large_model_) device->ReleaseCachedMemory();  // the training state's blocks, cached by the pool
  v1::UpdateHeader& header = *out_header;
  // FedNova's report: the steps taken and the normaliser they give at the job's momentum.
  header.set_local_steps(report.steps);
  ASSIGN_OR_RETURN(const double step_normalizer, FedNovaNormalizer(report.steps, options.momentum));
  header.set_step_normalizer(step_normalizer);
  if (scaffold) {
    // The client's variate moves to c_i+ = c_i - c + (x - y) / (K lr), K the steps taken
    // (client_algorithms.h); its change travels beside the delta, and the coordinator keeps
    // c_i for this seat.
    ASSIGN_OR_RETURN(ScaffoldClientStep step,
                     ScaffoldClientVariates(global, trained, sets[kServerControlSet], sets[kClientControlSet],
                                            static_cast<double>(report.steps), options.learning_rate));
    // A buffer has no variate (the coordinator keeps it at zero and ignores this set's entries
    // for it): its entries go as zeros, the set keeping the model's layout the coordinator
    // checks, rather than its running statistics' change over K lr.
    for (NamedTensor& t : step.control_delta) {
      if (buffers.count(t.name)) std::fill(t.values.begin(), t.values.end(), 0.0f);
    }
    out_parts->emplace_back(wire::kDeltaSet, DeltaFrom(std::move(trained), global));
    out_parts->emplace_back(kControlDeltaSet, std::move(step.control_delta));
  } else {
    out_parts->emplace_back(wire::kDeltaSet, send_trained ? std::move(trained) : DeltaFrom(std::move(trained), global));
  }
  header.set_trained_weights(send_trained);
  wire::IdentifyUpdate(task, worker_id, session, &header);
  if (local_eval) {
    header.set_eval_samples(static_cast<uint64_t>(local_eval->samples));
    header.set_eval_accuracy(local_eval->accuracy);
    header.set_eval_loss(local_eval->loss);
  }
  header.set_samples(indices.size());
  header.set_compute_ms(report.compute_ms);
  header.set_download_ms(download_ms);
  header.set_data_load_ms(data_load_ms);
  header.set_train_loss(report.mean_loss);
  if (communicator) {
    header.set_cohort_size(task.cohort_size());
    header.set_collective_backend(std::string(communicator->backend_name()));
  }
  spdlog::info("{}: trained (loss {:.4f}, {:.0f} ms compute)", what, report.mean_loss, report.compute_ms);
  return Status::Ok();
}

}  // namespace tessera::worker
