#include "server/jobs/model_version.h"

#include <algorithm>

#include "base/xxh3.h"
#include "proto/byte_buffers.h"
#include "proto/tensor_transfer.h"

namespace tessera::server {
namespace {

grpc::ByteBuffer Serialized(const v1::ModelChunkMessage& message) {
  grpc::ByteBuffer buffer;
  wire::ToByteBuffer(message, &buffer);  // a message of at most 1 MiB and a manifest always serialize
  return buffer;
}

}  // namespace

std::shared_ptr<const ModelVersion> ModelVersion::Encode(std::shared_ptr<const TensorSet> tensors, uint64_t version,
                                                         uint32_t chunk_bytes) {
  std::shared_ptr<ModelVersion> m(new ModelVersion());
  m->version_ = version;
  m->tensors_ = std::move(tensors);
  const TensorSet& set = *m->tensors_;
  *m->manifest_.mutable_manifest() = wire::BuildManifest(set, chunk_bytes);
  // Beside each SHA-256 (the version's name), XXH3-128: what a worker checks its download
  // against, the same protection against corruption on the way for a tenth of the CPU.
  for (size_t i = 0; i < set.size(); ++i) {
    m->manifest_.mutable_manifest()->mutable_tensors(static_cast<int>(i))->set_xxh3_128(
        Xxh3Hex(set[i].values.data(), set[i].ByteSize()));
  }
  m->total_bytes_ = m->manifest_.manifest().total_bytes();
  std::vector<std::string> hashes;
  for (const auto& info : m->manifest_.manifest().tensors()) hashes.push_back(info.sha256());
  m->sha256_ = TensorSetSha256(set, hashes);  // from the manifest's hashes: the tensors are hashed once
  m->manifest_.set_model_version(version);
  m->manifest_.set_model_sha256(m->sha256_);
  m->wire_manifest_ = Serialized(m->manifest_);
  m->chunk_bytes_ = m->manifest_.manifest().chunk_bytes();
  uint64_t position = 0;
  wire::ForEachChunk(set, chunk_bytes, 0, [&](const v1::TensorChunk& chunk) {
    v1::ModelChunkMessage message;
    *message.mutable_chunk() = chunk;
    m->chunk_start_.push_back(position);
    position += chunk.data().size();
    m->wire_chunks_.push_back(Serialized(message));
    return Status::Ok();
  }).ok();
  return m;
}

const std::shared_ptr<const std::string>& ModelVersion::inline_model() const {
  std::call_once(inline_once_, [this] {
    if (total_bytes_ > kMaxInlineBytes) return;
    v1::InlineModel model;
    *model.mutable_manifest() = manifest_.manifest();
    wire::ForEachChunk(*tensors_, chunk_bytes_, 0, [&](const v1::TensorChunk& chunk) {
      *model.add_chunks() = chunk;
      return Status::Ok();
    }).ok();
    inline_model_ = std::make_shared<const std::string>(model.SerializeAsString());
  });
  return inline_model_;
}

Result<ModelVersion::Plan> ModelVersion::PlanDownload(uint64_t resume_offset) const {
  Plan plan;
  if (resume_offset == 0) return plan;
  if (resume_offset > total_bytes_) {
    return InvalidArgumentError("field 'resume_offset': " + std::to_string(resume_offset) +
                                " is past the model's " + std::to_string(total_bytes_) + " bytes");
  }
  // The last chunk starting at or before the offset.
  auto it = std::upper_bound(chunk_start_.begin(), chunk_start_.end(), resume_offset);
  if (it == chunk_start_.begin()) return plan;
  const size_t index = static_cast<size_t>(it - chunk_start_.begin()) - 1;
  const uint64_t skip = resume_offset - chunk_start_[index];
  const uint64_t end = index + 1 < chunk_start_.size() ? chunk_start_[index + 1] : total_bytes_;
  plan.first_chunk = index + 1;
  if (skip == 0) {
    plan.first_chunk = index;
  } else if (skip < end - chunk_start_[index]) {
    // The rest of that chunk: the first chunk from the offset, cut at the chunk's end.
    v1::ModelChunkMessage part;
    wire::ForEachChunk(*tensors_, chunk_bytes_, resume_offset, [&](const v1::TensorChunk& chunk) {
      *part.mutable_chunk() = chunk;
      return CancelledError("the first chunk is enough");
    }).ok();
    std::string* data = part.mutable_chunk()->mutable_data();
    data->resize(std::min<size_t>(data->size(), static_cast<size_t>(end - resume_offset)));
    plan.first_partial = std::make_unique<grpc::ByteBuffer>(Serialized(part));
  }
  return plan;
}

}  // namespace tessera::server
