// Model downloads and update uploads, the two bulk streams of WorkerService, on gRPC's
// callback API: a download writes its version's pre-built messages one after another as each
// write completes; an upload is checked at its header, waits for the coordinator's upload
// memory budget without reading, then is assembled chunk by chunk as reads complete. Neither
// holds a thread while it waits on a slow worker. The service (services.cc) checks the
// caller's credential and the request's form first, and gives each transfer the slot it holds
// among the coordinator's open streams.
//
// Limits (server/rpc/stream_limits.h): a transfer that makes no progress for the idle timeout
// (an upload's header included), or that is open longer than the transfer timeout, is ended
// with DEADLINE_EXCEEDED naming the limit; so is an upload still open at its round's
// deadline, and a download of a round's model at that round's deadline. An update admitted
// at its header whose upload is so ended is refused in its job, as an incomplete one is (its
// worker does not send it again). A download is
// served only to a worker that takes part in the job's open round and has not reported yet,
// and only that round's model version; once that round ends for the worker (committed,
// failed, cancelled, or the worker dropped from it), the download stops at the next chunk
// boundary with FAILED_PRECONDITION naming the job and the round.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "server/rpc/stream_limits.h"
#include "server/rpc/update_intake.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::server {

class Coordinator;

// `admitted`: the service's verdict on the caller and the request; an error ends the call.
// The download writes the version's serialized messages (ModelVersion::wire_chunks), so the
// service registers DownloadModel as a raw method (ByteBuffers out; the request parsed by it).
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartDownload(Coordinator* c, grpc::CallbackServerContext* ctx,
                                                          const v1::DownloadModelRequest& request,
                                                          const Status& admitted,
                                                          std::unique_ptr<StreamCounter::Slot> slot);

// `caller` names the caller in messages until its header names the worker. UploadUpdate is
// a raw method too (ByteBuffers in, the UploadResult serialized into `response`): the
// chunks are read from the transport's slices into the update's tensors
// (proto/update_chunk_reader.h). An upload that the worker cancels, whose connection breaks,
// or that a newer upload of the same update replaces (UpdatesInFlight) ends without its
// update being judged.
grpc::ServerReadReactor<grpc::ByteBuffer>* StartUpload(Coordinator* c, grpc::CallbackServerContext* ctx,
                                                      grpc::ByteBuffer* response, UploadChecks checks,
                                                      const std::string& caller,
                                                      Result<std::unique_ptr<StreamCounter::Slot>> slot);

}  // namespace tessera::server
