#include "bench/loadgen/update_payload.h"

#include <algorithm>
#include <random>

#include "core/tensor.h"
#include "proto/byte_buffers.h"
#include "proto/tensor_transfer.h"

namespace tessera::loadgen {
namespace {

std::string LayoutKey(const v1::TensorManifest& model) {
  std::string key;
  for (const auto& info : model.tensors()) {
    key += info.name();
    key += '[';
    for (int64_t d : info.shape()) key += std::to_string(d) + ',';
    key += ']';
  }
  return key;
}

}  // namespace

UpdatePayloads::UpdatePayloads(UpdateKind kind, uint32_t chunk_bytes, uint32_t random_variants, uint64_t seed)
    : kind_(kind),
      chunk_bytes_(chunk_bytes),
      variants_(kind == UpdateKind::kZero ? 1 : std::max<uint32_t>(1, random_variants)),
      seed_(seed) {}

Result<std::shared_ptr<const UpdatePayload>> UpdatePayloads::For(const v1::TensorManifest& model, uint64_t variant,
                                                                 wire::UpdateDigest digest) {
  const uint32_t v = static_cast<uint32_t>(variant % variants_);
  auto key = std::make_tuple(LayoutKey(model), v, digest);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = payloads_.find(key); it != payloads_.end()) return it->second;
  ASSIGN_OR_RETURN(auto payload, Build(model, v, digest));
  payloads_.emplace(std::move(key), payload);
  return payload;
}

Result<std::shared_ptr<const UpdatePayload>> UpdatePayloads::Build(const v1::TensorManifest& model,
                                                                   uint32_t variant, wire::UpdateDigest digest) const {
  std::mt19937_64 engine(seed_ * 0x9E3779B97F4A7C15ull + variant);
  std::uniform_real_distribution<float> small(-1e-3f, 1e-3f);
  TensorSet delta;
  delta.reserve(model.tensors_size());
  for (const auto& info : model.tensors()) {
    NamedTensor t;
    t.name = info.name();
    t.shape.assign(info.shape().begin(), info.shape().end());
    // From the shape, not the bytes: a model sent compressed (JobSpec.compression.download)
    // has fewer bytes than values. (DownloadCheck has checked the shape against the bytes.)
    t.values.assign(static_cast<size_t>(t.NumElements()), 0.0f);
    if (kind_ == UpdateKind::kRandom) {
      for (float& x : t.values) x = small(engine);
    }
    delta.push_back(std::move(t));
  }
  auto payload = std::make_shared<UpdatePayload>();
  payload->manifest = wire::BuildManifest(delta, chunk_bytes_);  // with SHA-256 digests
  if (digest == wire::UpdateDigest::kXxh3) {
    for (int i = 0; i < payload->manifest.tensors_size(); ++i) {
      v1::TensorInfo* info = payload->manifest.mutable_tensors(i);
      info->clear_sha256();
      const std::vector<float>& values = delta[static_cast<size_t>(i)].values;
      wire::SetDigest(digest, std::string_view(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)),
                      info);
    }
  }
  payload->bytes = payload->manifest.total_bytes();
  RETURN_IF_ERROR(wire::ForEachChunk(delta, chunk_bytes_, 0, [&](const v1::TensorChunk& chunk) {
    v1::UpdateChunkMessage message;
    *message.mutable_chunk() = chunk;
    grpc::ByteBuffer wire;
    if (!wire::ToByteBuffer(message, &wire)) {
      return InternalError("a chunk message of the update could not be serialized");
    }
    payload->wire_chunks.push_back(std::move(wire));
    payload->chunk_bytes.push_back(chunk.data().size());
    return Status::Ok();
  }));
  return std::shared_ptr<const UpdatePayload>(std::move(payload));
}

}  // namespace tessera::loadgen
