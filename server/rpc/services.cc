#include "server/rpc/services.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/escape.h"
#include "proto/byte_buffers.h"
#include "proto/grpc_status.h"
#include "proto/transport_security.h"
#include "server/coordinator.h"
#include "server/rpc/service_doors.h"
#include "server/rpc/task_channels.h"
#include "server/rpc/transfers.h"
#include "server/rpc/update_intake.h"

namespace tessera::server {
namespace {

using wire::ToGrpc;

// Free text from the wire (device names and properties, a worker's state, a failure report)
// is escaped and cut (base/escape.h); names and ids are checked (server/rpc/service_doors.h).
constexpr size_t kMaxDeviceProperties = 64;
constexpr size_t kMaxDevicePropertyBytes = 8 << 10;  // all of a device's properties, escaped

// What a worker says about its device is shown to operators: escaped and bounded.
Status SanitizeDevice(v1::DeviceInfo* device) {
  if (static_cast<size_t>(device->properties_size()) > kMaxDeviceProperties) {
    return InvalidArgumentError("join: field 'device.properties': expected at most " +
                                std::to_string(kMaxDeviceProperties) + " entries, got " +
                                std::to_string(device->properties_size()));
  }
  device->set_kind(EscapeUntrusted(device->kind()));
  device->set_name(EscapeUntrusted(device->name(), 128));
  // The "(emulated)" label at the name's end says what the `emulated` field says, whatever
  // the worker's name held: an emulated device is labelled so wherever it is shown (a name cut
  // before its label, a long profile path, gets it back after the cut), and a device that is
  // not emulated does not get to show it.
  constexpr std::string_view kLabel = " (emulated)";
  std::string name = device->name();
  while (name.size() >= kLabel.size() && name.compare(name.size() - kLabel.size(), kLabel.size(), kLabel) == 0) {
    name.resize(name.size() - kLabel.size());
  }
  if (device->emulated()) name += kLabel;
  device->set_name(std::move(name));
  google::protobuf::Map<std::string, std::string> properties;
  size_t bytes = 0;
  for (const auto& [key, value] : device->properties()) {
    std::string k = EscapeUntrusted(key), v = EscapeUntrusted(value, 128);
    bytes += k.size() + v.size();
    properties[std::move(k)] = std::move(v);
  }
  if (bytes > kMaxDevicePropertyBytes) {
    return InvalidArgumentError("join: field 'device.properties': expected at most " +
                                std::to_string(kMaxDevicePropertyBytes) + " bytes in all, escaped, got " +
                                std::to_string(bytes));
  }
  *device->mutable_properties() = std::move(properties);
  return Status::Ok();
}

// A StoreGet waiting for its key, with no thread parked. It holds its place among the
// caller's open streams until it is answered: by whoever sets the key, by the store's timer at
// the deadline, or at once when its caller goes away (cancels, disconnects): the store then
// forgets the wait and the call ends CANCELLED.
class StoreGetReactor final : public grpc::ServerUnaryReactor {
 public:
  StoreGetReactor(RendezvousStore* store, v1::StoreResponse* response) : store_(store), response_(response) {}

  // Waits for `key` up to `wait`, holding `slot` until the answer. In the method handler,
  // before the reactor is returned (so before OnCancel may run).
  void Wait(const std::string& key, std::chrono::milliseconds wait, std::unique_ptr<StreamCounter::Slot> slot) {
    slot_ = std::move(slot);
    key_ = key;
    id_ = store_->GetAsync(key, wait, [this](Result<std::string> value) { Answer(std::move(value)); });
  }

  void OnCancel() override {
    // Still waiting: the store will not call back, so the call ends here. Otherwise the
    // answer is on its way and finishes the call.
    const uint64_t id = id_.load();
    if (id == 0 || !store_->CancelGet(key_, id)) return;
    slot_.reset();
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the rendezvous wait ended: its caller went away"));
  }

  void OnDone() override { delete this; }

 private:
  // The store's answer, called once unless CancelGet took the wait first.
  void Answer(Result<std::string> value) {
    slot_.reset();
    if (!value.ok()) {
      Finish(ToGrpc(value.status()));
      return;
    }
    response_->set_value(std::move(value).value());
    Finish(grpc::Status::OK);
  }

  RendezvousStore* const store_;
  v1::StoreResponse* const response_;
  std::unique_ptr<StreamCounter::Slot> slot_;  // released by whichever ends the wait
  std::string key_;
  std::atomic<uint64_t> id_{0};  // the store's id of the wait; 0: answered at once
};

// OpenTaskChannel, DownloadModel, UploadUpdate, StoreGet and Heartbeat use the callback API
// (no thread waits in them); Join, StoreSet and StoreAdd the synchronous one. DownloadModel
// is raw: it writes each model version's messages serialized once (server/jobs/model_version.h);
// so is UploadUpdate, which reads chunks from the transport straight into the update's tensors,
// and OpenTaskChannel, whose tasks may carry a small model's serialized bytes, shared.
class WorkerServiceImpl final
    : public v1::WorkerService::WithCallbackMethod_Heartbeat<v1::WorkerService::WithRawCallbackMethod_OpenTaskChannel<
          v1::WorkerService::WithRawCallbackMethod_TaskSession<
              v1::WorkerService::WithRawCallbackMethod_DownloadModel<v1::WorkerService::WithRawCallbackMethod_UploadUpdate<
                  v1::WorkerService::WithCallbackMethod_StoreGet<v1::WorkerService::Service>>>>>> {
 public:
  explicit WorkerServiceImpl(Coordinator* c) : c_(c) {}

  grpc::Status Join(grpc::ServerContext* ctx, const v1::JoinRequest* given, v1::JoinResponse* response) override {
    auto refused = [&](const Status& why) {
      refused_joins_.Warn("{} (from {})", why.message(), EscapeUntrusted(ctx->peer()));
      return ToGrpc(why);
    };
    if (Status s = CheckName("join", "name", given->name()); !s.ok()) return ToGrpc(s);
    auto credential = c_->access().CheckJoin(Peer(ctx), given->name(), given->join_token());
    if (!credential.ok()) return refused(credential.status());
    // From here to RememberWorker the name is not forgotten under the join's feet.
    const auto joining = c_->JoiningNames();
    // A new name past the registry's limit is refused before the store binds it.
    if (Status s = c_->registry().Admits(given->name()); !s.ok()) return refused(s);
    v1::JoinRequest sanitized = *given;
    const v1::JoinRequest* request = &sanitized;
    // A name joined with a token alone is bound to that token's label at its first join.
    if (!credential->empty()) {
      if (Status s = c_->BindWorkerName(request->name(), *credential); !s.ok()) return refused(s);
    }
    if (Status s = CheckName("join", "cohort", request->cohort(), false); !s.ok()) return ToGrpc(s);
    if (Status s = SanitizeDevice(sanitized.mutable_device()); !s.ok()) return ToGrpc(s);
    sanitized.set_local_data_path(EscapeUntrusted(request->local_data_path(), 256));
    sanitized.clear_join_token();
    auto joined = c_->registry().Join(*request);
    if (!joined.ok()) return ToGrpc(joined.status());
    if (auto status = c_->registry().Describe(joined->worker_id())) c_->RememberWorker(*status);
    *response = std::move(joined).value();
    response->set_upload_connection_min_bytes(c_->options().upload_connection_min_bytes);
    response->set_inline_update_max_bytes(c_->options().inline_update_max_bytes);
    return grpc::Status::OK;
  }

  // Answered inline on gRPC's own thread (callback API): a heartbeat is a few hundred
  // nanoseconds of work under the registry's lock, not worth a hand-off to a server thread.
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse*) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    Status s = CheckCaller(ctx, "heartbeat", request->worker_id());
    if (s.ok()) {
      s = c_->registry().Heartbeat(request->worker_id(), request->session(), EscapeUntrusted(request->state(), 32));
    }
    reactor->Finish(ToGrpc(s));
    return reactor;
  }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* OpenTaskChannel(grpc::CallbackServerContext* ctx,
                                                              const grpc::ByteBuffer* raw_request) override {
    v1::TaskChannelRequest request;
    Status admitted = wire::FromByteBuffer(*raw_request, &request)
                          ? CheckCaller(ctx, "task channel", request.worker_id())
                          : InvalidArgumentError("task channel: the request is not a TaskChannelRequest");
    return StartTaskChannel(c_, ctx, request, admitted);
  }

  // Served while the coordinator takes inline updates (JoinResponse.inline_update_max_bytes).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* TaskSession(grpc::CallbackServerContext* ctx) override {
    if (c_->options().inline_update_max_bytes == 0) {
      // An unusual reactor: nothing is read, the call ends at once.
      class Refused final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
       public:
        Refused() {
          Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                              "task sessions are off on this coordinator (--inline-update-kib 0): use OpenTaskChannel"));
        }
        void OnDone() override { delete this; }
      };
      return new Refused();
    }
    return StartTaskSession(
        c_, ctx, [this, ctx](const std::string& worker_id) { return CheckCaller(ctx, "task session", worker_id); },
        UploadChecksFor(ctx));
  }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* DownloadModel(grpc::CallbackServerContext*,
                                                          const grpc::ByteBuffer* raw_request) override;

  // Rendezvous keys are confined to the caller's own cohort, in the round it takes part in:
  // "rendezvous/JOB/ROUND/ATTEMPT/COHORT/..." (the TrainTask's rendezvous_prefix).
  Status CheckStoreAccess(const grpc::ServerContextBase* ctx, const v1::StoreRequest& request) {
    RETURN_IF_ERROR(CheckCaller(ctx, "store", request.worker_id()));
    RETURN_IF_ERROR(c_->registry().Authenticate(request.worker_id(), request.session()));
    const RendezvousLimits& limits = c_->rendezvous().limits();
    if (request.key().size() > limits.max_key_bytes || request.value().size() > limits.max_value_bytes) {
      return InvalidArgumentError("worker '" + request.worker_id() + "': store key of " +
                                  std::to_string(request.key().size()) + " bytes and value of " +
                                  std::to_string(request.value().size()) + " bytes: expected at most " +
                                  std::to_string(limits.max_key_bytes) + " (max_key_bytes) and " +
                                  std::to_string(limits.max_value_bytes) + " (max_value_bytes)");
    }
    const std::string cohort = c_->registry().Cohort(request.worker_id());
    if (cohort.empty()) {
      return PermissionDeniedError("worker '" + request.worker_id() + "' is in no cohort; the store serves cohorts");
    }
    const std::string& key = request.key();
    std::vector<std::string> parts;  // rendezvous, JOB, ROUND, ATTEMPT, COHORT
    size_t at = 0;
    while (parts.size() < 5) {
      const size_t slash = key.find('/', at);
      if (slash == std::string::npos) break;
      parts.push_back(key.substr(at, slash - at));
      at = slash + 1;
    }
    auto outside = [&](const std::string& why) {
      return PermissionDeniedError("worker '" + request.worker_id() + "': key " + QuoteUntrusted(key, 128) +
                                   " is outside its cohort's rendezvous (expected rendezvous/JOB/ROUND/ATTEMPT/" +
                                   cohort + "/... of the round it takes part in" + why + ")");
    };
    if (parts.size() < 5 || parts[0] != "rendezvous" || parts[4] != cohort || !CheckJobId("store", parts[1]).ok()) {
      return outside("");
    }
    auto runner = c_->Runner(parts[1]);
    if (!runner) return outside("; job " + QuoteUntrusted(parts[1]) + " is not running");
    auto open = runner->SelectedRound(request.worker_id(), "rendezvous key");
    if (!open.ok()) return open.status();
    if (parts[2] != std::to_string(open->round) || parts[3] != std::to_string(open->attempt)) {
      return outside("; its round is " + std::to_string(open->round) + " attempt " + std::to_string(open->attempt));
    }
    return Status::Ok();
  }

  grpc::Status StoreSet(grpc::ServerContext* ctx, const v1::StoreRequest* request, v1::StoreResponse*) override {
    if (Status s = CheckStoreAccess(ctx, *request); !s.ok()) return ToGrpc(s);
    return ToGrpc(c_->rendezvous().Set(request->key(), request->value()));
  }

  // Waits for the key without holding a thread (StoreGetReactor).
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* ctx, const v1::StoreRequest* request,
                                     v1::StoreResponse* response) override {
    auto* reactor = new StoreGetReactor(&c_->rendezvous(), response);
    if (Status s = CheckStoreAccess(ctx, *request); !s.ok()) {
      reactor->Finish(ToGrpc(s));
      return reactor;
    }
    // A waiting get counts among the caller's open streams until it is answered.
    auto slot = c_->streams().Open(CallerOf(ctx), "rendezvous wait of worker '" + request->worker_id() + "'");
    if (!slot.ok()) {
      reactor->Finish(ToGrpc(slot.status()));
      return reactor;
    }
    const auto wait = std::min(std::chrono::milliseconds(request->wait_ms()), c_->rendezvous().limits().max_wait);
    reactor->Wait(request->key(), wait, std::move(slot).value());
    return reactor;
  }

  grpc::Status StoreAdd(grpc::ServerContext* ctx, const v1::StoreRequest* request, v1::StoreResponse* response) override {
    if (Status s = CheckStoreAccess(ctx, *request); !s.ok()) return ToGrpc(s);
    auto counter = c_->rendezvous().Add(request->key(), request->delta());
    if (!counter.ok()) return ToGrpc(counter.status());
    response->set_counter(*counter);
    return grpc::Status::OK;
  }

  grpc::ServerReadReactor<grpc::ByteBuffer>* UploadUpdate(grpc::CallbackServerContext*,
                                                          grpc::ByteBuffer* response) override;

 private:
  // What an update's header must pass, on an UploadUpdate call or a task session.
  UploadChecks UploadChecksFor(const grpc::ServerContextBase* ctx);

  // A call after Join: a well-formed worker id and, under mutual TLS, that worker's own
  // certificate. The session is checked by the registry.
  Status CheckCaller(const grpc::ServerContextBase* ctx, const std::string& call, const std::string& worker_id) {
    RETURN_IF_ERROR(CheckName(call, "worker_id", worker_id));
    Status s = c_->access().CheckWorkerCall(Peer(ctx), worker_id);
    if (!s.ok()) refused_calls_.Warn("{} (from {})", s.message(), EscapeUntrusted(ctx->peer()));
    return s;
  }

  Coordinator* c_;
  // Every upload call's and task session's update on its way in (update_intake.h).
  const std::shared_ptr<UpdatesInFlight> updates_in_flight_ = std::make_shared<UpdatesInFlight>();
  RefusalLog refused_joins_;
  RefusalLog refused_calls_;
  RefusalLog refused_uploads_;
};

grpc::ServerWriteReactor<grpc::ByteBuffer>* WorkerServiceImpl::DownloadModel(grpc::CallbackServerContext* ctx,
                                                                           const grpc::ByteBuffer* raw_request) {
  v1::DownloadModelRequest parsed;
  const bool readable = wire::FromByteBuffer(*raw_request, &parsed);
  const v1::DownloadModelRequest* request = &parsed;
  Status admitted = readable ? CheckCaller(ctx, "download", request->worker_id())
                             : InvalidArgumentError("download: the request is not a DownloadModelRequest");
  if (admitted.ok()) admitted = CheckJobId("download", request->job_id());
  std::unique_ptr<StreamCounter::Slot> slot;
  if (admitted.ok()) {
    auto opened = c_->streams().Open(CallerOf(ctx), "download by worker '" + request->worker_id() + "'");
    if (opened.ok()) {
      slot = std::move(opened).value();
    } else {
      admitted = opened.status();
    }
  }
  return StartDownload(c_, ctx, *request, admitted, std::move(slot));
}

UploadChecks WorkerServiceImpl::UploadChecksFor(const grpc::ServerContextBase* ctx) {
  UploadChecks checks;
  checks.header = [this, ctx](const v1::UpdateHeader& header) {
    RETURN_IF_ERROR(CheckCaller(ctx, "upload", header.worker_id()));
    return CheckJobId("upload", header.job_id());
  };
  checks.refused = [this](const std::string& message) { refused_uploads_.Warn("refused {}", message); };
  checks.in_flight = updates_in_flight_;
  return checks;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* WorkerServiceImpl::UploadUpdate(grpc::CallbackServerContext* ctx,
                                                                           grpc::ByteBuffer* response) {
  const std::string caller = CallerOf(ctx);
  return StartUpload(c_, ctx, response, UploadChecksFor(ctx), caller, c_->streams().Open(caller, "upload"));
}

}  // namespace

std::unique_ptr<v1::WorkerService::Service> MakeWorkerService(Coordinator* coordinator) {
  return std::make_unique<WorkerServiceImpl>(coordinator);
}

}  // namespace tessera::server
