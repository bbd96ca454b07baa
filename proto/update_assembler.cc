#include "proto/update_assembler.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "base/escape.h"
#include "base/huge_pages.h"
#include "base/sha256.h"
#include "core/streaming_copy.h"
#include "proto/tensor_transfer.h"
#include "proto/update_envelope.h"

namespace tessera::wire {

// float32 tensors are assembled in place: the wire's little-endian bytes are their values.
static_assert(std::endian::native == std::endian::little, "float32 chunks are copied as the host's floats");

UpdateAssembler::UpdateAssembler(std::string what, uint64_t max_decoded_bytes, double topk_fraction,
                                 FloatBufferPool* pool)
    : what_(std::move(what)), max_decoded_bytes_(max_decoded_bytes), topk_fraction_(topk_fraction), pool_(pool) {}

void UpdateAssembler::SizeValues(Pending& pending) {
  const size_t n = static_cast<size_t>(pending.elements);
  if (pending.tensor.values.size() == n) return;
  pending.tensor.values = pool_ != nullptr ? pool_->Take(n) : ZeroedFloats(n);
}

std::string UpdateAssembler::Names(const Pending& pending) const {
  return "set " + QuoteUntrusted(set_names_[pending.set]) + ", tensor " + QuoteUntrusted(pending.tensor.name);
}

Status UpdateAssembler::Start(const std::vector<UpdateSetView>& sets) {
  if (started_) return InvalidArgumentError(what_ + ": a second envelope arrived");
  const uint64_t max_elements = max_decoded_bytes_ / sizeof(float);
  size_t tensors = 0;
  for (const UpdateSetView& set : sets) tensors += static_cast<size_t>(set.manifest->tensors_size());
  tensors_.reserve(std::min<size_t>(tensors, 4096));  // one allocation for a model's tensors, not one per doubling
  for (const UpdateSetView& set : sets) {
    const std::string_view short_name = set.name.substr(0, 64);
    const auto set_name = [&] { return "set " + QuoteUntrusted(short_name); };  // for errors only
    auto known = ToUpdateEncoding(set.encoding);
    if (!known.ok()) return known.status().WithContext(what_ + ": " + set_name());
    const UpdateEncoding encoding = *known;
    if (encoding == UpdateEncoding::kTopK && !(topk_fraction_ > 0 && topk_fraction_ <= 1)) {
      return InvalidArgumentError(what_ + ": " + set_name() + " is top-k encoded, but the job sends no top-k updates");
    }
    set_names_.emplace_back(short_name);
    const bool scanned = !scan_set_.empty() && set.name == scan_set_ && scans_.empty();
    uint64_t set_total = 0;
    for (const v1::TensorInfo& info : set.manifest->tensors()) {
      Pending pending;
      pending.set = set_names_.size() - 1;
      pending.encoding = encoding;
      pending.tensor.name = info.name();
      // Built only for an error: this runs for every tensor of every update.
      const auto where = [&] { return what_ + ": " + Names(pending); };
      if (info.dtype() != EncodedDType(encoding)) {
        return InvalidArgumentError(where() + ": expected dtype " + v1::DType_Name(EncodedDType(encoding)) + " for " +
                                    UpdateEncodingName(encoding) + ", got " + v1::DType_Name(info.dtype()));
      }
      bool empty = false;
      pending.tensor.shape.reserve(static_cast<size_t>(std::min(info.shape_size(), 16)));
      for (int64_t d : info.shape()) {
        if (d < 0) return InvalidArgumentError(where() + " has a negative dimension");
        pending.tensor.shape.push_back(d);
        empty |= d == 0;
      }
      // Bounded while it is multiplied, so that hostile dimensions cannot wrap it around.
      uint64_t elements = empty ? 0 : 1;
      for (size_t i = 0; i < pending.tensor.shape.size() && elements > 0; ++i) {
        const uint64_t d = static_cast<uint64_t>(pending.tensor.shape[i]);
        if (elements > max_elements / d) {
          return InvalidArgumentError(where() + ": shape " + EscapeUntrusted(ShapeToString(pending.tensor.shape)) +
                                      " holds more than the expected " + std::to_string(max_decoded_bytes_) +
                                      " bytes of float32");
        }
        elements *= d;
      }
      if (elements > max_elements - decoded_bytes_ / sizeof(float)) {
        return InvalidArgumentError(where() + ": the update's tensors exceed the expected " +
                                    std::to_string(max_decoded_bytes_) + " bytes of float32");
      }
      const std::optional<uint64_t> size = EncodedByteSize(encoding, elements, topk_fraction_);
      if (!size || info.byte_size() != *size) {
        return InvalidArgumentError(where() + ": shape " + EscapeUntrusted(ShapeToString(pending.tensor.shape)) +
                                    " in " + UpdateEncodingName(encoding) + " needs " +
                                    (size ? std::to_string(*size) : std::string("too many")) + " bytes, manifest says " +
                                    std::to_string(info.byte_size()));
      }
      pending.elements = elements;
      if (scanned) {
        scans_.emplace_back();
        if (encoding == UpdateEncoding::kFloat32) pending.scan_slot = static_cast<int>(scans_.size() - 1);
      }
      pending.byte_size = *size;
      pending.xxh3 = !info.xxh3_128().empty();
      pending.digest = pending.xxh3 ? info.xxh3_128() : info.sha256();
      decoded_bytes_ += elements * sizeof(float);
      set_total += *size;  // each at most 8/4 of its float32 bytes: no overflow
      tensors_.push_back(std::move(pending));
    }
    if (set_total != set.manifest->total_bytes()) {
      return InvalidArgumentError(what_ + ": " + set_name() + ": manifest total_bytes " +
                                  std::to_string(set.manifest->total_bytes()) + " does not match its tensors' " +
                                  std::to_string(set_total));
    }
    total_bytes_ += set_total;
  }
  started_ = true;
  current_ = 0;
  offset_ = 0;
  // Tensors of no bytes (an empty shape) are complete already.
  while (current_ < tensors_.size() && tensors_[current_].byte_size == 0) {
    RETURN_IF_ERROR(Complete(tensors_[current_]));
    ++current_;
  }
  return Status::Ok();
}

Status UpdateAssembler::Add(const v1::TensorChunk& chunk) {
  auto at = BeginChunk(chunk.tensor_index(), chunk.offset(), chunk.data().size());
  if (!at.ok()) return at.status();
  std::memcpy(*at, chunk.data().data(), chunk.data().size());
  return EndChunk();
}

Result<uint8_t*> UpdateAssembler::BeginChunk(uint32_t tensor_index, uint64_t offset, uint64_t size) {
  if (!started_) return InvalidArgumentError(what_ + ": a chunk arrived before the header");
  if (chunk_at_ != nullptr) return InvalidArgumentError(what_ + ": a chunk began before the last one ended");
  if (size > kMaxChunkBytes) {
    return InvalidArgumentError(what_ + ": chunk of " + std::to_string(size) + " bytes exceeds the 1 MiB limit");
  }
  if (current_ >= tensors_.size()) return InvalidArgumentError(what_ + ": a chunk arrived after every tensor was complete");
  if (tensor_index != current_ || offset != offset_) {
    return InvalidArgumentError(what_ + ": expected a chunk of tensor " + std::to_string(current_) + " at offset " +
                                std::to_string(offset_) + ", got tensor " + std::to_string(tensor_index) +
                                " at offset " + std::to_string(offset));
  }
  Pending& pending = tensors_[current_];
  if (size == 0 || size > pending.byte_size - offset_) {
    return InvalidArgumentError(what_ + ": chunk of " + std::to_string(size) + " bytes at offset " +
                                std::to_string(offset_) + " does not fit " + Names(pending) + " of " +
                                std::to_string(pending.byte_size) + " bytes");
  }
  chunk_at_ = Destination(pending) + offset_;
  chunk_size_ = size;
  chunk_taken_ = 0;
  chunk_in_pieces_ = false;
  return chunk_at_;
}

Status UpdateAssembler::TakePiece(const uint8_t* data, size_t n) {
  if (chunk_at_ == nullptr) return InvalidArgumentError(what_ + ": chunk bytes arrived outside a chunk");
  if (n > chunk_size_ - chunk_taken_) {
    return InvalidArgumentError(what_ + ": more bytes than the chunk's " + std::to_string(chunk_size_));
  }
  chunk_in_pieces_ = true;
  if (tensors_[current_].xxh3) {
    xxh3_->Update(data, n);
  } else {
    sha256_->Update(data, n);
  }
  if (tensors_[current_].scan_slot >= 0) scanner_.Feed(data, n);
  uint8_t* to = chunk_at_ + chunk_taken_;
  if (tensors_[current_].encoding == UpdateEncoding::kFloat32 && decoded_bytes_ >= kStreamingMinBytes) {
    StreamingCopy(to, data, n);
  } else {
    std::memcpy(to, data, n);
  }
  chunk_taken_ += n;
  return Status::Ok();
}

uint8_t* UpdateAssembler::Destination(Pending& pending) {
  if (offset_ == 0) {
    if (!pending.xxh3) {
      sha256_ = std::make_unique<Sha256>();
    } else if (xxh3_) {
      xxh3_->Reset();  // the previous tensor's state, reused
    } else {
      xxh3_ = std::make_unique<Xxh3>();
    }
    if (pending.encoding == UpdateEncoding::kFloat32) {
      SizeValues(pending);  // byte_size is 4 x elements
    } else {
      buffer_.resize(pending.byte_size);
    }
  }
  return pending.encoding == UpdateEncoding::kFloat32 ? reinterpret_cast<uint8_t*>(pending.tensor.values.data())
                                                      : reinterpret_cast<uint8_t*>(buffer_.data());
}

Status UpdateAssembler::EndChunk() {
  if (chunk_at_ == nullptr) return InvalidArgumentError(what_ + ": a chunk ended that had not begun");
  if (chunk_in_pieces_) {  // hashed and scanned as they came
    if (chunk_taken_ != chunk_size_) {
      return InvalidArgumentError(what_ + ": a chunk ended after " + std::to_string(chunk_taken_) + " of its " +
                                  std::to_string(chunk_size_) + " bytes");
    }
  } else {
    if (tensors_[current_].xxh3) {
      xxh3_->Update(chunk_at_, chunk_size_);
    } else {
      sha256_->Update(chunk_at_, chunk_size_);
    }
    if (tensors_[current_].scan_slot >= 0) scanner_.Feed(chunk_at_, chunk_size_);  // still in cache
  }
  chunk_at_ = nullptr;
  offset_ += chunk_size_;
  received_ += chunk_size_;
  Pending& pending = tensors_[current_];
  if (offset_ == pending.byte_size) {
    RETURN_IF_ERROR(Complete(pending));
    ++current_;
    offset_ = 0;
    while (current_ < tensors_.size() && tensors_[current_].byte_size == 0) {
      RETURN_IF_ERROR(Complete(tensors_[current_]));
      ++current_;
    }
  }
  return Status::Ok();
}

Status UpdateAssembler::Complete(Pending& pending) {
  // A tensor of no bytes had no chunk, and no hasher.
  std::string got;
  if (pending.byte_size == 0) {
    got = pending.xxh3 ? Xxh3Hex("", 0) : Sha256Hex("", 0);
  } else {
    got = pending.xxh3 ? xxh3_->FinishHex() : sha256_->FinishHex();
  }
  sha256_.reset();  // the xxh3 state stays for the next tensor (Destination resets it)
  if (got != pending.digest) {
    return DataLossError(what_ + ": " + Names(pending) + ": content " + (pending.xxh3 ? "checksum (xxh3_128) " : "hash ") +
                         got.substr(0, 12) + "... does not match the manifest's " +
                         EscapeUntrusted(pending.digest.substr(0, 12)) + "...");
  }
  SizeValues(pending);  // float32: sized at its first chunk already, unless it had no bytes
  if (pending.scan_slot >= 0) scans_[static_cast<size_t>(pending.scan_slot)] = scanner_.Finish();
  if (pending.encoding == UpdateEncoding::kFloat32) return Status::Ok();  // its chunks were written into its values
  Status decoded = DecodeValues(pending.encoding, buffer_, topk_fraction_, pending.tensor.values);
  std::string().swap(buffer_);
  if (!decoded.ok()) return decoded.WithContext(what_ + ": " + Names(pending));
  return Status::Ok();
}

Result<std::map<std::string, TensorSet>> UpdateAssembler::Finish() {
  if (!started_) return DataLossError(what_ + ": no header arrived");
  if (current_ < tensors_.size()) {
    return DataLossError(what_ + ": transfer ended early: got " + std::to_string(received_) + " of " +
                         std::to_string(total_bytes_) + " bytes");
  }
  std::vector<size_t> counts(set_names_.size(), 0);
  for (const Pending& pending : tensors_) ++counts[pending.set];
  std::vector<TensorSet*> by_index(set_names_.size());
  std::map<std::string, TensorSet> sets;
  for (size_t k = 0; k < set_names_.size(); ++k) {
    by_index[k] = &sets[set_names_[k]];
    by_index[k]->reserve(counts[k]);  // one allocation per set, not one per doubling
  }
  for (Pending& pending : tensors_) by_index[pending.set]->push_back(std::move(pending.tensor));
  tensors_.clear();
  started_ = false;
  return sets;
}

}  // namespace tessera::wire
