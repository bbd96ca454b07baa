// What a worker checks of a task from its coordinator before it uses any of it: the task's
// job spec as the coordinator checks a submitted one, and the task's own fields, which go
// into the worker's logs, its failure reports and its cohort's rendezvous as they are.
#pragma once

#include <chrono>
#include <string>

#include "base/status.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::worker {

// `what` names the task in the error ("job J round R attempt A").
Status CheckTask(const v1::TrainTask& task, const std::string& what);

// Whether the task's deadline (deadline_unix_ms, on the coordinator's clock; 0 or less: none)
// has passed by `now` on this worker's clock: DeadlineExceeded naming both, before anything of
// the task is downloaded. Training stops at the deadline anyway; a task that arrives past it
// is reported instead of downloaded for nothing, and says which clocks disagree when it is
// this worker's that runs ahead.
Status CheckDeadline(const v1::TrainTask& task, const std::string& what, std::chrono::system_clock::time_point now);

// Whether `name` is a device class this build registers (cpu, cuda, xrt, a built-in emulated
// profile): what a job may name, unlike "emu:FILE.toml", a file on this worker.
bool IsDeviceClass(const std::string& name);

}  // namespace tessera::worker
