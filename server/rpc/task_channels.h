// A worker's task channel, the coordinator's way to reach it: OpenTaskChannel (a server
// stream of tasks) or TaskSession (the same as a two-way stream whose later messages are small
// updates, each answered by a verdict down the channel). Both are written by whichever thread
// has something for the worker, never by a thread parked on the stream, and registered with
// the worker registry, which queues what the coordinator sends. The service (services.cc)
// checks the caller's credential first.
//
// Limits (server/rpc/stream_limits.h): a channel holds a stream slot of its caller (a session
// from its start, before its first message, which must come within the idle timeout); it ends
// when a write is not taken for the idle timeout, when its worker no longer heartbeats, or at
// the channel's maximum age.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>

#include "base/status.h"
#include "server/rpc/update_intake.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::server {

class Coordinator;

// `admitted`: the service's verdict on the caller and the request; an error ends the call.
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartTaskChannel(Coordinator* c, grpc::CallbackServerContext* ctx,
                                                             const v1::TaskChannelRequest& request,
                                                             const Status& admitted);

// `check_caller` checks the worker id of the session's first message against the caller's
// credential; `checks` are what each inline update goes through, as an upload's do.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartTaskSession(
    Coordinator* c, grpc::CallbackServerContext* ctx, std::function<Status(const std::string&)> check_caller,
    UploadChecks checks);

// Tests: `hook` runs at the start of every task channel's write completion, on gRPC's thread,
// so a test can hold a write's completion back. Set it before the coordinator starts and clear
// it after it has shut down; empty (the default): nothing runs.
void SetTaskChannelWriteDoneHookForTesting(std::function<void()> hook);

}  // namespace tessera::server
