#include "bench/loadgen/download_check.h"

#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include "core/update_codec.h"
#include "proto/byte_buffers.h"
#include "proto/tensor_transfer.h"

namespace tessera::loadgen {

DownloadCheck::DownloadCheck(std::string what, uint64_t model_version, bool verify_hashes)
    : what_(std::move(what)), model_version_(model_version), verify_hashes_(verify_hashes) {}

Status DownloadCheck::Add(const v1::ModelChunkMessage& message) {
  if (message.has_manifest()) return StartManifest(message);
  if (message.has_chunk()) {
    if (!has_manifest_) return DataLossError(what_ + ": a chunk arrived before the manifest");
    const v1::TensorChunk& chunk = message.chunk();
    return AddChunk(chunk.tensor_index(), chunk.offset(), chunk.data().size(), chunk.data().data());
  }
  return DataLossError(what_ + ": expected a manifest or a chunk, got an empty message");
}

namespace {

using google::protobuf::internal::WireFormatLite;

// A chunk's fields without its bytes.
struct ChunkFields {
  uint32_t tensor_index = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

constexpr uint32_t kManifestTag = (1u << 3) | WireFormatLite::WIRETYPE_LENGTH_DELIMITED;  // both messages' field 1
constexpr uint32_t kChunkTag = (2u << 3) | WireFormatLite::WIRETYPE_LENGTH_DELIMITED;     // both messages' field 2

// A TensorChunk's fields, the stream at its length; its bytes skipped. False when it does not
// read as one.
bool ReadTensorChunk(google::protobuf::io::CodedInputStream& in, ChunkFields* chunk) {
  uint32_t length = 0;
  if (!in.ReadVarint32(&length)) return false;
  const auto limit = in.PushLimit(static_cast<int>(length));
  for (uint32_t inner = in.ReadTag(); inner != 0; inner = in.ReadTag()) {
    uint32_t size = 0;
    if (inner == ((1u << 3) | WireFormatLite::WIRETYPE_VARINT)) {
      if (!in.ReadVarint32(&chunk->tensor_index)) return false;
    } else if (inner == ((2u << 3) | WireFormatLite::WIRETYPE_VARINT)) {
      if (!in.ReadVarint64(&chunk->offset)) return false;
    } else if (inner == ((3u << 3) | WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) {
      if (!in.ReadVarint32(&size) || !in.Skip(static_cast<int>(size))) return false;
      chunk->size = size;
    } else if (!WireFormatLite::SkipField(&in, inner)) {
      return false;
    }
  }
  if (!in.ConsumedEntireMessage()) return false;
  in.PopLimit(limit);
  return true;
}

// A chunk message's fields without its bytes; nullopt for any message that is not a
// ModelChunkMessage with a chunk and no manifest (the caller parses it instead).
std::optional<ChunkFields> ReadChunkFields(const grpc::ByteBuffer& message) {
  grpc::ProtoBufferReader reader(wire::Unowned(message));
  google::protobuf::io::CodedInputStream in(&reader);
  std::optional<ChunkFields> fields;
  for (uint32_t tag = in.ReadTag(); tag != 0; tag = in.ReadTag()) {
    if (tag == kChunkTag) {
      if (fields) return std::nullopt;  // a repeated message field merges; left to the parser
      if (!ReadTensorChunk(in, &fields.emplace())) return std::nullopt;
    } else if (tag == kManifestTag) {
      return std::nullopt;  // a manifest
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return std::nullopt;
    }
  }
  if (!in.ConsumedEntireMessage()) return std::nullopt;
  return fields;
}

// A serialized InlineModel read without copying its chunks' bytes: its manifest, then its
// chunks' fields. Nullopt for any other layout (the caller parses it instead).
struct InlineFields {
  v1::ModelChunkMessage manifest;  // as a download's first message
  std::vector<ChunkFields> chunks;
};
std::optional<InlineFields> ReadInlineFields(const grpc::ByteBuffer& model) {
  if (model.Length() > static_cast<size_t>(std::numeric_limits<int>::max())) return std::nullopt;
  grpc::ProtoBufferReader reader(wire::Unowned(model));
  google::protobuf::io::CodedInputStream in(&reader);
  in.SetTotalBytesLimit(std::numeric_limits<int>::max());
  InlineFields fields;
  if (in.ReadTag() != kManifestTag) return std::nullopt;
  uint32_t length = 0;
  if (!in.ReadVarint32(&length)) return std::nullopt;
  const auto limit = in.PushLimit(static_cast<int>(length));
  if (!fields.manifest.mutable_manifest()->ParseFromCodedStream(&in) || !in.ConsumedEntireMessage()) return std::nullopt;
  in.PopLimit(limit);
  for (uint32_t tag = in.ReadTag(); tag != 0; tag = in.ReadTag()) {
    if (tag != kChunkTag || !ReadTensorChunk(in, &fields.chunks.emplace_back())) return std::nullopt;
  }
  if (static_cast<uint64_t>(in.CurrentPosition()) != model.Length()) return std::nullopt;
  return fields;
}

}  // namespace

Status DownloadCheck::AddWire(const grpc::ByteBuffer& message) {
  if (has_manifest_ && !verify_hashes_) {
    if (auto chunk = ReadChunkFields(message)) return AddChunk(chunk->tensor_index, chunk->offset, chunk->size, nullptr);
  }
  v1::ModelChunkMessage parsed;
  if (!wire::FromByteBuffer(message, &parsed)) {
    return DataLossError(what_ + ": a message that is not a ModelChunkMessage");
  }
  return Add(parsed);
}

Status DownloadCheck::AddInlineWire(const grpc::ByteBuffer& model) {
  if (!verify_hashes_) {
    if (auto fields = ReadInlineFields(model)) {
      fields->manifest.set_model_version(model_version_);
      RETURN_IF_ERROR(StartManifest(std::move(fields->manifest)));
      for (const ChunkFields& chunk : fields->chunks) {
        RETURN_IF_ERROR(AddChunk(chunk.tensor_index, chunk.offset, chunk.size, nullptr));
      }
      return Status::Ok();
    }
  }
  v1::InlineModel parsed;
  if (!wire::FromByteBuffer(model, &parsed)) return DataLossError(what_ + ": the model in its task is not an InlineModel");
  return AddInline(parsed);
}

Status DownloadCheck::AddInline(const v1::InlineModel& model) {
  v1::ModelChunkMessage manifest;  // as a download's first message
  *manifest.mutable_manifest() = model.manifest();
  manifest.set_model_version(model_version_);
  RETURN_IF_ERROR(StartManifest(std::move(manifest)));
  for (const v1::TensorChunk& chunk : model.chunks()) {
    RETURN_IF_ERROR(AddChunk(chunk.tensor_index(), chunk.offset(), chunk.data().size(), chunk.data().data()));
  }
  return Status::Ok();
}

Status DownloadCheck::StartManifest(v1::ModelChunkMessage message) {
  if (has_manifest_) return DataLossError(what_ + ": a second manifest arrived");
  if (message.model_version() != model_version_) {
    return DataLossError(what_ + ": expected model version " + std::to_string(model_version_) + ", got " +
                         std::to_string(message.model_version()));
  }
  const v1::TensorManifest& m = message.manifest();
  if (m.chunk_bytes() == 0 || m.chunk_bytes() > wire::kMaxChunkBytes) {
    return DataLossError(what_ + ": manifest chunk_bytes: expected 1 to " + std::to_string(wire::kMaxChunkBytes) +
                         ", got " + std::to_string(m.chunk_bytes()));
  }
  uint64_t total = 0;
  for (const auto& info : m.tensors()) {
    // float32, or a dense encoding of a model sent compressed (JobSpec.compression.download).
    std::optional<UpdateEncoding> encoding;
    switch (info.dtype()) {
      case v1::DTYPE_FLOAT32: encoding = UpdateEncoding::kFloat32; break;
      case v1::DTYPE_FLOAT16: encoding = UpdateEncoding::kFloat16; break;
      case v1::DTYPE_BFLOAT16: encoding = UpdateEncoding::kBFloat16; break;
      case v1::DTYPE_INT8: encoding = UpdateEncoding::kInt8; break;
      default: break;
    }
    if (!encoding) {
      return DataLossError(what_ + ": tensor '" + info.name() + "': expected dtype FLOAT32, FLOAT16, BFLOAT16 or INT8, got " +
                           (v1::DType_IsValid(info.dtype()) ? v1::DType_Name(info.dtype()) : std::to_string(info.dtype())));
    }
    uint64_t elements = 1;
    for (int64_t d : info.shape()) {
      if (d < 0) return DataLossError(what_ + ": tensor '" + info.name() + "' has a negative dimension");
      if (d > 0 && elements > std::numeric_limits<uint64_t>::max() / 8 / static_cast<uint64_t>(d)) {
        return DataLossError(what_ + ": tensor '" + info.name() + "': its shape's element count overflows");
      }
      elements *= static_cast<uint64_t>(d);
    }
    const uint64_t needs = *EncodedByteSize(*encoding, elements, 0);  // within 2^61 elements, no overflow
    if (info.byte_size() != needs) {
      return DataLossError(what_ + ": tensor '" + info.name() + "': its shape needs " + std::to_string(needs) +
                           " bytes in " + UpdateEncodingName(*encoding) + ", the manifest says " +
                           std::to_string(info.byte_size()));
    }
    if (total > std::numeric_limits<uint64_t>::max() - info.byte_size()) {
      return DataLossError(what_ + ": the manifest's tensors' bytes overflow");
    }
    total += info.byte_size();
  }
  if (total != m.total_bytes()) {
    return DataLossError(what_ + ": manifest total_bytes " + std::to_string(m.total_bytes()) +
                         " does not match its tensors' " + std::to_string(total));
  }
  manifest_ = std::move(*message.mutable_manifest());
  has_manifest_ = true;
  current_tensor_ = 0;
  current_offset_ = 0;
  SkipEmptyTensors();
  StartDigest();
  return Status::Ok();
}

void DownloadCheck::StartDigest() {
  if (!verify_hashes_ || current_tensor_ >= manifest_.tensors_size()) return;
  if (manifest_.tensors(current_tensor_).xxh3_128().empty()) {
    sha256_ = std::make_unique<Sha256>();
  } else {
    xxh3_ = std::make_unique<Xxh3>();
  }
}

Status DownloadCheck::AddChunk(uint32_t tensor_index, uint64_t offset, uint64_t size, const char* data) {
  if (current_tensor_ >= manifest_.tensors_size()) {
    return DataLossError(what_ + ": a chunk arrived after every tensor was complete");
  }
  if (tensor_index != static_cast<uint32_t>(current_tensor_) || offset != current_offset_) {
    return DataLossError(what_ + ": expected a chunk of tensor " + std::to_string(current_tensor_) + " at offset " +
                         std::to_string(current_offset_) + ", got tensor " + std::to_string(tensor_index) +
                         " at offset " + std::to_string(offset));
  }
  const auto& info = manifest_.tensors(current_tensor_);
  if (size == 0 || size > manifest_.chunk_bytes() || current_offset_ + size > info.byte_size()) {
    return DataLossError(what_ + ": chunk of " + std::to_string(size) + " bytes at offset " +
                         std::to_string(current_offset_) + " of tensor '" + info.name() + "' (" +
                         std::to_string(info.byte_size()) + " bytes, chunks of at most " +
                         std::to_string(manifest_.chunk_bytes()) + ") does not fit");
  }
  if (data != nullptr) {
    if (sha256_) sha256_->Update(data, size);
    if (xxh3_) xxh3_->Update(data, size);
  }
  current_offset_ += size;
  received_ += size;
  if (current_offset_ == info.byte_size()) return EndTensor();
  return Status::Ok();
}

Status DownloadCheck::EndTensor() {
  const auto& info = manifest_.tensors(current_tensor_);
  if (sha256_ || xxh3_) {
    const std::string got = xxh3_ ? xxh3_->FinishHex() : sha256_->FinishHex();
    const std::string& expected = xxh3_ ? info.xxh3_128() : info.sha256();
    if (got != expected) {
      return DataLossError(what_ + ": tensor '" + info.name() + "': content " + (xxh3_ ? "checksum (xxh3_128) " : "hash ") +
                           got.substr(0, 12) + "... does not match the manifest's " + expected.substr(0, 12) + "...");
    }
    sha256_.reset();
    xxh3_.reset();
  }
  ++current_tensor_;
  current_offset_ = 0;
  SkipEmptyTensors();
  StartDigest();
  return Status::Ok();
}

void DownloadCheck::SkipEmptyTensors() {
  while (current_tensor_ < manifest_.tensors_size() && manifest_.tensors(current_tensor_).byte_size() == 0) {
    ++current_tensor_;
  }
}

Status DownloadCheck::Finish() const {
  if (!has_manifest_) return DataLossError(what_ + ": no manifest arrived");
  if (current_tensor_ < manifest_.tensors_size()) {
    return DataLossError(what_ + ": the transfer ended early: got " + std::to_string(received_) + " of " +
                         std::to_string(manifest_.total_bytes()) + " bytes");
  }
  return Status::Ok();
}

}  // namespace tessera::loadgen
