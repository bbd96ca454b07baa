// One update's way in, whichever call carried it: its header checked and admitted, its chunks
// placed in the update's tensors as they come, the whole update submitted to its job. The
// UploadUpdate stream (transfers.h) and the task session's inline updates (services.cc) both
// take updates through it, so an update is judged alike however it travelled.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "base/status.h"
#include "proto/update_assembler.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::server {

class Coordinator;
class JobRunner;

// The updates on their way in, each named by its worker, job, round and attempt. One upload
// of an update is open at a time: a newer one ends the older before it reaches the job. So a
// worker whose upload broke on one connection sends it again on another, even while the old
// call still looks open here (a connection that broke on the worker's side only); and copies
// of one update cannot queue for the upload memory ahead of other workers' updates. Thread-safe.
class UpdatesInFlight {
 public:
  // Claims `key` for an upload now arriving, and returns the claim's id. `end` ends that
  // upload without judging its update, when a newer one of the same update comes: called at
  // most once, under this object's lock, so it must not block nor call back in. A claim
  // already held for `key` is ended so, and replaced.
  uint64_t Claim(const std::string& key, std::function<void()> end);
  // Drops the claim `id` of `key`, unless a newer one replaced it. After it, its `end` is not
  // called.
  void Release(const std::string& key, uint64_t id);
  size_t size() const;

 private:
  struct Claimed {
    uint64_t id = 0;
    std::function<void()> end;
  };
  mutable std::mutex mu_;
  std::map<std::string, Claimed> claims_;
  uint64_t next_id_ = 1;
};

// What the service checks of an upload's header (the caller's credential, the fields' form),
// where a refusal not tied to a selected worker is logged (rate-limited), and the updates in
// flight, shared by every call and session of the service (none: not tracked).
struct UploadChecks {
  std::function<Status(const v1::UpdateHeader&)> header;
  std::function<void(const std::string&)> refused;
  std::shared_ptr<UpdatesInFlight> in_flight;
};

class UpdateIntake {
 public:
  // How the intake ended an update.
  struct Answer {
    // Not OK: the update was not taken up at all (a caller or session refused, a malformed
    // header); an upload call ends with this status and nothing goes down the task channel.
    grpc::Status status;
    v1::UploadResult result;     // when status is OK
    bool verdict_sent = false;   // a refusal already went down the worker's task channel
  };

  // `way`: how the update travels, "call" or "session" (the metric of updates received).
  UpdateIntake(Coordinator* c, UploadChecks checks, std::string way)
      : c_(c), checks_(std::move(checks)), way_(std::move(way)) {}
  ~UpdateIntake() { ReleaseClaim(); }
  UpdateIntake(const UpdateIntake&) = delete;
  UpdateIntake& operator=(const UpdateIntake&) = delete;

  // Checks `header`; nullopt when the update is admitted: its sets are known, its assembler
  // started (no tensor memory yet), budget_bytes() what it may take. Otherwise the answer.
  // Once the caller is authenticated, the update is claimed in checks.in_flight: an upload of
  // it still open is ended, and `superseded` (when set) ends this one if a newer comes.
  std::optional<Answer> Admit(v1::UpdateHeader header, std::function<void()> superseded = nullptr);
  // The update is no longer in flight: a newer upload of it no longer ends this one.
  void ReleaseClaim();

  // After an admitted header.
  const v1::UpdateHeader& header() const { return header_; }
  const std::shared_ptr<JobRunner>& runner() const { return runner_; }
  const std::string& what() const { return what_; }
  uint64_t budget_bytes() const { return budget_bytes_; }
  wire::UpdateAssembler& assembler() { return *assembler_; }

  // A chunk was refused (`why`), or the update ended incomplete: the job is told, and so is
  // the worker. An over-selected worker's update (its round closed with enough updates and
  // cancelled it) is refused without counting against the worker, as AdmitUpload and
  // SubmitUpdate refuse it: among them, one whose upload the worker stopped at the cancel.
  Answer Reject(const Status& why);
  // Every chunk is in: the update decoded and submitted; its buffers serve the job's next ones.
  // `started`: when its transfer began (its upload time runs to the end of the decoding).
  Answer Complete(std::chrono::steady_clock::time_point started);
  // Frees the assembler's buffers (an update that never completed).
  void Abandon() { assembler_.reset(); }

 private:
  // The update is refused: the reply says why, and so does the worker's task channel.
  Answer Refuse(const Status& why);

  Coordinator* const c_;
  const UploadChecks checks_;
  const std::string way_;
  v1::UpdateHeader header_;
  std::shared_ptr<JobRunner> runner_;
  std::string what_;
  uint64_t budget_bytes_ = 0;
  std::unique_ptr<wire::UpdateAssembler> assembler_;  // started once the header is admitted
  std::string claimed_;  // this update's key in checks_.in_flight, once claimed
  uint64_t claim_id_ = 0;
};

}  // namespace tessera::server
