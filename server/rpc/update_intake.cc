#include "server/rpc/update_intake.h"

#include <algorithm>
#include <map>
#include <utility>

#include "base/escape.h"
#include "proto/grpc_status.h"
#include "proto/update_envelope.h"
#include "server/coordinator.h"
#include "server/monitoring/coordinator_metrics.h"

namespace tessera::server {

using wire::ToGrpc;

uint64_t UpdatesInFlight::Claim(const std::string& key, std::function<void()> end) {
  std::lock_guard<std::mutex> lock(mu_);
  Claimed& claimed = claims_[key];
  // Under the lock: the older upload cannot release its claim, and so cannot be gone, meanwhile.
  if (claimed.end) claimed.end();
  claimed.id = next_id_++;
  claimed.end = std::move(end);
  return claimed.id;
}

void UpdatesInFlight::Release(const std::string& key, uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = claims_.find(key);
  if (it != claims_.end() && it->second.id == id) claims_.erase(it);
}

size_t UpdatesInFlight::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return claims_.size();
}

void UpdateIntake::ReleaseClaim() {
  if (claimed_.empty()) return;
  checks_.in_flight->Release(claimed_, claim_id_);
  claimed_.clear();
}

std::optional<UpdateIntake::Answer> UpdateIntake::Admit(v1::UpdateHeader header, std::function<void()> superseded) {
  header_ = std::move(header);
  Status checked = checks_.header(header_);
  if (checked.ok()) checked = c_->registry().Authenticate(header_.worker_id(), header_.session());
  if (!checked.ok()) return Answer{ToGrpc(checked), {}, false};
  if (checks_.in_flight) {
    // The worker id and the job id are names (checked above): no '/' in either.
    claimed_ = header_.worker_id() + "/" + header_.job_id() + "/" + std::to_string(header_.round()) + "/" +
               std::to_string(header_.attempt());
    claim_id_ = checks_.in_flight->Claim(claimed_, std::move(superseded));
  }
  header_.set_failure(EscapeUntrusted(header_.failure(), 512));  // kept in the round's record
  runner_ = c_->Runner(header_.job_id());
  if (!runner_) return Refuse(NotFoundError("job '" + header_.job_id() + "' is not running on this coordinator"));
  // Refused early, before any tensor is read, when the header alone disqualifies it.
  if (Status admitted = runner_->AdmitUpload(header_); !admitted.ok()) {
    if (admitted.code() != StatusCode::kInvalidArgument) checks_.refused(admitted.message());
    // A selected worker's malformed update is rejected; one late by the protocol (crossing
    // an over-selected cancel, too stale) is refused without counting against the worker.
    runner_->RefuseArrival(header_, admitted);
    return Refuse(admitted);
  }
  if (!header_.failure().empty()) {
    Status noted = runner_->ReportFailure(header_);
    Answer answer;
    answer.result.set_accepted(noted.ok());
    answer.result.set_reason(noted.ok() ? "failure noted" : noted.message());
    return answer;
  }
  what_ = "update from worker '" + header_.worker_id() + "' for job " + header_.job_id() + " round " +
          std::to_string(header_.round());
  auto sets = wire::UpdateSets(header_, what_);  // checked by AdmitUpload already
  if (!sets.ok()) {
    runner_->RejectUpload(header_, sets.status());
    return Refuse(sets.status());
  }
  // Each set is checked against its encoding's sizes now; its tensors take memory only as
  // their chunks arrive, decoded to float32.
  const double topk_fraction = runner_->DeltaEncoding().second;
  assembler_ = std::make_unique<wire::UpdateAssembler>(what_, runner_->update_bytes(), topk_fraction,
                                                       &runner_->update_buffers());
  // The delta's norm and finiteness read from its chunks as they land (a trained model is
  // made a delta later, and scanned then).
  if (!header_.trained_weights()) assembler_->ScanSet(std::string(wire::kDeltaSet));
  if (Status started = assembler_->Start(*sets); !started.ok()) {
    runner_->RejectUpload(header_, started);
    return Refuse(started);
  }
  budget_bytes_ = std::min<uint64_t>(assembler_->decoded_bytes(), runner_->update_bytes());
  return std::nullopt;
}

UpdateIntake::Answer UpdateIntake::Reject(const Status& why) {
  if (runner_->CancelledAsOverSelected(header_)) {
    checks_.refused(why.message());
  } else {
    runner_->RejectUpload(header_, why);
  }
  return Refuse(why);
}

UpdateIntake::Answer UpdateIntake::Complete(std::chrono::steady_clock::time_point started) {
  const uint64_t received = assembler_->bytes_received();
  RecordUploadBytes(header_.worker_id(), received);
  RecordUpdateReceived(way_);
  auto decoded = assembler_->Finish();
  const TensorScans scans = assembler_->TakeScans();
  assembler_.reset();
  const double upload_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  if (!decoded.ok()) return Reject(decoded.status());
  std::map<std::string, TensorSet> sets = std::move(decoded).value();
  TensorSet delta = std::move(sets[wire::kDeltaSet]);
  sets.erase(wire::kDeltaSet);
  Status verdict = runner_->SubmitUpdate(header_, delta, upload_ms, sets, received, scans.empty() ? nullptr : &scans);
  // Folded, refused, or taken by the aggregate to fold beside others (which gives the buffers
  // back once folded): the tensors' buffers serve the next uploads of the job.
  runner_->update_buffers().Give(std::move(delta));
  for (auto& [name, set] : sets) runner_->update_buffers().Give(std::move(set));
  if (!verdict.ok()) return Refuse(verdict);
  Answer answer;
  answer.result.set_accepted(true);
  return answer;
}

UpdateIntake::Answer UpdateIntake::Refuse(const Status& why) {
  Answer answer;
  answer.result.set_accepted(false);
  answer.result.set_reason(why.message());
  v1::Task verdict;
  verdict.mutable_verdict()->set_job_id(header_.job_id());
  verdict.mutable_verdict()->set_round(header_.round());
  verdict.mutable_verdict()->set_attempt(header_.attempt());
  verdict.mutable_verdict()->set_accepted(false);
  verdict.mutable_verdict()->set_reason(why.message());
  c_->registry().Send(header_.worker_id(), std::move(verdict)).ok();
  answer.verdict_sent = true;
  return answer;
}

}  // namespace tessera::server
