// Model downloads and update uploads, the two bulk streams of WorkerService, on gRPC's
// callback API: a download writes its version's pre-built messages one after another as each
// write completes; an upload is checked at its header, waits for the coordinator's upload
// memory budget without reading, then is assembled chunk by chunk as reads complete. Neither
// holds a thread while it waits on a slow worker. The service (services.cc) checks the
// caller's credential and the request's form first.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>

#include "base/status.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::server {

class Coordinator;

// `admitted`: the service's verdict on the caller and the request; an error ends the call.
grpc::ServerWriteReactor<v1::ModelChunkMessage>* StartDownload(Coordinator* c, const v1::DownloadModelRequest& request,
                                                               const Status& admitted);

// What the service checks of an upload's header (the caller's credential, the fields' form),
// and where a refusal not tied to a selected worker is logged (rate-limited).
struct UploadChecks {
  std::function<Status(const v1::UpdateHeader&)> header;
  std::function<void(const std::string&)> refused;
};
grpc::ServerReadReactor<v1::UpdateChunkMessage>* StartUpload(Coordinator* c, v1::UploadResult* result,
                                                             UploadChecks checks);

}  // namespace tessera::server
