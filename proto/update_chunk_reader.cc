#include "proto/update_chunk_reader.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <optional>

#include "proto/byte_buffers.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::wire {
namespace {

using google::protobuf::internal::WireFormatLite;

constexpr uint32_t Tag(int field, WireFormatLite::WireType type) {
  return static_cast<uint32_t>(field << 3) | static_cast<uint32_t>(type);
}
constexpr uint32_t kChunkTag = Tag(2, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);        // UpdateChunkMessage.chunk
constexpr uint32_t kIndexTag = Tag(1, WireFormatLite::WIRETYPE_VARINT);                  // TensorChunk.tensor_index
constexpr uint32_t kOffsetTag = Tag(2, WireFormatLite::WIRETYPE_VARINT);                 // TensorChunk.offset
constexpr uint32_t kDataTag = Tag(3, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);         // TensorChunk.data

// The in-place read: nullopt when the layout is not the writers' (the caller parses the
// message instead); otherwise what adding the chunk gave.
std::optional<Status> ReadInPlace(const grpc::ByteBuffer& message, UpdateAssembler& assembler, const std::string& what) {
  grpc::ByteBuffer view(message);  // shares the slices
  grpc::ProtoBufferReader reader(&view);
  google::protobuf::io::CodedInputStream in(&reader);
  const uint64_t total = message.Length();
  uint32_t length = 0;
  if (in.ReadTag() != kChunkTag || !in.ReadVarint32(&length)) return std::nullopt;
  const uint64_t chunk_end = static_cast<uint64_t>(in.CurrentPosition()) + length;
  if (chunk_end != total) return std::nullopt;  // other fields after the chunk
  uint32_t index = 0;
  uint64_t offset = 0;
  for (;;) {
    const uint32_t tag = in.ReadTag();
    if (tag == kIndexTag) {
      if (!in.ReadVarint32(&index)) return std::nullopt;
    } else if (tag == kOffsetTag) {
      if (!in.ReadVarint64(&offset)) return std::nullopt;
    } else if (tag == kDataTag) {
      uint32_t size = 0;
      if (!in.ReadVarint32(&size)) return std::nullopt;
      if (static_cast<uint64_t>(in.CurrentPosition()) + size != chunk_end) return std::nullopt;  // not the last field
      auto at = assembler.BeginChunk(index, offset, size);
      if (!at.ok()) return at.status();
      if (!in.ReadRaw(*at, static_cast<int>(size))) {
        return InvalidArgumentError(what + ": a chunk message ended inside its data");
      }
      return assembler.EndChunk();
    } else {
      return std::nullopt;  // unknown fields, or no data at all
    }
  }
}

}  // namespace

Status AddChunkMessage(const grpc::ByteBuffer& message, UpdateAssembler& assembler, const std::string& what) {
  if (auto read = ReadInPlace(message, assembler, what)) return *read;
  v1::UpdateChunkMessage parsed;
  if (!FromByteBuffer(message, &parsed)) {
    return InvalidArgumentError(what + ": a message that is not an UpdateChunkMessage");
  }
  if (!parsed.has_chunk()) return InvalidArgumentError(what + ": expected tensor chunks after the header");
  return assembler.Add(parsed.chunk());
}

}  // namespace tessera::wire
