#include "proto/update_chunk_reader.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <limits>
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

// A TensorChunk's fields read in place, the stream at the chunk's first field and
// `chunk_end` where it ends: nullopt when the layout is not the writers' (tensor_index,
// offset, then data last); otherwise what adding the chunk gave.
// `Assembler`: UpdateAssembler or TensorAssembler (BeginChunk, EndChunk).
template <typename Assembler>
std::optional<Status> ReadChunkFields(google::protobuf::io::CodedInputStream& in, uint64_t chunk_end,
                                      Assembler& assembler, const std::string& what) {
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
      if constexpr (requires(const uint8_t* piece, size_t n) { assembler.TakePiece(piece, n); }) {
        // The bytes handed over slice by slice as the transport holds them: hashed and
        // scanned there, then copied (UpdateAssembler::TakePiece).
        for (uint32_t left = size; left > 0;) {
          const void* piece = nullptr;
          int available = 0;
          if (!in.GetDirectBufferPointer(&piece, &available) || available <= 0) {
            return InvalidArgumentError(what + ": a chunk message ended inside its data");
          }
          const uint32_t n = std::min(left, static_cast<uint32_t>(available));
          RETURN_IF_ERROR(assembler.TakePiece(static_cast<const uint8_t*>(piece), n));
          if (!in.Skip(static_cast<int>(n))) return InvalidArgumentError(what + ": a chunk message ended inside its data");
          left -= n;
        }
      } else if (!in.ReadRaw(*at, static_cast<int>(size))) {
        return InvalidArgumentError(what + ": a chunk message ended inside its data");
      }
      return assembler.EndChunk();
    } else {
      return std::nullopt;  // unknown fields, or no data at all
    }
  }
}

// The in-place read: nullopt when the layout is not the writers' (the caller parses the
// message instead); otherwise what adding the chunk gave.
// UpdateChunkMessage.chunk and ModelChunkMessage.chunk are both field 2.
template <typename Assembler>
std::optional<Status> ReadInPlace(const grpc::ByteBuffer& message, Assembler& assembler, const std::string& what) {
  grpc::ProtoBufferReader reader(Unowned(message));
  google::protobuf::io::CodedInputStream in(&reader);
  const uint64_t total = message.Length();
  uint32_t length = 0;
  if (in.ReadTag() != kChunkTag || !in.ReadVarint32(&length)) return std::nullopt;
  const uint64_t chunk_end = static_cast<uint64_t>(in.CurrentPosition()) + length;
  if (chunk_end != total) return std::nullopt;  // other fields after the chunk
  return ReadChunkFields(in, chunk_end, assembler, what);
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

Status AddModelChunkMessage(const grpc::ByteBuffer& message, TensorAssembler& assembler, const std::string& what) {
  if (auto read = ReadInPlace(message, assembler, what)) return *read;
  v1::ModelChunkMessage parsed;
  if (!FromByteBuffer(message, &parsed)) return InvalidArgumentError(what + ": a message that is not a ModelChunkMessage");
  if (parsed.has_manifest()) return assembler.Start(parsed.manifest());  // a second one: refused, so named
  if (!parsed.has_chunk()) return InvalidArgumentError(what + ": expected tensor chunks after the manifest");
  return assembler.Add(parsed.chunk());
}

}  // namespace tessera::wire

namespace tessera::wire {
namespace {

constexpr uint32_t kSessionUpdateTag = Tag(2, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);  // TaskSessionMessage.update
constexpr uint32_t kInlineHeaderTag = Tag(1, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);   // InlineUpdate.header
constexpr uint32_t kInlineChunkTag = Tag(2, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);    // InlineUpdate.chunks

}  // namespace

Status InlineUpdateReader::Start(grpc::ByteBuffer&& message, v1::UpdateHeader* header) {
  message_.Clear();
  message_.Swap(&message);
  parsed_.reset();
  chunks_at_ = 0;
  {
    grpc::ProtoBufferReader reader(&message_);
    google::protobuf::io::CodedInputStream in(&reader);
    in.SetTotalBytesLimit(std::numeric_limits<int>::max());
    uint32_t length = 0, header_length = 0;
    if (in.ReadTag() == kSessionUpdateTag && in.ReadVarint32(&length) &&
        static_cast<uint64_t>(in.CurrentPosition()) + length == message_.Length() && in.ReadTag() == kInlineHeaderTag &&
        in.ReadVarint32(&header_length) &&
        static_cast<uint64_t>(in.CurrentPosition()) + header_length <= message_.Length()) {
      const auto limit = in.PushLimit(static_cast<int>(header_length));
      if (header->ParseFromCodedStream(&in) && in.ConsumedEntireMessage()) {
        in.PopLimit(limit);
        chunks_at_ = static_cast<uint64_t>(in.CurrentPosition());
        return Status::Ok();
      }
    }
  }
  // Not laid out as Tessera's writers lay it out (the header first): parsed as a message.
  parsed_.emplace();
  if (!FromByteBuffer(message_, &*parsed_) || !parsed_->has_update()) {
    return InvalidArgumentError(what_ + ": a message that is not a TaskSessionMessage carrying an update");
  }
  if (!parsed_->update().has_header()) return InvalidArgumentError(what_ + ": an inline update without its header");
  *header = parsed_->update().header();
  return Status::Ok();
}

Status InlineUpdateReader::AddChunks(UpdateAssembler& assembler) {
  int added = 0;  // chunks placed in place before a layout that is not the writers'
  if (!parsed_) {
    grpc::ProtoBufferReader reader(&message_);
    google::protobuf::io::CodedInputStream in(&reader);
    in.SetTotalBytesLimit(std::numeric_limits<int>::max());
    if (!in.Skip(static_cast<int>(chunks_at_))) return InvalidArgumentError(what_ + ": the message ended early");
    const uint64_t total = message_.Length();
    for (;;) {
      if (static_cast<uint64_t>(in.CurrentPosition()) == total) return Status::Ok();
      uint32_t length = 0;
      if (in.ReadTag() != kInlineChunkTag || !in.ReadVarint32(&length)) break;
      const uint64_t chunk_end = static_cast<uint64_t>(in.CurrentPosition()) + length;
      if (chunk_end > total) return InvalidArgumentError(what_ + ": a chunk runs past the end of its message");
      auto read = ReadChunkFields(in, chunk_end, assembler, what_);
      if (!read) break;
      RETURN_IF_ERROR(*read);
      ++added;
    }
    parsed_.emplace();
    if (!FromByteBuffer(message_, &*parsed_) || !parsed_->has_update()) {
      return InvalidArgumentError(what_ + ": a message that is not a TaskSessionMessage carrying an update");
    }
  }
  const auto& chunks = parsed_->update().chunks();
  for (int i = added; i < chunks.size(); ++i) RETURN_IF_ERROR(assembler.Add(chunks.Get(i)));
  return Status::Ok();
}

}  // namespace tessera::wire
