// What a worker checks of a task from its coordinator before it uses any of it: the task's
// job spec as the coordinator checks a submitted one, and the task's own fields, which go
// into the worker's logs, its failure reports and its cohort's rendezvous as they are.
#pragma once

#include <string>

#include "base/status.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::worker {

// `what` names the task in the error ("job J round R attempt A").
Status CheckTask(const v1::TrainTask& task, const std::string& what);

// Whether `name` is a device class this build registers (cpu, cuda, xrt, a built-in emulated
// profile): what a job may name, unlike "emu:FILE.toml", a file on this worker.
bool IsDeviceClass(const std::string& name);

}  // namespace tessera::worker
