// The update envelope: what sets of tensors an upload carries and how each is encoded.
// An update is one or more named tensor sets ("delta", the client's model minus the round's
// global model, always; a strategy's own payload besides), each with an encoding; their
// chunks follow the header in set order, as one stream. A header without `sets` is an older
// worker's: its `manifest` is the "delta" set in float32.
//
// Shared by the coordinator and the worker, like the rest of proto/.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/tensor.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::wire {

inline constexpr char kDeltaSet[] = "delta";
inline constexpr int kMaxUpdateSets = 8;

// The sets `header` declares. Refuses a header with both `sets` and `manifest`, more than
// kMaxUpdateSets sets, an empty, over-long or repeated name, no "delta" set, and an encoding
// this build does not read (only float32 today), naming the set. `what` prefixes errors.
Result<std::vector<v1::TensorSetInfo>> UpdateSets(const v1::UpdateHeader& header, const std::string& what);

// One manifest over every set's tensors, in order: what the chunk stream carries.
v1::TensorManifest CombinedManifest(const std::vector<v1::TensorSetInfo>& sets);

// Adds set `name` to an update's envelope: its entry in header->sets (float32, the manifest of
// `tensors` for chunks of `chunk_bytes`) and its tensors at the end of *stream, the one
// TensorSet the upload's chunks carry. Add "delta" first.
void AppendUpdateSet(const std::string& name, TensorSet tensors, uint32_t chunk_bytes, v1::UpdateHeader* header,
                     TensorSet* stream);

// The assembled tensors of a combined manifest, cut back into their named sets.
std::map<std::string, TensorSet> SplitSets(TensorSet tensors, const std::vector<v1::TensorSetInfo>& sets);

}  // namespace tessera::wire
