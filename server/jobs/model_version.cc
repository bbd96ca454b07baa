#include "server/jobs/model_version.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "base/sha256.h"
#include "base/xxh3.h"
#include "proto/byte_buffers.h"
#include "proto/tensor_transfer.h"
#include "proto/update_envelope.h"

namespace tessera::server {
namespace {

grpc::ByteBuffer Serialized(const v1::ModelChunkMessage& message) {
  grpc::ByteBuffer buffer;
  wire::ToByteBuffer(message, &buffer);  // a message of at most 1 MiB and a manifest always serialize
  return buffer;
}

// `t`'s values in `encoding`, or nothing where the encoding cannot hold them (a value that
// decodes to infinity: float16 past 65504; int8 with a scale near the float maximum) or would
// not make them smaller (int8's scale takes 4 bytes: a tensor of one value, or of none, takes
// more than in float32). A version as sent then never outgrows the float32 model, which is
// what a worker bounds a download by (worker/round_download.h, DownloadBound).
std::optional<std::string> EncodedIfItHolds(UpdateEncoding encoding, const NamedTensor& t) {
  std::string bytes = EncodeValues(encoding, t.values, 0);
  if (bytes.size() >= t.ByteSize()) return std::nullopt;
  std::vector<float> decoded(t.values.size());
  if (!DecodeValues(encoding, bytes, 0, decoded).ok()) return std::nullopt;
  for (float v : decoded) {
    if (!std::isfinite(v)) return std::nullopt;
  }
  return bytes;
}

}  // namespace

std::shared_ptr<const ModelVersion> ModelVersion::Encode(std::shared_ptr<const TensorSet> tensors, uint64_t version,
                                                         uint32_t chunk_bytes, UpdateEncoding download,
                                                         const std::vector<bool>& exact) {
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
  if (download != UpdateEncoding::kFloat32 && download != UpdateEncoding::kTopK) {
    // The tensors as sent: each encoded where the encoding holds it, its manifest entry
    // describing the bytes sent.
    uint64_t total = 0;
    for (size_t i = 0; i < set.size(); ++i) {
      v1::TensorInfo* info = m->manifest_.mutable_manifest()->mutable_tensors(static_cast<int>(i));
      std::optional<std::string> encoded;
      if (i >= exact.size() || !exact[i]) encoded = EncodedIfItHolds(download, set[i]);
      if (encoded) {
        info->set_dtype(wire::EncodedDType(download));
        info->set_byte_size(encoded->size());
        info->set_sha256(Sha256Hex(encoded->data(), encoded->size()));
        info->set_xxh3_128(Xxh3Hex(encoded->data(), encoded->size()));
      } else {
        encoded.emplace(reinterpret_cast<const char*>(set[i].values.data()), set[i].ByteSize());
      }
      total += encoded->size();
      m->wire_tensors_.push_back(std::move(*encoded));
    }
    m->manifest_.mutable_manifest()->set_total_bytes(total);
    m->total_bytes_ = total;
  }
  m->manifest_.set_model_version(version);
  m->manifest_.set_model_sha256(m->sha256_);
  m->wire_manifest_ = Serialized(m->manifest_);
  m->chunk_bytes_ = m->manifest_.manifest().chunk_bytes();
  uint64_t position = 0;
  m->ForEachWireChunk(0, [&](const v1::TensorChunk& chunk) {
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
    ForEachWireChunk(0, [&](const v1::TensorChunk& chunk) {
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
    ForEachWireChunk(resume_offset, [&](const v1::TensorChunk& chunk) {
      *part.mutable_chunk() = chunk;
      return CancelledError("the first chunk is enough");
    }).ok();
    std::string* data = part.mutable_chunk()->mutable_data();
    data->resize(std::min<size_t>(data->size(), static_cast<size_t>(end - resume_offset)));
    plan.first_partial = std::make_unique<grpc::ByteBuffer>(Serialized(part));
  }
  return plan;
}

size_t ModelVersion::encoded_tensors() const {
  const auto& tensors = manifest_.manifest().tensors();
  return static_cast<size_t>(std::count_if(tensors.begin(), tensors.end(), [](const v1::TensorInfo& info) {
    return info.dtype() != v1::DTYPE_FLOAT32;
  }));
}

Status ModelVersion::ForEachWireChunk(uint64_t resume_offset,
                                      const std::function<Status(const v1::TensorChunk&)>& emit) const {
  if (wire_tensors_.empty()) return wire::ForEachChunk(*tensors_, chunk_bytes_, resume_offset, emit);
  const std::vector<std::string_view> bytes(wire_tensors_.begin(), wire_tensors_.end());
  return wire::ForEachChunk(bytes, chunk_bytes_, resume_offset, emit);
}

}  // namespace tessera::server
