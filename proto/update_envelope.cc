#include "proto/update_envelope.h"

#include <algorithm>

#include "base/escape.h"
#include "base/sha256.h"
#include "base/xxh3.h"
#include "proto/tensor_transfer.h"

namespace tessera::wire {

Result<std::vector<UpdateSetView>> UpdateSets(const v1::UpdateHeader& header, const std::string& what) {
  std::vector<UpdateSetView> sets;
  if (header.sets_size() == 0) {
    sets.push_back(UpdateSetView{kDeltaSet, v1::ENCODING_FLOAT32, &header.manifest()});
    return sets;
  }
  if (header.has_manifest() && header.manifest().tensors_size() > 0) {
    return InvalidArgumentError(what + ": the header has both 'manifest' and 'sets'; expected one of them");
  }
  if (header.sets_size() > kMaxUpdateSets) {
    return InvalidArgumentError(what + ": field 'sets': " + std::to_string(header.sets_size()) +
                                " sets, expected at most " + std::to_string(kMaxUpdateSets));
  }
  sets.reserve(static_cast<size_t>(header.sets_size()));
  bool delta = false;
  for (const auto& set : header.sets()) {
    if (set.name().empty() || set.name().size() > 64) {
      return InvalidArgumentError(what + ": a set's name must be 1 to 64 characters, got " +
                                  std::to_string(set.name().size()));
    }
    // At most kMaxUpdateSets names: a scan of the ones before is the cheapest check.
    for (const UpdateSetView& before : sets) {
      if (before.name == set.name()) return InvalidArgumentError(what + ": set " + QuoteUntrusted(set.name()) + " appears twice");
    }
    auto encoding = ToUpdateEncoding(set.encoding());
    if (!encoding.ok()) return encoding.status().WithContext(what + ": set " + QuoteUntrusted(set.name()));
    delta |= set.name() == kDeltaSet;
    sets.push_back(UpdateSetView{set.name(), ToWireEncoding(*encoding), &set.manifest()});
  }
  if (!delta) return InvalidArgumentError(what + ": no 'delta' set; an update must carry one");
  return sets;
}

Result<UpdateEncoding> ToUpdateEncoding(v1::Encoding encoding) {
  switch (encoding) {
    case v1::ENCODING_UNSPECIFIED:
    case v1::ENCODING_FLOAT32: return UpdateEncoding::kFloat32;
    case v1::ENCODING_FLOAT16: return UpdateEncoding::kFloat16;
    case v1::ENCODING_BFLOAT16: return UpdateEncoding::kBFloat16;
    case v1::ENCODING_INT8: return UpdateEncoding::kInt8;
    case v1::ENCODING_TOPK: return UpdateEncoding::kTopK;
    default: break;
  }
  return InvalidArgumentError("encoding " + std::to_string(static_cast<int>(encoding)) +
                              " is not one this build reads; expected ENCODING_FLOAT32, ENCODING_FLOAT16, "
                              "ENCODING_BFLOAT16, ENCODING_INT8 or ENCODING_TOPK");
}

v1::Encoding ToWireEncoding(UpdateEncoding encoding) {
  switch (encoding) {
    case UpdateEncoding::kFloat32: return v1::ENCODING_FLOAT32;
    case UpdateEncoding::kFloat16: return v1::ENCODING_FLOAT16;
    case UpdateEncoding::kBFloat16: return v1::ENCODING_BFLOAT16;
    case UpdateEncoding::kInt8: return v1::ENCODING_INT8;
    case UpdateEncoding::kTopK: return v1::ENCODING_TOPK;
  }
  return v1::ENCODING_FLOAT32;
}

v1::DType EncodedDType(UpdateEncoding encoding) {
  switch (encoding) {
    case UpdateEncoding::kFloat16: return v1::DTYPE_FLOAT16;
    case UpdateEncoding::kBFloat16: return v1::DTYPE_BFLOAT16;
    case UpdateEncoding::kInt8: return v1::DTYPE_INT8;
    case UpdateEncoding::kFloat32:
    case UpdateEncoding::kTopK: return v1::DTYPE_FLOAT32;
  }
  return v1::DTYPE_FLOAT32;
}

void IdentifyUpdate(const v1::TrainTask& task, const std::string& worker_id, const std::string& session,
                    v1::UpdateHeader* header) {
  header->set_worker_id(worker_id);
  header->set_session(session);
  header->set_job_id(task.job_id());
  header->set_round(task.round());
  header->set_attempt(task.attempt());
  header->set_base_model_version(task.model_version());
}

void SetDigest(UpdateDigest digest, std::string_view bytes, v1::TensorInfo* info) {
  if (digest == UpdateDigest::kXxh3) {
    info->set_xxh3_128(Xxh3Hex(bytes.data(), bytes.size()));
  } else {
    info->set_sha256(Sha256Hex(bytes.data(), bytes.size()));
  }
}

void AppendUpdateSet(const std::string& name, const TensorSet& tensors, UpdateEncoding encoding, double fraction,
                     uint32_t chunk_bytes, v1::UpdateHeader* header, UpdateBytes* stream, UpdateDigest digest) {
  v1::TensorSetInfo* set = header->add_sets();
  set->set_name(name);
  set->set_encoding(ToWireEncoding(encoding));
  v1::TensorManifest* manifest = set->mutable_manifest();
  uint64_t total = 0;
  for (const NamedTensor& t : tensors) {
    std::string bytes = EncodeValues(encoding, t.values, fraction);
    v1::TensorInfo* info = manifest->add_tensors();
    info->set_name(t.name);
    for (int64_t d : t.shape) info->add_shape(d);
    info->set_dtype(EncodedDType(encoding));
    info->set_byte_size(bytes.size());
    SetDigest(digest, bytes, info);
    total += bytes.size();
    stream->push_back(std::move(bytes));
  }
  manifest->set_total_bytes(total);
  manifest->set_chunk_bytes(std::clamp<uint32_t>(chunk_bytes, 4, kMaxChunkBytes));
}

void AppendChunks(const UpdateBytes& tensors, uint32_t chunk_bytes,
                  google::protobuf::RepeatedPtrField<v1::TensorChunk>* out) {
  chunk_bytes = std::clamp<uint32_t>(chunk_bytes, 4, kMaxChunkBytes);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string& bytes = tensors[i];
    for (size_t offset = 0; offset < bytes.size(); offset += chunk_bytes) {
      v1::TensorChunk* chunk = out->Add();
      chunk->set_tensor_index(static_cast<uint32_t>(i));
      chunk->set_offset(offset);
      chunk->set_data(bytes.data() + offset, std::min<size_t>(chunk_bytes, bytes.size() - offset));
    }
  }
}

namespace {

void PutVarint(std::string* out, uint64_t value) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// A slice of `size` bytes at `data` that holds `owner` until gRPC releases it.
grpc::Slice SliceHolding(const std::shared_ptr<const UpdateBytes>& owner, const char* data, size_t size) {
  auto* held = new std::shared_ptr<const UpdateBytes>(owner);
  grpc_slice slice = grpc_slice_new_with_user_data(
      const_cast<char*>(data), size, [](void* p) { delete static_cast<std::shared_ptr<const UpdateBytes>*>(p); }, held);
  return grpc::Slice(slice, grpc::Slice::STEAL_REF);
}

}  // namespace

Status ForEachChunkMessage(const std::shared_ptr<const UpdateBytes>& tensors, uint32_t chunk_bytes,
                           const std::function<Status(const grpc::ByteBuffer&)>& emit) {
  chunk_bytes = std::clamp<uint32_t>(chunk_bytes, 4, kMaxChunkBytes);
  std::string fields, head;
  for (size_t i = 0; i < tensors->size(); ++i) {
    const std::string& bytes = (*tensors)[i];
    for (size_t offset = 0; offset < bytes.size(); offset += chunk_bytes) {
      const size_t n = std::min<size_t>(chunk_bytes, bytes.size() - offset);
      fields.clear();  // TensorChunk: tensor_index (1), offset (2), then data's tag and length (3)
      fields.push_back(static_cast<char>(1 << 3));
      PutVarint(&fields, i);
      fields.push_back(static_cast<char>(2 << 3));
      PutVarint(&fields, offset);
      fields.push_back(static_cast<char>((3 << 3) | 2));
      PutVarint(&fields, n);
      head.assign(1, static_cast<char>((2 << 3) | 2));  // UpdateChunkMessage.chunk
      PutVarint(&head, fields.size() + n);
      head += fields;
      grpc::Slice slices[2] = {grpc::Slice(head), SliceHolding(tensors, bytes.data() + offset, n)};
      RETURN_IF_ERROR(emit(grpc::ByteBuffer(slices, 2)));
    }
  }
  return Status::Ok();
}

Status ForEachChunk(const UpdateBytes& tensors, uint32_t chunk_bytes,
                    const std::function<Status(const v1::TensorChunk&)>& emit) {
  const std::vector<std::string_view> bytes(tensors.begin(), tensors.end());
  return ForEachChunk(bytes, chunk_bytes, 0, emit);
}

}  // namespace tessera::wire
