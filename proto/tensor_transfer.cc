#include "proto/tensor_transfer.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "base/escape.h"
#include "base/huge_pages.h"
#include "base/sha256.h"
#include "base/xxh3.h"
#include "core/update_codec.h"

namespace tessera::wire {
namespace {

// The dense encoding a model tensor's dtype names, where it is one of those.
std::optional<UpdateEncoding> DenseEncodingOf(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return UpdateEncoding::kFloat32;
    case v1::DTYPE_FLOAT16: return UpdateEncoding::kFloat16;
    case v1::DTYPE_BFLOAT16: return UpdateEncoding::kBFloat16;
    case v1::DTYPE_INT8: return UpdateEncoding::kInt8;
    default: return std::nullopt;
  }
}

}  // namespace

v1::TensorManifest BuildManifest(const TensorSet& tensors, uint32_t chunk_bytes, bool sha256) {
  v1::TensorManifest manifest;
  uint64_t total = 0;
  for (const auto& t : tensors) {
    auto* info = manifest.add_tensors();
    info->set_name(t.name);
    for (int64_t d : t.shape) info->add_shape(d);
    info->set_dtype(v1::DTYPE_FLOAT32);
    info->set_byte_size(t.ByteSize());
    if (sha256) info->set_sha256(t.Sha256());
    total += t.ByteSize();
  }
  manifest.set_total_bytes(total);
  manifest.set_chunk_bytes(std::min(chunk_bytes, kMaxChunkBytes));
  return manifest;
}

Status ForEachChunk(const TensorSet& tensors, uint32_t chunk_bytes, uint64_t resume_offset,
                    const std::function<Status(const v1::TensorChunk&)>& emit) {
  std::vector<std::string_view> bytes;
  bytes.reserve(tensors.size());
  for (const NamedTensor& t : tensors) bytes.emplace_back(reinterpret_cast<const char*>(t.values.data()), t.ByteSize());
  return ForEachChunk(bytes, chunk_bytes, resume_offset, emit);
}

Status ForEachChunk(std::span<const std::string_view> tensors, uint32_t chunk_bytes, uint64_t resume_offset,
                    const std::function<Status(const v1::TensorChunk&)>& emit) {
  chunk_bytes = std::clamp<uint32_t>(chunk_bytes, 4, kMaxChunkBytes);
  uint64_t global = 0;
  v1::TensorChunk chunk;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string_view bytes = tensors[i];
    uint64_t offset = 0;
    if (resume_offset > global) offset = std::min<uint64_t>(bytes.size(), resume_offset - global);
    while (offset < bytes.size()) {
      const uint64_t n = std::min<uint64_t>(chunk_bytes, bytes.size() - offset);
      chunk.set_tensor_index(static_cast<uint32_t>(i));
      chunk.set_offset(offset);
      chunk.mutable_data()->assign(bytes.data() + offset, n);  // the buffer reused chunk to chunk
      RETURN_IF_ERROR(emit(chunk));
      offset += n;
    }
    global += bytes.size();
  }
  return Status::Ok();
}

TensorAssembler::TensorAssembler(std::string what, uint64_t max_total_bytes)
    : what_(std::move(what)), max_total_bytes_(max_total_bytes), max_decoded_bytes_(max_total_bytes) {}

void TensorAssembler::AcceptEncoded(uint64_t max_decoded_bytes) {
  accept_encoded_ = true;
  max_decoded_bytes_ = max_decoded_bytes;
}

uint8_t* TensorAssembler::WireBytes(size_t index) {
  if (!encoded_[index].empty()) return reinterpret_cast<uint8_t*>(encoded_[index].data());
  return reinterpret_cast<uint8_t*>(tensors_[index].values.data());
}

Status TensorAssembler::Start(const v1::TensorManifest& manifest) {
  if (started_) return InvalidArgumentError(what_ + ": a second manifest arrived");
  if (manifest.total_bytes() > max_total_bytes_) {
    return InvalidArgumentError(what_ + ": manifest declares " + std::to_string(manifest.total_bytes()) +
                                " bytes, more than the expected " + std::to_string(max_total_bytes_));
  }
  uint64_t total = 0, decoded = 0;
  tensors_.clear();
  tensors_.reserve(manifest.tensors_size());
  wire_bytes_.clear();
  encoded_.clear();
  for (const auto& info : manifest.tensors()) {
    const std::optional<UpdateEncoding> encoding = DenseEncodingOf(info.dtype());
    if (!encoding || (*encoding != UpdateEncoding::kFloat32 && !accept_encoded_)) {
      return InvalidArgumentError(what_ + ": tensor " + QuoteUntrusted(info.name()) + ": expected dtype " +
                                  (accept_encoded_ ? "FLOAT32, FLOAT16, BFLOAT16 or INT8" : "FLOAT32") + ", got " +
                                  (v1::DType_IsValid(info.dtype()) ? v1::DType_Name(info.dtype())
                                                                   : std::to_string(info.dtype())));
    }
    NamedTensor t;
    t.name = info.name();
    bool empty = false;
    for (int64_t d : info.shape()) {
      if (d < 0) return InvalidArgumentError(what_ + ": tensor " + QuoteUntrusted(info.name()) + " has a negative dimension");
      t.shape.push_back(d);
      empty |= d == 0;
    }
    // The element count is bounded while it is multiplied, so that hostile dimensions cannot
    // wrap it around to a small number that matches byte_size.
    const uint64_t max_elements = max_decoded_bytes_ / sizeof(float);
    uint64_t elements = empty ? 0 : 1;
    for (size_t i = 0; i < t.shape.size() && elements > 0; ++i) {
      const uint64_t d = static_cast<uint64_t>(t.shape[i]);
      if (elements > max_elements / d) {
        return InvalidArgumentError(what_ + ": tensor " + QuoteUntrusted(info.name()) + ": shape " +
                                    EscapeUntrusted(ShapeToString(t.shape)) + " holds more than the expected " +
                                    std::to_string(max_decoded_bytes_) + " bytes of float32 values");
      }
      elements *= d;
    }
    // (Within max_elements, no encoding's byte count overflows.)
    const uint64_t needs = *EncodedByteSize(*encoding, elements, 0);
    if (info.byte_size() != needs) {
      return InvalidArgumentError(what_ + ": tensor " + QuoteUntrusted(info.name()) + ": shape " + EscapeUntrusted(ShapeToString(t.shape)) +
                                  " needs " + std::to_string(needs) + " bytes in " + UpdateEncodingName(*encoding) +
                                  ", manifest says " + std::to_string(info.byte_size()));
    }
    total += info.byte_size();
    if (total > max_total_bytes_) {
      return InvalidArgumentError(what_ + ": tensors exceed the expected " + std::to_string(max_total_bytes_) + " bytes");
    }
    decoded += elements * sizeof(float);
    if (decoded > max_decoded_bytes_) {
      return InvalidArgumentError(what_ + ": tensors' float32 values exceed the expected " +
                                  std::to_string(max_decoded_bytes_) + " bytes");
    }
    t.values = ZeroedFloats(static_cast<size_t>(elements));
    tensors_.push_back(std::move(t));
    wire_bytes_.push_back(info.byte_size());
    encoded_.emplace_back(*encoding == UpdateEncoding::kFloat32 ? 0 : static_cast<size_t>(info.byte_size()), '\0');
  }
  if (total != manifest.total_bytes()) {
    return InvalidArgumentError(what_ + ": manifest total_bytes " + std::to_string(manifest.total_bytes()) +
                                " does not match its tensors' " + std::to_string(total));
  }
  manifest_ = manifest;
  started_ = true;
  current_tensor_ = 0;
  current_offset_ = 0;
  // Skip tensors without bytes at the front.
  while (current_tensor_ < tensors_.size() && wire_bytes_[current_tensor_] == 0) ++current_tensor_;
  return Status::Ok();
}

Status TensorAssembler::Add(const v1::TensorChunk& chunk) {
  ASSIGN_OR_RETURN(uint8_t* at, BeginChunk(chunk.tensor_index(), chunk.offset(), chunk.data().size()));
  std::memcpy(at, chunk.data().data(), chunk.data().size());
  return EndChunk();
}

Result<uint8_t*> TensorAssembler::BeginChunk(uint32_t index, uint64_t offset, uint64_t size) {
  if (!started_) return InvalidArgumentError(what_ + ": a chunk arrived before the manifest");
  if (size > kMaxChunkBytes) {
    return InvalidArgumentError(what_ + ": chunk of " + std::to_string(size) + " bytes exceeds the 1 MiB limit");
  }
  if (current_tensor_ >= tensors_.size()) {
    return InvalidArgumentError(what_ + ": a chunk arrived after every tensor was complete");
  }
  if (index != current_tensor_ || offset != current_offset_) {
    return InvalidArgumentError(what_ + ": expected a chunk of tensor " + std::to_string(current_tensor_) +
                                " at offset " + std::to_string(current_offset_) + ", got tensor " +
                                std::to_string(index) + " at offset " + std::to_string(offset));
  }
  const uint64_t tensor_bytes = wire_bytes_[current_tensor_];
  if (current_offset_ + size > tensor_bytes || size == 0) {
    return InvalidArgumentError(what_ + ": chunk of " + std::to_string(size) + " bytes at offset " +
                                std::to_string(current_offset_) + " does not fit tensor " +
                                QuoteUntrusted(tensors_[current_tensor_].name) + " of " + std::to_string(tensor_bytes) +
                                " bytes");
  }
  pending_ = size;
  return WireBytes(current_tensor_) + current_offset_;
}

Status TensorAssembler::EndChunk() {
  if (pending_ == 0) return FailedPreconditionError(what_ + ": a chunk ended that had not begun");
  current_offset_ += pending_;
  received_ += pending_;
  pending_ = 0;
  if (current_offset_ == wire_bytes_[current_tensor_]) {
    ++current_tensor_;
    current_offset_ = 0;
    while (current_tensor_ < tensors_.size() && wire_bytes_[current_tensor_] == 0) ++current_tensor_;
  }
  return Status::Ok();
}

Result<TensorSet> TensorAssembler::Finish() {
  if (!started_) return DataLossError(what_ + ": no manifest arrived");
  if (current_tensor_ < tensors_.size()) {
    return DataLossError(what_ + ": transfer ended early: got " + std::to_string(received_) + " of " +
                         std::to_string(manifest_.total_bytes()) + " bytes");
  }
  for (int i = 0; i < manifest_.tensors_size(); ++i) {
    // XXH3-128 where the manifest gives it (a coordinator's model versions do), else SHA-256.
    const v1::TensorInfo& info = manifest_.tensors(i);
    const size_t index = static_cast<size_t>(i);
    NamedTensor& t = tensors_[index];
    const bool xxh3 = !info.xxh3_128().empty();
    const uint8_t* bytes = WireBytes(index);
    const std::string got = xxh3 ? Xxh3Hex(bytes, wire_bytes_[index]) : Sha256Hex(bytes, wire_bytes_[index]);
    const std::string& expected = xxh3 ? info.xxh3_128() : info.sha256();
    if (got != expected) {
      return DataLossError(what_ + ": tensor " + QuoteUntrusted(t.name) + ": content " +
                           (xxh3 ? "checksum (xxh3_128) " : "hash ") + got.substr(0, 12) +
                           "... does not match the manifest's " + EscapeUntrusted(expected.substr(0, 12)) + "...");
    }
    if (encoded_[index].empty()) continue;
    Status decoded = DecodeValues(*DenseEncodingOf(info.dtype()), encoded_[index], 0, t.values);
    if (!decoded.ok()) return InvalidArgumentError(what_ + ": tensor " + QuoteUntrusted(t.name) + ": " + decoded.message());
    std::string().swap(encoded_[index]);
  }
  started_ = false;
  return std::move(tensors_);
}

Result<TensorSet> ReadInlineModel(const v1::InlineModel& model, const std::string& what, uint64_t max_bytes) {
  // Every byte of a model inside its task is in hand: a manifest that declares more than its
  // chunks carry is refused before its tensors are allocated (and zeroed), where a task of a
  // few bytes could make the worker fill up to max_bytes for a model that is not there.
  uint64_t carried = 0;
  for (const v1::TensorChunk& chunk : model.chunks()) carried += chunk.data().size();
  if (model.manifest().total_bytes() > carried && model.manifest().total_bytes() <= max_bytes) {
    return DataLossError(what + ": manifest declares " + std::to_string(model.manifest().total_bytes()) +
                         " bytes, its chunks carry " + std::to_string(carried));
  }
  // Within that, the tensors are bounded by the bytes in hand too: a manifest whose tensors
  // outgrow the total_bytes it gives is refused at the first that does not fit.
  TensorAssembler assembler(what, model.manifest().total_bytes() > max_bytes ? max_bytes : std::min(max_bytes, carried));
  // An encoded tensor's float32 values take up to four times its bytes (int8's one a value).
  assembler.AcceptEncoded(std::min(max_bytes, carried > max_bytes / 4 ? max_bytes : 4 * carried));
  RETURN_IF_ERROR(assembler.Start(model.manifest()));
  for (const v1::TensorChunk& chunk : model.chunks()) RETURN_IF_ERROR(assembler.Add(chunk));
  return assembler.Finish();
}

}  // namespace tessera::wire
