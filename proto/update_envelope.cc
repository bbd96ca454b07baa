#include "proto/update_envelope.h"

#include <iterator>
#include <set>

#include "proto/tensor_transfer.h"

namespace tessera::wire {

Result<std::vector<v1::TensorSetInfo>> UpdateSets(const v1::UpdateHeader& header, const std::string& what) {
  std::vector<v1::TensorSetInfo> sets;
  if (header.sets_size() == 0) {
    v1::TensorSetInfo delta;
    delta.set_name(kDeltaSet);
    delta.set_encoding(v1::ENCODING_FLOAT32);
    *delta.mutable_manifest() = header.manifest();
    sets.push_back(std::move(delta));
    return sets;
  }
  if (header.has_manifest() && header.manifest().tensors_size() > 0) {
    return InvalidArgumentError(what + ": the header has both 'manifest' and 'sets'; expected one of them");
  }
  if (header.sets_size() > kMaxUpdateSets) {
    return InvalidArgumentError(what + ": field 'sets': " + std::to_string(header.sets_size()) +
                                " sets, expected at most " + std::to_string(kMaxUpdateSets));
  }
  std::set<std::string> names;
  for (const auto& set : header.sets()) {
    const std::string name = set.name().substr(0, 64);
    if (set.name().empty() || set.name().size() > 64) {
      return InvalidArgumentError(what + ": a set's name must be 1 to 64 characters, got " +
                                  std::to_string(set.name().size()));
    }
    if (!names.insert(set.name()).second) return InvalidArgumentError(what + ": set '" + name + "' appears twice");
    const v1::Encoding encoding = set.encoding() == v1::ENCODING_UNSPECIFIED ? v1::ENCODING_FLOAT32 : set.encoding();
    if (encoding != v1::ENCODING_FLOAT32) {
      return InvalidArgumentError(what + ": set '" + name + "': encoding " + v1::Encoding_Name(encoding) +
                                  " is not read by this coordinator; expected ENCODING_FLOAT32");
    }
    v1::TensorSetInfo copy = set;
    copy.set_encoding(encoding);
    sets.push_back(std::move(copy));
  }
  if (!names.count(kDeltaSet)) return InvalidArgumentError(what + ": no 'delta' set; an update must carry one");
  return sets;
}

v1::TensorManifest CombinedManifest(const std::vector<v1::TensorSetInfo>& sets) {
  v1::TensorManifest combined;
  uint64_t total = 0;
  uint32_t chunk_bytes = 0;
  for (const auto& set : sets) {
    for (const auto& t : set.manifest().tensors()) *combined.add_tensors() = t;
    total += set.manifest().total_bytes();
    chunk_bytes = std::max(chunk_bytes, set.manifest().chunk_bytes());
  }
  combined.set_total_bytes(total);
  combined.set_chunk_bytes(chunk_bytes);
  return combined;
}

void AppendUpdateSet(const std::string& name, TensorSet tensors, uint32_t chunk_bytes, v1::UpdateHeader* header,
                     TensorSet* stream) {
  v1::TensorSetInfo* set = header->add_sets();
  set->set_name(name);
  set->set_encoding(v1::ENCODING_FLOAT32);
  *set->mutable_manifest() = BuildManifest(tensors, chunk_bytes);
  stream->insert(stream->end(), std::make_move_iterator(tensors.begin()), std::make_move_iterator(tensors.end()));
}

std::map<std::string, TensorSet> SplitSets(TensorSet tensors, const std::vector<v1::TensorSetInfo>& sets) {
  std::map<std::string, TensorSet> out;
  size_t next = 0;
  for (const auto& set : sets) {
    TensorSet& part = out[set.name()];
    for (int i = 0; i < set.manifest().tensors_size() && next < tensors.size(); ++i) {
      part.push_back(std::move(tensors[next++]));
    }
  }
  return out;
}

}  // namespace tessera::wire
