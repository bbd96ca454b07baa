// Moving a TensorSet over the wire: a manifest (names, shapes, dtypes, per-tensor SHA-256)
// followed by chunks of at most kMaxChunkBytes, so that a model of any size passes without
// raising gRPC's message-size limit. Shared by the coordinator and the worker: this and the
// generated messages are all the code they share besides core/.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "core/tensor.h"
#include "tessera/v1/tensor.pb.h"

namespace tessera::wire {

inline constexpr uint32_t kMaxChunkBytes = 1u << 20;  // 1 MiB
// What a worker's update is cut into by default. gRPC reads a message's remaining bytes into
// one buffer and keeps a connection's read buffer at about the size of its messages, so the
// coordinator holds about a chunk per connected uploader: 100 uploaders of a 10 MiB model
// peaked at 336 MiB with 1 MiB chunks, 269 with 512 KiB, 244-257 with 256 KiB; 256 KiB
// made 50 uploaders' rounds 15% slower, 512 KiB did not
// (docs/benchmarks/round-overhead-history-2026-12-01-02.md).
inline constexpr uint32_t kDefaultUploadChunkBytes = 512u << 10;

// Manifest of `tensors` (float32), stamped with `chunk_bytes`, each tensor with its SHA-256
// (`sha256`), or without one, for a caller that sets another checksum (xxh3_128).
v1::TensorManifest BuildManifest(const TensorSet& tensors, uint32_t chunk_bytes = kMaxChunkBytes, bool sha256 = true);

// Calls `emit` once per chunk, in order, skipping the first `resume_offset` bytes of the
// concatenated tensors (to resume a broken transfer). Stops at the first error `emit`
// returns (a closed stream) and returns it.
Status ForEachChunk(const TensorSet& tensors, uint32_t chunk_bytes, uint64_t resume_offset,
                    const std::function<Status(const v1::TensorChunk&)>& emit);
// The same over each tensor's bytes as sent (an encoded model version's, an update's).
Status ForEachChunk(std::span<const std::string_view> tensors, uint32_t chunk_bytes, uint64_t resume_offset,
                    const std::function<Status(const v1::TensorChunk&)>& emit);

// Rebuilds a TensorSet from a manifest and its chunks, checking as it goes: chunk sizes,
// order and offsets, the declared byte sizes, and at the end each tensor's checksum.
// `what` names the transfer in errors ("update from worker w-2 for job j-1 round 3").
// Not thread-safe.
class TensorAssembler {
 public:
  TensorAssembler(std::string what, uint64_t max_total_bytes);

  // Before Start(): tensors may also arrive in float16, bfloat16 or int8 (a model version sent
  // compressed, JobSpec.compression.download), read back to float32 by Finish(). Their float32
  // values may take `max_decoded_bytes` in all; `max_total_bytes` still bounds the bytes as
  // sent. Without it, a tensor in any dtype but FLOAT32 is refused.
  void AcceptEncoded(uint64_t max_decoded_bytes);

  Status Start(const v1::TensorManifest& manifest);
  Status Add(const v1::TensorChunk& chunk);
  // Add() in two steps, for a chunk read in place from the transport (AddModelChunkMessage):
  // where the `size` bytes of tensor `index` at `offset` go, with Add's checks; then, once
  // they are written there, EndChunk() (FAILED_PRECONDITION without a BeginChunk before it).
  Result<uint8_t*> BeginChunk(uint32_t index, uint64_t offset, uint64_t size);
  Status EndChunk();
  // Verifies completeness and hashes, decodes the encoded tensors, then hands over the tensors.
  Result<TensorSet> Finish();

  uint64_t bytes_received() const { return received_; }

 private:
  // Where tensor `index`'s bytes as sent go: its values, or its encoded bytes.
  uint8_t* WireBytes(size_t index);

  std::string what_;
  uint64_t max_total_bytes_;
  bool accept_encoded_ = false;
  uint64_t max_decoded_bytes_ = 0;
  bool started_ = false;
  v1::TensorManifest manifest_;
  TensorSet tensors_;
  std::vector<uint64_t> wire_bytes_;           // per tensor: its bytes as sent
  std::vector<std::string> encoded_;           // per tensor: its bytes when not float32, else empty
  uint32_t current_tensor_ = 0;
  uint64_t current_offset_ = 0;
  uint64_t received_ = 0;
  uint64_t pending_ = 0;  // the bytes BeginChunk placed, which EndChunk counts
};

// A model sent inside its task (TrainTask.inline_model), checked as a download is: the
// manifest, then every chunk in order, then each tensor's SHA-256.
// A manifest of more than `max_bytes`, or of more than the chunks carry, is refused before
// anything is allocated for it.
// Its tensors may be encoded (TensorAssembler::AcceptEncoded), their float32 values bounded by
// `max_bytes` and by four times the bytes the chunks carry.
Result<TensorSet> ReadInlineModel(const v1::InlineModel& model, const std::string& what, uint64_t max_bytes);

}  // namespace tessera::wire
