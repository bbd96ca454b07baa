// A global model version encoded for the wire once, and served from memory to every worker
// that downloads it: the manifest (with its per-tensor SHA-256), the whole-set hash and every
// chunk message are built when the version is committed (or loaded), never per download. The
// messages are kept serialized (grpc::ByteBuffer): every download writes the same
// reference-counted slices, so a hundred downloads in flight hold one copy of the model, not
// a message copy each.
// Immutable once built; shared between the job runner and the downloads in flight, which
// keep a version alive while they send it even after a newer one is committed.
//
// A job may have its versions travel compressed (spec.compression.download): each tensor is
// then sent in float16, bfloat16 or int8 (its manifest entry's dtype, byte size and checksums
// those of the encoded bytes), or in float32 where the encoding cannot hold its values or
// would not make them smaller (int8 of a single value), or whose values may not be negative (a
// running variance). The version's name (sha256()) and tensors() stay those of the float32
// model, which the coordinator evaluates, checkpoints and exports.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "base/status.h"
#include "core/tensor.h"
#include "core/update_codec.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::server {

class ModelVersion {
 public:
  // Encodes `tensors` as model `version`, in chunks of `chunk_bytes` (clamped to 1 MiB), each
  // tensor in `download` (float32, float16, bfloat16 or int8; top-k reads as float32) where
  // it holds the tensor's values (finite once decoded) in fewer bytes, else in float32.
  // `exact`, per tensor (shorter: the rest false): tensors sent in float32 whatever
  // `download`, those whose values may not be negative (a running variance): a worker keeps
  // the coordinator's model plus its delta at 0 or more only from the values it adds to.
  static std::shared_ptr<const ModelVersion> Encode(std::shared_ptr<const TensorSet> tensors, uint64_t version,
                                                    uint32_t chunk_bytes,
                                                    UpdateEncoding download = UpdateEncoding::kFloat32,
                                                    const std::vector<bool>& exact = {});

  uint64_t version() const { return version_; }
  const TensorSet& tensors() const { return *tensors_; }
  const std::shared_ptr<const TensorSet>& shared_tensors() const { return tensors_; }
  const std::string& sha256() const { return sha256_; }
  uint64_t total_bytes() const { return total_bytes_; }  // as sent: encoded where it is
  // The tensors sent in an encoding other than float32 (0 for a float32 version).
  size_t encoded_tensors() const;

  // The messages of a download that resumes after `resume_offset` bytes: the manifest
  // message, then chunk messages. `first_partial` is set (and must be sent first after the
  // manifest) when the offset falls inside a chunk; the rest are wire_chunks()[first_chunk...].
  struct Plan {
    std::unique_ptr<grpc::ByteBuffer> first_partial;
    size_t first_chunk = 0;
  };
  Result<Plan> PlanDownload(uint64_t resume_offset) const;
  const v1::ModelChunkMessage& manifest_message() const { return manifest_; }
  // The manifest and chunk messages, serialized.
  const grpc::ByteBuffer& wire_manifest() const { return wire_manifest_; }
  const std::vector<grpc::ByteBuffer>& wire_chunks() const { return wire_chunks_; }
  uint32_t chunk_bytes() const { return chunk_bytes_; }
  // The version as a serialized v1::InlineModel (its manifest and chunks), for tasks that
  // carry the model themselves (TrainTask.inline_model); null for a model larger than
  // kMaxInlineBytes. Built at the first call, so a version no task carries costs nothing.
  static constexpr uint64_t kMaxInlineBytes = uint64_t{1} << 20;
  const std::shared_ptr<const std::string>& inline_model() const;

 private:
  ModelVersion() = default;
  // Calls `emit` for each chunk of the tensors as sent, from `resume_offset` bytes on.
  Status ForEachWireChunk(uint64_t resume_offset, const std::function<Status(const v1::TensorChunk&)>& emit) const;

  uint64_t version_ = 0;
  std::shared_ptr<const TensorSet> tensors_;
  std::string sha256_;
  uint64_t total_bytes_ = 0;
  uint32_t chunk_bytes_ = 0;
  v1::ModelChunkMessage manifest_;
  grpc::ByteBuffer wire_manifest_;
  std::vector<grpc::ByteBuffer> wire_chunks_;
  std::vector<uint64_t> chunk_start_;  // byte offset of each chunk in the concatenated tensors
  // Each tensor's bytes as sent, for a version with an encoding other than float32; empty for
  // a float32 one, which sends tensors_' bytes.
  std::vector<std::string> wire_tensors_;
  mutable std::once_flag inline_once_;
  mutable std::shared_ptr<const std::string> inline_model_;
};

}  // namespace tessera::server
