// The model downloads of a round whose strategy sends each participant more than the model
// (Strategy::DownloadSets: SCAFFOLD's control variates). "Encode once, serve many" holds per
// participant: each gets one encoding of the model followed by its own sets, built once when
// the round opens and served to every member of its cohort, resumable like any version.
//
// Thread safety: a pure function; the versions it returns are immutable.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "server/jobs/model_version.h"
#include "server/selection/selection.h"
#include "server/strategy/strategy.h"

namespace tessera::server {

// Worker id -> the version it downloads, for every member of every client.
using ParticipantModels = std::map<std::string, std::shared_ptr<const ModelVersion>>;

// Empty when the strategy names no download sets (every participant downloads the shared
// model). Otherwise, for each client, `global` followed by strategy.DownloadTensors(party),
// encoded as model `version` in chunks of `chunk_bytes`.
ParticipantModels EncodeParticipantModels(const Strategy& strategy, const TensorSet& global,
                                          const std::vector<Client>& clients, uint64_t version, uint32_t chunk_bytes);

}  // namespace tessera::server
