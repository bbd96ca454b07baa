// Fuzzes DecodeCheckpoint (server/state/state_store.h), which reads a checkpoint file of the state
// directory back into a TensorSet. Input: the file's bytes.
//
// Checks that what it accepts survives a round trip through EncodeCheckpoint unchanged.
#include <string>

#include "fuzz_check.h"
#include "quiet_protobuf_log.h"
#include "server/state/state_store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  Result<TensorSet> tensors = server::DecodeCheckpoint(bytes, "fuzzed.ckpt");
  if (!tensors.ok()) return 0;

  Result<TensorSet> again = server::DecodeCheckpoint(server::EncodeCheckpoint(*tensors), "re-encoded.ckpt");
  FUZZ_CHECK(again.ok(), "a re-encoded checkpoint is refused: " + again.status().ToString());
  FUZZ_CHECK(again->size() == tensors->size(), "the round trip changes the tensor count");
  for (size_t i = 0; i < tensors->size(); ++i) {
    const NamedTensor& a = (*tensors)[i];
    const NamedTensor& b = (*again)[i];
    FUZZ_CHECK(a.name == b.name && a.shape == b.shape && a.Sha256() == b.Sha256(),
               "the round trip changes tensor " + std::to_string(i));
  }
  return 0;
}
