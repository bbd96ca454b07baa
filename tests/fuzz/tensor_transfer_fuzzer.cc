// Fuzzes TensorAssembler (proto/tensor_transfer.h) as a receiver meets it: a manifest, then
// chunks, then Finish. Input: records (fuzz_records.h), the first a serialized
// v1::TensorManifest, each further one a serialized v1::TensorChunk.
//
// Besides memory errors and undefined behaviour it checks what Finish promises: a transfer it
// accepts has the manifest's tensors, names, shapes, sizes and hashes.
#include <string>

#include "fuzz_check.h"
#include "quiet_protobuf_log.h"
#include "fuzz_records.h"
#include "proto/tensor_transfer.h"

namespace {

// What a receiver allows a transfer: small enough that a fuzzing run never runs out of memory
// on an accepted manifest, large enough for several chunks.
constexpr uint64_t kMaxTotalBytes = 1 << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  fuzz::RecordReader records(data, size);
  std::string_view bytes;
  if (!records.Next(&bytes)) return 0;
  v1::TensorManifest manifest;
  if (!manifest.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;

  wire::TensorAssembler assembler("fuzzed transfer", kMaxTotalBytes);
  if (!assembler.Start(manifest).ok()) return 0;
  while (records.Next(&bytes)) {
    v1::TensorChunk chunk;
    if (!chunk.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;
    if (!assembler.Add(chunk).ok()) return 0;
  }
  Result<TensorSet> tensors = assembler.Finish();
  if (!tensors.ok()) return 0;

  FUZZ_CHECK(static_cast<int>(tensors->size()) == manifest.tensors_size(), "tensor count differs from the manifest");
  uint64_t total = 0;
  for (int i = 0; i < manifest.tensors_size(); ++i) {
    const NamedTensor& t = (*tensors)[i];
    const v1::TensorInfo& info = manifest.tensors(i);
    FUZZ_CHECK(t.name == info.name(), "tensor " + std::to_string(i) + ": name differs");
    FUZZ_CHECK(static_cast<int>(t.shape.size()) == info.shape_size(), "tensor " + std::to_string(i) + ": rank differs");
    FUZZ_CHECK(t.ByteSize() == info.byte_size(), "tensor " + std::to_string(i) + ": byte size differs");
    FUZZ_CHECK(t.Sha256() == info.sha256(), "tensor " + std::to_string(i) + ": hash differs");
    total += t.ByteSize();
  }
  FUZZ_CHECK(total == manifest.total_bytes(), "total bytes differ from the manifest");
  FUZZ_CHECK(assembler.bytes_received() == total, "bytes received differ from the tensors' size");
  return 0;
}
