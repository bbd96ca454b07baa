// The worker's view of the coordinator's WorkerService. The agent is written against this
// interface; the gRPC client below is the real one, and tests put a fake or a failure
// injector in its place.
//
// Every call has a deadline except RunTaskChannel, which runs until the coordinator closes
// the channel, the connection breaks, or CancelTaskChannel() is called from another thread (a
// cancel while no channel is open ends the next one as soon as it opens, unless a Join comes
// between: it was for the session that ended). The gRPC client's channel is a task session
// where the coordinator offers inline updates; one that answers the session UNIMPLEMENTED (an
// older coordinator, or one with sessions switched off) gets a plain task channel in the same
// call instead, and every update by an UploadUpdate call.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "core/tensor.h"
#include "proto/transport_security.h"
#include "proto/update_envelope.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::worker {

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;
  virtual Result<v1::JoinResponse> Join(const v1::JoinRequest& request) = 0;
  virtual Status Heartbeat(const v1::HeartbeatRequest& request) = 0;
  virtual Status RunTaskChannel(const v1::TaskChannelRequest& request,
                                const std::function<void(const v1::Task&)>& on_task) = 0;
  virtual void CancelTaskChannel() = 0;
  // Ends the downloads and uploads in flight, and every one started later, at once (a stopping
  // worker); each returns CANCELLED.
  virtual void CancelTransfers() {}
  // The coordinator cancelled the task (job, round, attempt; attempt 0: every attempt of the
  // round; round 0: every task of the job, which ended; worker/cancelled_task.h): its upload or model download in flight ends at once, no further chunk sent or
  // waited for (nor the verdict of an update sent inside the task session), and returns CANCELLED; one for it that starts later in this session does not
  // start. Transfers of other tasks go on. A Join forgets these cancels with the session they
  // came in.
  virtual void CancelUpload(const std::string& job_id, uint32_t round, uint32_t attempt) {}
  // The model of request.model_version(), reassembled from its chunks and checksum-checked; a
  // manifest of more than `max_bytes` is refused before anything is allocated for it, and a
  // download whose first message names another model version is refused (DATA_LOSS). For the
  // task (request.job_id(), round, attempt), which CancelUpload may end. It ends, too, at the
  // task's deadline (TrainTask.deadline_unix_ms, on the coordinator's clock; 0 or less: none),
  // DEADLINE_EXCEEDED naming it, where that comes before the transfer's own: a round that is
  // over takes no update, whether or not its coordinator says so.
  virtual Result<TensorSet> DownloadModel(const v1::DownloadModelRequest& request, uint64_t max_bytes, uint32_t round,
                                          uint32_t attempt, int64_t deadline_unix_ms) = 0;
  // Sends the header then the chunks of `tensors`; returns the coordinator's verdict. The
  // header carries its sets (wire::AppendUpdateSet) and `tensors` every set's encoded bytes,
  // in set order; a failure header comes with no tensors. The gRPC client sends an update that
  // fits the coordinator's JoinResponse.inline_update_max_bytes (at most
  // kMaxInlineUpdateBytes) inside the open task session
  // and waits for its verdict there, unless it is called from the thread that runs
  // RunTaskChannel (inside on_task); any other update goes by an UploadUpdate call.
  // `tensors` is shared: the transport may still hold some of its bytes after the call ends.
  // As a download, it ends at the task's deadline (`deadline_unix_ms`, on the coordinator's
  // clock; 0 or less: none) where that comes before the transfer's own, DEADLINE_EXCEEDED
  // naming the round and that deadline; one whose deadline has passed is not sent.
  virtual Result<v1::UploadResult> UploadUpdate(const v1::UpdateHeader& header,
                                                std::shared_ptr<const wire::UpdateBytes> tensors, uint32_t chunk_bytes,
                                                int64_t deadline_unix_ms) = 0;
  // The coordinator's rendezvous store, for site cohorts. Get waits up to request.wait_ms.
  virtual Status StoreSet(const v1::StoreRequest& request) = 0;
  virtual Result<std::string> StoreGet(const v1::StoreRequest& request) = 0;
  virtual Result<int64_t> StoreAdd(const v1::StoreRequest& request) = 0;
};

// The gRPC client's settings; the defaults are the daemon's.
struct GrpcClientOptions {
  // How long a download or an upload may take, and how long an update sent inside the task
  // session waits for its verdict (less where the task's deadline comes first).
  std::chrono::milliseconds transfer_deadline = std::chrono::minutes(5);
};

// The most JoinResponse.inline_update_max_bytes the gRPC client takes from a coordinator:
// gRPC's default receive limit, 4 MiB, so that no coordinator can make the worker send an
// update as one message a receiver refuses (the coordinator itself offers at most 1 MiB). A
// larger offer counts as this much; an update above it goes by an UploadUpdate call.
inline constexpr uint64_t kMaxInlineUpdateBytes = uint64_t{4} << 20;

// A client over one gRPC channel to `address` (HOST:PORT) secured by `tls`
// (proto/transport_security.h). InvalidArgument for an address that does not parse, or
// plaintext to a coordinator that is not on loopback without tls.insecure_remote.
Result<std::unique_ptr<CoordinatorClient>> MakeGrpcCoordinatorClient(const std::string& address,
                                                                     const wire::ClientTls& tls,
                                                                     GrpcClientOptions options = {});

}  // namespace tessera::worker
