// The tensor part of a simulated client's upload, built once per model layout and shared by
// every client: the manifest the real worker builds for its delta (wire::BuildManifest: names,
// shapes, float32, byte sizes, per-tensor SHA-256) and the chunk messages it would send
// (wire::ForEachChunk with the worker's chunk size). Uploads only read it, so a thousand
// clients cost one copy of the delta, and no client hashes anything per round.
//
// The delta is all zeros ("unchanged", `kZero`) or small random values in [-1e-3, 1e-3]
// (`kRandom`); random deltas come in a few variants drawn from a seed, so that clients in
// one round do not all send the same bytes.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "base/status.h"
#include "proto/update_envelope.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::loadgen {

enum class UpdateKind { kZero, kRandom };

struct UpdatePayload {
  v1::TensorManifest manifest;
  // The chunk messages in sending order, serialized once: every upload writes the same
  // buffers (gRPC shares their slices), so a client copies nothing to send them.
  std::vector<grpc::ByteBuffer> wire_chunks;
  std::vector<uint64_t> chunk_bytes;  // each chunk's tensor bytes
  uint64_t bytes = 0;
};

class UpdatePayloads {
 public:
  // `random_variants` is how many different random deltas to draw (at least 1).
  UpdatePayloads(UpdateKind kind, uint32_t chunk_bytes, uint32_t random_variants, uint64_t seed);

  // The payload for a model whose download manifest is `model`, variant `variant` (taken
  // modulo the number of variants; zero deltas have one), its tensors with `digest` as the
  // worker gives them (JoinResponse.upload_xxh3). Built on first use, under a lock: the first
  // caller for a layout pays the build (a hash pass over the delta per variant).
  Result<std::shared_ptr<const UpdatePayload>> For(const v1::TensorManifest& model, uint64_t variant,
                                                   wire::UpdateDigest digest);

 private:
  Result<std::shared_ptr<const UpdatePayload>> Build(const v1::TensorManifest& model, uint32_t variant,
                                                     wire::UpdateDigest digest) const;

  const UpdateKind kind_;
  const uint32_t chunk_bytes_;
  const uint32_t variants_;
  const uint64_t seed_;
  std::mutex mu_;  // guards payloads_
  // By layout (names and shapes), variant and digest.
  std::map<std::tuple<std::string, uint32_t, wire::UpdateDigest>, std::shared_ptr<const UpdatePayload>> payloads_;
};

}  // namespace tessera::loadgen
