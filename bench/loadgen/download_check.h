// Checks one model download as it streams, against the manifest it starts with, without
// keeping the model: what the real worker's wire::TensorAssembler checks, minus the copy.
//
//  - the first message is the manifest: float32 tensors (or float16, bfloat16 or int8 ones, a
//    model sent compressed) whose byte sizes match their shapes in their dtype and add up to
//    its total, a chunk size of at most 1 MiB, the model version asked for;
//  - then chunks in tensor order and offset order, none empty or larger than the chunk size,
//    covering every tensor exactly;
//  - with `verify_hashes`, each tensor's SHA-256 against the manifest's (costs a hash pass
//    over the model per download, as the real worker pays).
//
// Not thread-safe: one per download, fed by the download's reactor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/support/byte_buffer.h>

#include "base/sha256.h"
#include "base/xxh3.h"
#include "base/status.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::loadgen {

class DownloadCheck {
 public:
  // `what` names the transfer in errors ("model version 3 of job job-1-ab12cd for loadgen-7").
  DownloadCheck(std::string what, uint64_t model_version, bool verify_hashes);

  Status Add(const v1::ModelChunkMessage& message);
  // The same message as gRPC received it. Without hash checks a chunk is read in place: its
  // index, offset and size, its bytes skipped, not copied into a parsed message. The
  // manifest, and every message with hash checks, are parsed.
  Status AddWire(const grpc::ByteBuffer& message);
  // A model sent inside its task (TrainTask.inline_model): its manifest and every chunk.
  Status AddInline(const v1::InlineModel& model);
  // The same model as its serialized bytes (wire::ReadTask): without hash checks its chunks
  // are read in place, their bytes skipped; otherwise, or in another layout, it is parsed.
  Status AddInlineWire(const grpc::ByteBuffer& model);
  // Every tensor complete (and its hash right, when checked).
  Status Finish() const;

  bool has_manifest() const { return has_manifest_; }
  const v1::TensorManifest& manifest() const { return manifest_; }
  uint64_t bytes_received() const { return received_; }

 private:
  Status StartManifest(v1::ModelChunkMessage message);
  // `data` is null when hashes are not checked.
  Status AddChunk(uint32_t tensor_index, uint64_t offset, uint64_t size, const char* data);
  Status EndTensor();
  void SkipEmptyTensors();

  std::string what_;
  uint64_t model_version_;
  bool verify_hashes_;
  bool has_manifest_ = false;
  v1::TensorManifest manifest_;
  int current_tensor_ = 0;
  uint64_t current_offset_ = 0;
  uint64_t received_ = 0;
  // The current tensor's digest, when hashes are checked: XXH3-128 where the manifest gives
  // it, as the worker checks it, else SHA-256.
  std::unique_ptr<Sha256> sha256_;
  std::unique_ptr<Xxh3> xxh3_;
  void StartDigest();
};

}  // namespace tessera::loadgen
