#include "server/jobs/participant_models.h"

namespace tessera::server {

ParticipantModels EncodeParticipantModels(const Strategy& strategy, const TensorSet& global,
                                          const std::vector<Client>& clients, uint64_t version, uint32_t chunk_bytes) {
  ParticipantModels models;
  if (strategy.DownloadSets().empty()) return models;
  for (const Client& client : clients) {
    auto tensors = std::make_shared<TensorSet>(global);
    TensorSet sets = strategy.DownloadTensors(client.party);
    tensors->insert(tensors->end(), std::make_move_iterator(sets.begin()), std::make_move_iterator(sets.end()));
    auto encoded = ModelVersion::Encode(std::move(tensors), version, chunk_bytes);
    for (const std::string& worker : client.members) models[worker] = encoded;
  }
  return models;
}

}  // namespace tessera::server
