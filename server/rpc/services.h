// The gRPC services of the coordinator: WorkerService (what workers call) and JobService
// (what the `tessera` command line calls). Both are thin: they authenticate, translate
// messages, and hand the work to the Coordinator and its job runners.
//
// The long-lived server streams, WorkerService.OpenTaskChannel and JobService.WatchJob, the
// model downloads and update uploads, the rendezvous StoreGet and the heartbeat use gRPC's
// callback API: an open stream holds no thread, and is written by the thread that queues a
// task (WorkerRegistry::Send), publishes an event (JobEvents::Publish) or completed the
// previous read or write; downloads and uploads are in transfers.h. The other methods are
// synchronous and short.
#pragma once

#include <memory>

#include "tessera/v1/job_service.grpc.pb.h"
#include "tessera/v1/worker_service.grpc.pb.h"

namespace tessera::server {

class Coordinator;

std::unique_ptr<v1::WorkerService::Service> MakeWorkerService(Coordinator* coordinator);
std::unique_ptr<v1::JobService::Service> MakeJobService(Coordinator* coordinator);

}  // namespace tessera::server
