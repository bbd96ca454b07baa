// Fuzzes the update envelope (proto/update_envelope.h) the way the coordinator reads an upload:
// UpdateSets on the header, one UpdateAssembler over the sets (every encoding; top-k with a
// fraction of 0.25), the chunks, Finish. Input: records (fuzz_records.h), the first a
// serialized v1::UpdateHeader, each further one a serialized v1::TensorChunk.
//
// Checks that an accepted header has a "delta" set and at most kMaxUpdateSets sets, and that an
// accepted upload decodes into sets of the tensors, names and element counts their manifests
// declare.
#include <string>

#include "fuzz_check.h"
#include "quiet_protobuf_log.h"
#include "fuzz_records.h"
#include "proto/update_assembler.h"
#include "proto/update_envelope.h"

namespace {

constexpr uint64_t kMaxModelBytes = 1 << 20;
constexpr double kTopKFraction = 0.25;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  fuzz::RecordReader records(data, size);
  std::string_view bytes;
  if (!records.Next(&bytes)) return 0;
  v1::UpdateHeader header;
  if (!header.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;

  Result<std::vector<v1::TensorSetInfo>> sets = wire::UpdateSets(header, "fuzzed update");
  if (!sets.ok()) return 0;
  FUZZ_CHECK(!sets->empty() && sets->size() <= static_cast<size_t>(wire::kMaxUpdateSets), "accepted set count");
  bool has_delta = false;
  for (const auto& set : *sets) {
    has_delta |= set.name() == wire::kDeltaSet;
    FUZZ_CHECK(wire::ToUpdateEncoding(set.encoding()).ok(), "accepted set '" + set.name() + "' has no known encoding");
  }
  FUZZ_CHECK(has_delta, "accepted sets have no 'delta' set");

  wire::UpdateAssembler assembler("fuzzed update", kMaxModelBytes, kTopKFraction);
  if (!assembler.Start(*sets).ok()) return 0;
  while (records.Next(&bytes)) {
    v1::TensorChunk chunk;
    if (!chunk.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;
    if (!assembler.Add(chunk).ok()) return 0;
  }
  auto split = assembler.Finish();
  if (!split.ok()) return 0;
  FUZZ_CHECK(split->size() == sets->size(), "the upload decodes into a different number of sets");
  for (const auto& set : *sets) {
    const TensorSet& part = (*split)[set.name()];
    FUZZ_CHECK(static_cast<int>(part.size()) == set.manifest().tensors_size(),
               "set '" + set.name() + "' decodes into a different number of tensors");
    for (size_t i = 0; i < part.size(); ++i) {
      FUZZ_CHECK(part[i].name == set.manifest().tensors(static_cast<int>(i)).name(),
                 "set '" + set.name() + "': tensor " + std::to_string(i) + " has another name");
      FUZZ_CHECK(static_cast<int64_t>(part[i].values.size()) == part[i].NumElements(),
                 "set '" + set.name() + "': tensor " + std::to_string(i) + " has another element count");
    }
  }
  return 0;
}
