// One simulated worker of the load generator (ClientFleet, client_fleet.h): joins, heartbeats,
// holds its task channel open, downloads each task's model and uploads an update of its
// layout, all on gRPC's callback API, as tessera-worker does over the protocol.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "bench/loadgen/client_fleet.h"
#include "bench/loadgen/download_check.h"
#include "bench/loadgen/update_payload.h"
#include "tessera/v1/worker_service.grpc.pb.h"

namespace tessera::loadgen {

// One simulated worker. Its state is guarded by its own lock, which is never held while a
// gRPC call is started or cancelled (gRPC may run a completion on the calling thread).
class SimulatedClient {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr uint32_t kBackoffInitialMs = 200;  // rejoin backoff, doubled up to the max
  static constexpr uint32_t kBackoffMaxMs = 5000;

  // `generic`, on the same channel as `stub`, carries the downloads and uploads as gRPC's
  // buffers (the payload serialized once, chunks checked without a copy).
  SimulatedClient(ClientFleet* fleet, size_t index, v1::WorkerService::Stub* stub, grpc::GenericStub* generic)
      : fleet_(fleet), stub_(stub), generic_(generic),
        name_(fleet->options().name_prefix + "-" + std::to_string(index)) {}

  void Join(bool first);
  // Cancels the open calls; none starts afterwards.
  void Cancel();

  // Completions of this client's calls.
  void OnChannelOpen(uint64_t epoch);
  // `task` as wire::ReadTask gives it; the model inside it, if any, is taken from `inline_model`.
  void OnTask(uint64_t epoch, v1::Task task, grpc::ByteBuffer* inline_model);
  void OnChannelEnded(uint64_t epoch, const grpc::Status& status);
  void OnDownloaded(uint64_t work, const grpc::Status& status, const Status& checked, const DownloadCheck& check,
                    double ms);
  void OnUploaded(uint64_t work, const grpc::Status& status, const v1::UploadResult& result, double ms,
                  bool failure_report);

  v1::WorkerService::Stub* stub() { return stub_; }
  grpc::GenericStub* generic() { return generic_; }
  ClientFleet* fleet() { return fleet_; }

 private:
  class TaskChannelCall;
  class DownloadCall;
  class UploadCall;

  void OnJoined(bool first, const grpc::Status& status, const v1::JoinResponse& response);
  void Heartbeat(uint64_t epoch);
  void RejoinLater();
  void StartWork(v1::TrainTask task, grpc::ByteBuffer* inline_model);
  void Upload(uint64_t work);
  void ReportFailure(const v1::TrainTask& task, uint64_t work, const std::string& why);
  void FinishWork(uint64_t work);
  v1::UpdateChunkMessage HeaderFor(const v1::TrainTask& task);
  // Under mu_: the session message carrying the update (a failure report without `payload`)
  // when there is a task session and it fits the coordinator's limit, the update then waiting
  // for its verdict; nullopt: it goes by an upload call. The caller sends it unlocked.
  std::optional<grpc::ByteBuffer> InlineUpdateLocked(uint64_t work, const v1::UpdateChunkMessage& header,
                                                     const UpdatePayload* payload);

  // An update sent inside the session, waiting for its verdict down the same stream.
  struct InlineUpload {
    uint64_t work;
    std::string job_id;
    uint32_t round;
    uint32_t attempt;
    Clock::time_point started;
    bool failure_report;
  };
  ClientFleet* const fleet_;
  v1::WorkerService::Stub* const stub_;
  grpc::GenericStub* const generic_;
  const std::string name_;

  std::mutex mu_;  // guards the fields below
  bool cancelled_ = false;
  uint64_t epoch_ = 0;  // one per joined session; completions of an older session do nothing
  std::string worker_id_;
  std::string session_;
  uint32_t heartbeat_interval_ms_ = 1000;
  bool upload_admission_ = false;  // from the JoinResponse: wait for the upload's metadata
  bool upload_xxh3_ = false;       // from the JoinResponse: the update's digests are XXH3-128
  uint64_t upload_connection_min_bytes_ = 0;  // from the JoinResponse: larger updates on a connection of their own
  uint64_t inline_update_max_bytes_ = 0;      // from the JoinResponse: smaller updates inside the task session
  std::optional<InlineUpload> inline_upload_;
  uint32_t backoff_ms_ = kBackoffInitialMs;
  bool channel_ready_ = false;
  std::string state_ = "idle";
  std::shared_ptr<TaskChannelCall> channel_;
  // The work in hand: one task at a time, the newest waiting task next.
  bool busy_ = false;
  uint64_t work_ = 0;
  v1::TrainTask task_;
  bool task_cancelled_ = false;
  double download_ms_ = 0;
  Clock::time_point compute_start_{};
  std::shared_ptr<const UpdatePayload> payload_;
  std::optional<v1::TrainTask> next_task_;
  grpc::ByteBuffer next_model_;  // the model inside next_task_, if any
  std::shared_ptr<DownloadCall> download_;
  std::shared_ptr<UploadCall> upload_;
};

}  // namespace tessera::loadgen
