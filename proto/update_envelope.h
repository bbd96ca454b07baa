// The update envelope: what sets of tensors an upload carries and how each is encoded.
// An update is one or more named tensor sets ("delta", the client's model minus the round's
// global model, always; a strategy's own payload besides), each with an encoding; their
// chunks follow the header in set order, as one stream. A header without `sets` is an older
// worker's: its `manifest` is the "delta" set in float32.
//
// Each set's tensors travel in the set's encoding (core/update_codec.h): its manifest keeps
// the tensors' names and shapes, and gives the dtype, byte size and SHA-256 of the bytes as
// sent. UpdateAssembler (proto/update_assembler.h) reads them back to float32.
//
// Shared by the coordinator and the worker, like the rest of proto/.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "core/tensor.h"
#include "core/update_codec.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::wire {

inline constexpr char kDeltaSet[] = "delta";
inline constexpr int kMaxUpdateSets = 8;

// The bytes an upload's chunks carry: one string per tensor of the combined manifest, in order.
using UpdateBytes = std::vector<std::string>;

// One set of an update, read in place: `name` and `manifest` point into the header, which
// must outlive the view (a bare `manifest` is the set "delta"), and the encoding is explicit.
struct UpdateSetView {
  std::string_view name;
  v1::Encoding encoding = v1::ENCODING_FLOAT32;
  const v1::TensorManifest* manifest = nullptr;
};

// The sets `header` declares, each with its encoding made explicit (UNSPECIFIED reads as
// FLOAT32), without copying their manifests. Refuses a header with both `sets` and `manifest`,
// more than kMaxUpdateSets sets, an empty, over-long or repeated name, no "delta" set, and an
// encoding this build does not know, naming the set. `what` prefixes errors.
Result<std::vector<UpdateSetView>> UpdateSets(const v1::UpdateHeader& header, const std::string& what);


// The codec behind a wire encoding (UNSPECIFIED reads as FLOAT32); InvalidArgument for a
// value this build does not know.
Result<UpdateEncoding> ToUpdateEncoding(v1::Encoding encoding);
v1::Encoding ToWireEncoding(UpdateEncoding encoding);
// The dtype a tensor's manifest entry gives in `encoding` (top-k: FLOAT32, its values').
v1::DType EncodedDType(UpdateEncoding encoding);

// How an update's tensors are checked on arrival: SHA-256 (TensorInfo.sha256), or XXH3-128
// (TensorInfo.xxh3_128) for a coordinator that says it checks it (JoinResponse.upload_xxh3).
enum class UpdateDigest { kSha256, kXxh3 };
// Sets `info`'s digest of `bytes` of that kind.
void SetDigest(UpdateDigest digest, std::string_view bytes, v1::TensorInfo* info);

// Who sends an update, for which task (job, round, attempt) and on which model version: the
// header's identity, as the worker and the load generator fill it.
void IdentifyUpdate(const v1::TrainTask& task, const std::string& worker_id, const std::string& session,
                    v1::UpdateHeader* header);

// Adds set `name` to an update's envelope: its entry in header->sets (`encoding`, with
// top-k's `fraction`; the manifest of the encoded bytes for chunks of `chunk_bytes`, each
// tensor with its `digest`) and each tensor's encoded bytes at the end of *stream, what the
// upload's chunks carry. Add "delta" first.
void AppendUpdateSet(const std::string& name, const TensorSet& tensors, UpdateEncoding encoding, double fraction,
                     uint32_t chunk_bytes, v1::UpdateHeader* header, UpdateBytes* stream,
                     UpdateDigest digest = UpdateDigest::kSha256);

// Calls `emit` once per chunk of `tensors` (each at most `chunk_bytes`, clamped to
// kMaxChunkBytes), in order, tensor_index counting across the stream. Stops at the first
// error `emit` returns and returns it.
Status ForEachChunk(const UpdateBytes& tensors, uint32_t chunk_bytes,
                    const std::function<Status(const v1::TensorChunk&)>& emit);

// The chunks ForEachChunk would emit, each as the bytes of an UpdateChunkMessage laid out as
// Tessera's writers lay them out (the chunk the message's only field, its data last): a small
// slice of the fields, then the chunk's bytes in `tensors` themselves, not copied. Each such
// slice holds `tensors`, which lives until gRPC has let go of the last of them (it may hold
// one until the bytes are on the wire, after the call that sent it has ended).
Status ForEachChunkMessage(const std::shared_ptr<const UpdateBytes>& tensors, uint32_t chunk_bytes,
                           const std::function<Status(const grpc::ByteBuffer&)>& emit);

// The chunks ForEachChunk would emit, appended to `out` with one copy of their bytes (an
// inline update's, TaskSessionMessage.update.chunks, built in place).
void AppendChunks(const UpdateBytes& tensors, uint32_t chunk_bytes,
                  google::protobuf::RepeatedPtrField<v1::TensorChunk>* out);

}  // namespace tessera::wire
