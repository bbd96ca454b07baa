// The job spec as it travels (v1::JobSpec) mapped onto core's configurations. Used by the
// coordinator (initial model, evaluation) and the worker (partition, local training) so that
// both read the spec the same way.
#pragma once

#include <string>

#include "base/status.h"
#include "core/data/partition.h"
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "tessera/v1/job.pb.h"

namespace tessera::wire {

ModelConfig ToModelConfig(const v1::JobSpec& spec);
Result<PartitionConfig> ToPartitionConfig(const v1::JobSpec& spec);
// Local training options for `round` (the seed varies with the round and the party so that
// shuffles differ between rounds but repeat exactly on a rerun).
TrainOptions ToTrainOptions(const v1::JobSpec& spec, uint32_t round, uint32_t party);
// The dataset directory the spec names, or the default one.
std::string DatasetDirectory(const v1::JobSpec& spec);

// Semantic checks of a spec however it arrived (the CLI checks the TOML; the coordinator
// checks again, since any client may call it). Errors name the field: "spec.rounds: ...".
Status ValidateJobSpec(const v1::JobSpec& spec);

}  // namespace tessera::wire
