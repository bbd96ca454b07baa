#include "bench/loadgen/download_check.h"

#include <utility>

#include "proto/tensor_transfer.h"

namespace tessera::loadgen {

DownloadCheck::DownloadCheck(std::string what, uint64_t model_version, bool verify_hashes)
    : what_(std::move(what)), model_version_(model_version), verify_hashes_(verify_hashes) {}

Status DownloadCheck::Add(const v1::ModelChunkMessage& message) {
  if (message.has_manifest()) return StartManifest(message);
  if (message.has_chunk()) {
    if (!has_manifest_) return DataLossError(what_ + ": a chunk arrived before the manifest");
    return AddChunk(message.chunk());
  }
  return DataLossError(what_ + ": expected a manifest or a chunk, got an empty message");
}

Status DownloadCheck::StartManifest(const v1::ModelChunkMessage& message) {
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
    if (info.dtype() != v1::DTYPE_FLOAT32) {
      return DataLossError(what_ + ": tensor '" + info.name() + "': expected dtype FLOAT32, got " +
                           v1::DType_Name(info.dtype()));
    }
    uint64_t elements = 1;
    for (int64_t d : info.shape()) {
      if (d < 0) return DataLossError(what_ + ": tensor '" + info.name() + "' has a negative dimension");
      elements *= static_cast<uint64_t>(d);
    }
    if (info.byte_size() != elements * sizeof(float)) {
      return DataLossError(what_ + ": tensor '" + info.name() + "': its shape needs " +
                           std::to_string(elements * sizeof(float)) + " bytes, the manifest says " +
                           std::to_string(info.byte_size()));
    }
    total += info.byte_size();
  }
  if (total != m.total_bytes()) {
    return DataLossError(what_ + ": manifest total_bytes " + std::to_string(m.total_bytes()) +
                         " does not match its tensors' " + std::to_string(total));
  }
  manifest_ = m;
  has_manifest_ = true;
  current_tensor_ = 0;
  current_offset_ = 0;
  SkipEmptyTensors();
  if (verify_hashes_ && current_tensor_ < manifest_.tensors_size()) hasher_ = std::make_unique<Sha256>();
  return Status::Ok();
}

Status DownloadCheck::AddChunk(const v1::TensorChunk& chunk) {
  if (current_tensor_ >= manifest_.tensors_size()) {
    return DataLossError(what_ + ": a chunk arrived after every tensor was complete");
  }
  if (chunk.tensor_index() != static_cast<uint32_t>(current_tensor_) || chunk.offset() != current_offset_) {
    return DataLossError(what_ + ": expected a chunk of tensor " + std::to_string(current_tensor_) + " at offset " +
                         std::to_string(current_offset_) + ", got tensor " + std::to_string(chunk.tensor_index()) +
                         " at offset " + std::to_string(chunk.offset()));
  }
  const auto& info = manifest_.tensors(current_tensor_);
  const uint64_t size = chunk.data().size();
  if (size == 0 || size > manifest_.chunk_bytes() || current_offset_ + size > info.byte_size()) {
    return DataLossError(what_ + ": chunk of " + std::to_string(size) + " bytes at offset " +
                         std::to_string(current_offset_) + " of tensor '" + info.name() + "' (" +
                         std::to_string(info.byte_size()) + " bytes, chunks of at most " +
                         std::to_string(manifest_.chunk_bytes()) + ") does not fit");
  }
  if (hasher_) hasher_->Update(chunk.data().data(), size);
  current_offset_ += size;
  received_ += size;
  if (current_offset_ == info.byte_size()) return EndTensor();
  return Status::Ok();
}

Status DownloadCheck::EndTensor() {
  const auto& info = manifest_.tensors(current_tensor_);
  if (hasher_) {
    const std::string got = hasher_->FinishHex();
    if (got != info.sha256()) {
      return DataLossError(what_ + ": tensor '" + info.name() + "': content hash " + got.substr(0, 12) +
                           "... does not match the manifest's " + info.sha256().substr(0, 12) + "...");
    }
    hasher_.reset();
  }
  ++current_tensor_;
  current_offset_ = 0;
  SkipEmptyTensors();
  if (verify_hashes_ && current_tensor_ < manifest_.tensors_size()) hasher_ = std::make_unique<Sha256>();
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
