// The worker's upload of a round's update: the delta (and any payload sets) encoded as the job
// says, its running variances kept from taking the coordinator's model below 0, top-k's error
// feedback kept per seat, and the coordinator's verdict (WorkerAgent, worker/agent.h).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/escape.h"
#include "core/model/model.h"
#include "core/update_codec.h"
#include "proto/job_mapping.h"
#include "proto/update_envelope.h"
#include "worker/agent.h"
#include "worker/error_feedback.h"
#include "worker/worker_metrics.h"

namespace tessera::worker {

Result<NonNegativeBases> NonNegativeBasesOf(const v1::TrainTask& task, const TensorSet& delta,
                                            const TensorSet& global) {
  std::vector<std::string> names;
  RETURN_IF_ERROR(CountParameters(wire::ToModelConfig(task.spec()), &names).status());
  NonNegativeBases bases;
  for (size_t i = 0; i < delta.size(); ++i) {
    if (std::find(names.begin(), names.end(), delta[i].name) == names.end()) continue;
    // The delta has the global model's layout (checked as it was made).
    bases.emplace_back(i, global.empty() ? std::vector<float>(delta[i].values.size(), 0.0f) : global[i].values);
  }
  return bases;
}

Status WorkerAgent::Upload(const v1::TrainTask& task, v1::UpdateHeader header, UpdateParts parts,
                           const NonNegativeBases& bases) {
  const std::string what = "job " + header.job_id() + " round " + std::to_string(header.round());
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_ = "uploading " + what;
  }
  const UpdateEncoding encoding = wire::JobUpdateEncoding(task.spec());
  const double fraction = wire::TopKFraction(task.spec());
  const std::string seat = SeatOf(task);
  // Top-k's error feedback: the delta plus what this seat has not sent yet; `unsent` is what
  // stays behind if the coordinator takes this update.
  const bool feedback = encoding == UpdateEncoding::kTopK;
  TensorSet unsent;
  wire::UpdateBytes bytes;
  for (auto& [name, tensors] : parts) {
    const bool delta = name == wire::kDeltaSet;
    if (delta && feedback) {
      const TensorSet* found = residuals_.Find(seat);
      if (found != nullptr && CheckSameLayout(tensors, *found, "residual").ok()) {
        for (size_t i = 0; i < tensors.size(); ++i) {
          for (size_t j = 0; j < tensors[i].values.size(); ++j) tensors[i].values[j] += (*found)[i].values[j];
        }
      }
    }
    if (delta) {
      // A running variance must not take the coordinator's model below 0 (its evaluation
      // refuses such a model): not from the training's numerics, an external trainer's values,
      // the residual added or what the encoding reads back.
      for (const auto& [index, base] : bases) {
        if (index >= tensors.size() || base.size() != tensors[index].values.size()) continue;
        NamedTensor& t = tensors[index];
        if (size_t changed = KeepSumNotNegative(encoding, base, t.values, fraction); changed > 0) {
          spdlog::warn("{}: tensor '{}': {} values would have left the coordinator's model below 0; sent so that it "
                       "stays at 0 or more", what, t.name, changed);
        }
      }
    }
    if (delta && feedback) {
      unsent = tensors;
      for (NamedTensor& t : unsent) t.values = EncodingResidual(encoding, t.values, fraction);
    }
    wire::AppendUpdateSet(name, tensors, delta ? encoding : UpdateEncoding::kFloat32, fraction, options_.chunk_bytes,
                          &header, &bytes, upload_xxh3_ ? wire::UpdateDigest::kXxh3 : wire::UpdateDigest::kSha256);
  }
  // Training stops at a cancel only between its steps: one that came during the last step,
  // after it or while the update was encoded is seen here, the last moment before anything is
  // sent. Nothing has been, so the seat's residual is left as it was.
  if (UploadCancelled(task)) return Status::Ok();
  // A worker that joined again since the task came (the coordinator restarted, or refused the
  // session's heartbeat) has forgotten the old session's cancels with it, and the coordinator
  // refuses any update of a session that is not its current one: nothing is sent.
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (header.session() != session_) {
      lock.unlock();
      spdlog::info("job {} round {} attempt {}: trained in a session that has ended (the worker joined again since); "
                   "its update is not uploaded, as the coordinator takes a session's own updates only",
                   QuoteUntrusted(task.job_id()), task.round(), task.attempt());
      return Status::Ok();
    }
  }
  // Bounded by the round's deadline too: the coordinator takes no update after it.
  auto sent = client_->UploadUpdate(header, std::make_shared<const wire::UpdateBytes>(std::move(bytes)),
                                    options_.chunk_bytes, task.deadline_unix_ms());
  // A cancel that came while the update was on its way ended the upload there (its outcome is
  // unknown to the error feedback below: some of it may have reached the coordinator).
  bool cancelled_while_sending = false;
  if (!sent.ok() && sent.status().code() == StatusCode::kCancelled) {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_while_sending = IsCancelledLocked(task.job_id(), task.round(), task.attempt());
  }
  if (feedback) {
    const UploadOutcome outcome =
        !sent.ok() ? UploadOutcome::kUnknown : (sent->accepted() ? UploadOutcome::kTaken : UploadOutcome::kRefused);
    if (auto kept = ResidualAfterUpload(outcome, std::move(unsent))) {
      residuals_.Keep(seat, std::move(*kept));
    } else {
      residuals_.Erase(seat);
    }
  }
  if (cancelled_while_sending) {
    spdlog::info("job {} round {} attempt {}: cancelled while its update was uploading; the rest of it is not sent",
                 QuoteUntrusted(task.job_id()), task.round(), task.attempt());
    return Status::Ok();
  }
  if (!sent.ok()) return sent.status();
  const v1::UploadResult& result = *sent;
  RecordUpdate(result.accepted());
  if (!result.accepted()) {
    ++updates_refused_;
    return FailedPreconditionError(what + ": update refused: " + EscapeUntrusted(result.reason(), kMaxReasonChars));
  }
  ++rounds_trained_;
  spdlog::info("{}: update accepted", what);
  return Status::Ok();
}

}  // namespace tessera::worker
