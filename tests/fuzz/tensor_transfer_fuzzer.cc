// Fuzzes TensorAssembler (proto/tensor_transfer.h) as a receiver meets it: a manifest, then
// chunks, then Finish. Input: records (fuzz_records.h), the first a serialized
// v1::TensorManifest, each further one a serialized v1::TensorChunk.
//
// Each chunk goes in twice, into two assemblers: parsed and added (TensorAssembler::Add), and
// as a worker reads a download off the wire, wrapped in a ModelChunkMessage and cut into two
// gRPC slices where the record's first byte says (wire::AddModelChunkMessage, which reads the
// coordinator's layout in place and parses any other). The two must agree on every verdict.
//
// A manifest with a tensor in another dtype than FLOAT32 is read as a worker reads a model
// version sent compressed (TensorAssembler::AcceptEncoded): float16, bfloat16 and int8
// tensors are decoded to float32 by Finish.
//
// Besides memory errors and undefined behaviour it checks what Finish promises: a transfer it
// accepts has the manifest's tensors, names, shapes and checksums (XXH3-128 where the
// manifest gives it, else SHA-256); a float32 tensor's bytes are those sent, an encoded one
// holds its shape's element count of float32 values, and an int8 tensor decodes to finite
// values.
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "base/xxh3.h"
#include "core/update_codec.h"
#include "fuzz_check.h"
#include "quiet_protobuf_log.h"
#include "fuzz_records.h"
#include "fuzz_wire.h"
#include "proto/tensor_transfer.h"
#include "proto/update_chunk_reader.h"

namespace {

// What a receiver allows a transfer: small enough that a fuzzing run never runs out of memory
// on an accepted manifest, large enough for several chunks.
constexpr uint64_t kMaxTotalBytes = 1 << 20;

// The encoding a tensor's dtype is sent in, as a receiver of a compressed model reads it.
std::optional<tessera::UpdateEncoding> EncodingOf(tessera::v1::DType dtype) {
  switch (dtype) {
    case tessera::v1::DTYPE_FLOAT32: return tessera::UpdateEncoding::kFloat32;
    case tessera::v1::DTYPE_FLOAT16: return tessera::UpdateEncoding::kFloat16;
    case tessera::v1::DTYPE_BFLOAT16: return tessera::UpdateEncoding::kBFloat16;
    case tessera::v1::DTYPE_INT8: return tessera::UpdateEncoding::kInt8;
    default: return std::nullopt;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  fuzz::RecordReader records(data, size);
  std::string_view bytes;
  if (!records.Next(&bytes)) return 0;
  v1::TensorManifest manifest;
  if (!manifest.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;

  wire::TensorAssembler assembler("fuzzed transfer", kMaxTotalBytes);
  wire::TensorAssembler from_wire("fuzzed transfer", kMaxTotalBytes);
  bool encoded = false;
  for (const auto& info : manifest.tensors()) encoded |= info.dtype() != v1::DTYPE_FLOAT32;
  if (encoded) {  // int8's float32 values take four times its bytes
    assembler.AcceptEncoded(4 * kMaxTotalBytes);
    from_wire.AcceptEncoded(4 * kMaxTotalBytes);
  }
  if (!assembler.Start(manifest).ok()) return 0;
  FUZZ_CHECK(from_wire.Start(manifest).ok(), "the same manifest starts one assembler and not the other");
  while (records.Next(&bytes)) {
    v1::TensorChunk chunk;
    if (!chunk.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;
    const bool added = assembler.Add(chunk).ok();
    const size_t cut = bytes.empty() ? 0 : static_cast<uint8_t>(bytes[0]);
    const bool read = wire::AddModelChunkMessage(fuzz::AsMessage(bytes, cut), from_wire, "fuzzed transfer").ok();
    FUZZ_CHECK(added == read, std::string("a chunk was ") + (added ? "added" : "refused") + " parsed but " +
                                  (read ? "added" : "refused") + " read off the wire");
    if (!added) return 0;
  }
  Result<TensorSet> tensors = assembler.Finish();
  Result<TensorSet> tensors_from_wire = from_wire.Finish();
  FUZZ_CHECK(tensors.ok() == tensors_from_wire.ok(), "the two assemblers disagree on the whole transfer");
  if (!tensors.ok()) return 0;

  FUZZ_CHECK(static_cast<int>(tensors->size()) == manifest.tensors_size(), "tensor count differs from the manifest");
  uint64_t total = 0;
  for (int i = 0; i < manifest.tensors_size(); ++i) {
    const NamedTensor& t = (*tensors)[i];
    const v1::TensorInfo& info = manifest.tensors(i);
    FUZZ_CHECK(t.name == info.name(), "tensor " + std::to_string(i) + ": name differs");
    FUZZ_CHECK(static_cast<int>(t.shape.size()) == info.shape_size(), "tensor " + std::to_string(i) + ": rank differs");
    uint64_t elements = 1;
    for (int64_t d : t.shape) elements *= static_cast<uint64_t>(d);
    FUZZ_CHECK(t.values.size() == elements, "tensor " + std::to_string(i) + ": value count differs from its shape");
    const std::optional<UpdateEncoding> encoding = EncodingOf(info.dtype());
    FUZZ_CHECK(encoding.has_value(), "tensor " + std::to_string(i) + ": accepted in a dtype that is not dense");
    FUZZ_CHECK(EncodedByteSize(*encoding, elements, 0) == info.byte_size(),
               "tensor " + std::to_string(i) + ": byte size differs from its shape in its dtype");
    if (*encoding == UpdateEncoding::kFloat32) {
      if (info.xxh3_128().empty()) {
        FUZZ_CHECK(t.Sha256() == info.sha256(), "tensor " + std::to_string(i) + ": hash differs");
      } else {
        FUZZ_CHECK(Xxh3Hex(t.values.data(), t.ByteSize()) == info.xxh3_128(), "tensor " + std::to_string(i) + ": checksum differs");
      }
    } else if (*encoding == UpdateEncoding::kInt8) {
      for (float v : t.values) FUZZ_CHECK(std::isfinite(v), "tensor " + std::to_string(i) + ": int8 decoded to a non-finite value");
    }
    const NamedTensor& other = (*tensors_from_wire)[i];
    FUZZ_CHECK(other.ByteSize() == t.ByteSize() &&
                   (t.values.empty() || std::memcmp(other.values.data(), t.values.data(), t.ByteSize()) == 0),
               "tensor " + std::to_string(i) + ": bytes differ off the wire");
    total += info.byte_size();
  }
  FUZZ_CHECK(total == manifest.total_bytes(), "total bytes differ from the manifest");
  FUZZ_CHECK(assembler.bytes_received() == total, "bytes received differ from the tensors' size");
  return 0;
}
