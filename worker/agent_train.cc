// A round's local training on the worker (WorkerAgent::Train, worker/agent.h): the task's
// checks, the model's download, the worker's share of the data, the steps on the device (or
// through the cohort's collectives, or an external trainer) and the update's parts.
#include <spdlog/spdlog.h>

#ifdef __GLIBC__
#include <malloc.h>  // malloc_trim
#endif

#include <algorithm>
#include <chrono>
#include <string>

#include "base/escape.h"
#include "collectives/registry.h"
#include "core/data/dataset_source.h"
#include "core/model/model.h"
#include "core/train/client_algorithms.h"
#include "core/train/trainer.h"
#include "core/update_codec.h"
#include "device/emulated/factory.h"
#include "proto/job_mapping.h"
#include "proto/update_envelope.h"
#include "worker/agent.h"
#include "worker/cohort.h"
#include "worker/round_deadline.h"
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

Status WorkerAgent::Train(const v1::TrainTask& task, const Identity& identity, v1::UpdateHeader* out_header,
                          UpdateParts* out_parts, NonNegativeBases* out_bases, Device* device) {
  const std::string what = "job " + task.job_id() + " round " + std::to_string(task.round());
  const std::string& worker_id = identity.worker_id;
  const std::string& session = identity.session;
  reached_device_ = false;
  cohort_failed_ = false;
  RETURN_IF_ERROR(CheckTask(task, what));
  RETURN_IF_ERROR(CheckDeadline(task, what, std::chrono::system_clock::now()));
  // Whether to give up the round: a stop, its deadline passed, a cancel of it or of its job, or
  // the end of the session that handed it out. Training asks
  // between its steps; a paced emulated device asks while it sleeps, from the model's copy to
  // the device on, so that its modelled time does not hold the round past any of them.
  const std::function<bool()> round_over = [this, job = task.job_id(), round = task.round(),
                                            attempt = task.attempt(), deadline = task.deadline_unix_ms(), session] {
    if (stop_) return true;
    if (deadline > 0 && NowUnixMs() > deadline) return true;
    std::lock_guard<std::mutex> lock(mu_);
    return IsCancelledLocked(job, round, attempt) || SessionEndedLocked(session);
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
    ASSIGN_OR_RETURN(downloaded, client_->DownloadModel(request, max_download, task.round(), task.attempt(),
                                                        task.deadline_unix_ms()));
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
    return TrainExternally(task, identity, global, *data, out_header, out_parts, out_bases, download_ms,
                           data_load_ms);
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
    const CohortWait wait = CohortWaitFor(options_.cohort_timeout_s, task.deadline_unix_ms(), NowUnixMs());
    comm.timeout_ms = static_cast<int>(wait.timeout.count());
    // A cancel or a stop ends the wait for members that will not come (not the deadline,
    // which bounds the wait itself and is reported as such).
    auto store =
        std::make_shared<CoordinatorStore>(client_.get(), worker_id, session, [this, job, round, attempt, session] {
          if (stop_) return true;
          std::lock_guard<std::mutex> lock(mu_);
          return IsCancelledLocked(job, round, attempt) || SessionEndedLocked(session);
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
  if (!local.ok() && local.status().code() == StatusCode::kCancelled) {
    std::lock_guard<std::mutex> lock(mu_);
    if (SessionEndedLocked(session)) {
      return local.status().WithContext(what + ": its session ended (the task channel closed or the worker joined "
                                               "again), so its update would be refused");
    }
  }
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
  if (report.skipped_batches > 0) {
    spdlog::warn("{}: skipped the batches that gave {} one sample ({} in all): batch norm '{}' would hold one "
                 "value per channel, with no batch variance",
                 what, task.cohort_size() > 1 ? "a cohort member" : "this worker", report.skipped_batches,
                 report.skipped_for);
  }
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
  // A sent trained model (global dropped) is its own base: zeros.
  ASSIGN_OR_RETURN(*out_bases, NonNegativeBasesOf(task, trained, global));
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
