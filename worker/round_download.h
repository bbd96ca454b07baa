// What a worker takes from its coordinator as a round's model: how much it may be (checked
// before anything is allocated for it) and how it divides into the model and the sets the
// task names (SCAFFOLD's control variates).
#pragma once

#include <map>
#include <string>

#include "base/status.h"
#include "core/tensor.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::worker {

// SCAFFOLD's sets: what a round's download carries besides the model, and what the update
// carries besides the delta.
inline constexpr char kServerControlSet[] = "server_control";
inline constexpr char kClientControlSet[] = "client_control";
inline constexpr char kControlDeltaSet[] = "control_delta";

// What a round's download may hold: the job's model and the sets the task names, each of the
// model's layout, counted from the job's model without building it. A manifest that declares
// more is refused before anything is allocated for it. A task may name at most kMaxModelSets,
// and its model must fit the coordinator's bound on a job's model (wire::kMaxModelMemoryBytes,
// as wire::EstimateModelMemoryBytes counts it), whether or not the task gives the data's shape.
inline constexpr int kMaxModelSets = 8;
Result<uint64_t> DownloadBound(const v1::TrainTask& task, const std::string& what);

// Cuts a download into the model (returned in *model) and the sets the task names, whose
// tensors are named "SET/NAME": each set comes back under the model's names, checked against
// the model's layout.
Result<std::map<std::string, TensorSet>> SplitDownload(TensorSet downloaded, const v1::TrainTask& task,
                                                       const std::string& what, TensorSet* model);

}  // namespace tessera::worker
