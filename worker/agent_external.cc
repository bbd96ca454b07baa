// The worker's training through an external trainer process (a PyTorch script, ...): the
// process is started once per trainer name and kept (worker/external_trainer.h); the round's
// model, options and share go to it, the trained model comes back and is sent as its delta
// (WorkerAgent, worker/agent.h).
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>

#include "core/tensor.h"

#include "proto/job_mapping.h"
#include "proto/update_envelope.h"
#include "worker/agent.h"
#include "worker/round_deadline.h"
#include "worker/worker_metrics.h"

namespace tessera::worker {

Status WorkerAgent::TrainExternally(const v1::TrainTask& task, const Identity& identity, const TensorSet& global,
                                    const Dataset& share, v1::UpdateHeader* out_header, UpdateParts* out_parts,
                                    NonNegativeBases* out_bases, double download_ms, double data_load_ms) {
  const std::string& name = task.spec().model().trainer();
  const std::string what = "job " + task.job_id() + " round " + std::to_string(task.round());
  if (!task.cohort().empty()) {
    return FailedPreconditionError(what + ": site cohorts train natively, not with external trainer '" + name + "'");
  }
  auto found = external_.find(name);
  if (found == external_.end()) {
    const auto command = std::find_if(options_.trainers.begin(), options_.trainers.end(),
                                      [&](const TrainerCommand& c) { return c.name == name; });
    if (command == options_.trainers.end()) {
      std::string known;
      for (const auto& c : options_.trainers) known += (known.empty() ? "" : ", ") + c.name;
      return FailedPreconditionError(what + ": the job trains with external trainer '" + name +
                                     "', which this worker does not run (its --trainer flags: " +
                                     (known.empty() ? std::string("none") : known) + ")");
    }
    if (external_dir_.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/tessera-trainer.XXXXXX";
      if (mkdtemp(pattern.data()) == nullptr) {
        return FailedPreconditionError(what + ": cannot make a directory for the external trainer under " + pattern +
                                       ": " + std::strerror(errno));
      }
      external_dir_ = pattern;
    }
    found = external_.emplace(name, std::make_unique<ExternalTrainer>(*command, external_dir_)).first;
  }
  ExternalTrainerRequest request;
  request.job_id = task.job_id();
  request.round = task.round();
  request.attempt = task.attempt();
  request.party = task.party_index();
  const TrainOptions train = wire::ToTrainOptions(task.spec(), task.round(), task.party_index());
  request.epochs = train.epochs;
  request.batch_size = train.batch_size;
  request.learning_rate = train.learning_rate;
  request.momentum = train.momentum;
  request.weight_decay = train.weight_decay;
  request.seed = train.seed;
  // The coordinator's deadline, on this worker's steady clock.
  const auto deadline = TrainerDeadline(task.deadline_unix_ms(), NowUnixMs());
  const std::string job = task.job_id();
  const uint32_t round = task.round(), attempt = task.attempt();
  auto should_stop = [&, job, round, attempt] {
    if (stop_) return true;
    std::lock_guard<std::mutex> lock(mu_);
    return IsCancelledLocked(job, round, attempt) || SessionEndedLocked(identity.session);
  };
  std::string share_key;
  {
    std::lock_guard<std::mutex> lock(mu_);
    share_key = share_key_;
  }
  spdlog::info("{}: training party {} ({} samples) with external trainer '{}'", what, task.party_index(), share.count,
               name);
  ASSIGN_OR_RETURN(ExternalTrainerResult result,
                   found->second->Train(request, global, share, share_key, deadline, should_stop));
  RecordTraining(result.train_ms / 1000.0, download_ms / 1000.0);
  // Its running variances are the trainer's: the upload keeps the model's at 0 or more.
  ASSIGN_OR_RETURN(*out_bases, NonNegativeBasesOf(task, result.model, global));
  TensorSet delta = DeltaFrom(std::move(result.model), global);
  v1::UpdateHeader& header = *out_header;
  wire::IdentifyUpdate(task, identity.worker_id, identity.session, &header);
  header.set_samples(result.samples);
  // The trainer's own time, plus handing the model over and taking it back.
  header.set_compute_ms(result.handover_ms + result.train_ms + result.takeback_ms);
  header.set_download_ms(download_ms);
  header.set_data_load_ms(data_load_ms);
  header.set_train_loss(result.loss);
  out_parts->emplace_back(wire::kDeltaSet, std::move(delta));
  spdlog::info("{}: trained by '{}' (loss {:.4f}, {:.0f} ms; handing over {:.0f} ms, taking back {:.0f} ms)", what, name,
               result.loss, result.train_ms, result.handover_ms, result.takeback_ms);
  return Status::Ok();
}

}  // namespace tessera::worker
