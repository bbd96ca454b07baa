// Fuzzes the update envelope (proto/update_envelope.h) the way the coordinator reads an upload:
// UpdateSets on the header, one TensorAssembler over CombinedManifest, the chunks, Finish,
// then SplitSets. Input: records (fuzz_records.h), the first a serialized v1::UpdateHeader,
// each further one a serialized v1::TensorChunk.
//
// Checks that an accepted header has a "delta" set and at most kMaxUpdateSets sets, and that an
// accepted upload splits back into sets of the sizes their manifests declare.
#include <string>

#include "fuzz_check.h"
#include "quiet_protobuf_log.h"
#include "fuzz_records.h"
#include "proto/tensor_transfer.h"
#include "proto/update_envelope.h"

namespace {

constexpr uint64_t kMaxModelBytes = 1 << 20;

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
    FUZZ_CHECK(set.encoding() == v1::ENCODING_FLOAT32, "accepted set '" + set.name() + "' is not float32");
  }
  FUZZ_CHECK(has_delta, "accepted sets have no 'delta' set");

  const v1::TensorManifest combined = wire::CombinedManifest(*sets);
  wire::TensorAssembler assembler("fuzzed update", kMaxModelBytes);
  if (!assembler.Start(combined).ok()) return 0;
  while (records.Next(&bytes)) {
    v1::TensorChunk chunk;
    if (!chunk.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;
    if (!assembler.Add(chunk).ok()) return 0;
  }
  Result<TensorSet> tensors = assembler.Finish();
  if (!tensors.ok()) return 0;

  std::map<std::string, TensorSet> split = wire::SplitSets(std::move(tensors).value(), *sets);
  FUZZ_CHECK(split.size() == sets->size(), "split gives a different number of sets");
  for (const auto& set : *sets) {
    const TensorSet& part = split[set.name()];
    FUZZ_CHECK(static_cast<int>(part.size()) == set.manifest().tensors_size(),
               "set '" + set.name() + "' splits into a different number of tensors");
    for (size_t i = 0; i < part.size(); ++i) {
      FUZZ_CHECK(part[i].name == set.manifest().tensors(static_cast<int>(i)).name(),
                 "set '" + set.name() + "': tensor " + std::to_string(i) + " has another name");
    }
  }
  return 0;
}
