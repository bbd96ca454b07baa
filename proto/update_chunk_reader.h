// An upload's chunk messages read from gRPC's buffers straight into the update being
// assembled: one copy from the transport's slices into the tensor's memory, instead of one
// into a parsed message, one into a staging buffer and one more to decode. The coordinator's
// upload stream is a raw method (ByteBuffers in) for this; so is the worker's read of a
// model download.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <optional>
#include <string>

#include "base/status.h"
#include "proto/tensor_transfer.h"
#include "proto/update_assembler.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::wire {

// Adds one UpdateChunkMessage after the header to `assembler`. Messages laid out as every
// Tessera writer lays them out (the chunk the message's only field, its data the chunk's
// last) are read in place; any other valid encoding is parsed as a message and added as
// UpdateAssembler::Add does, with the same checks. A message that is not a chunk, or not a
// message, is INVALID_ARGUMENT naming `what`.
Status AddChunkMessage(const grpc::ByteBuffer& message, UpdateAssembler& assembler, const std::string& what);

// A download's chunk message (ModelChunkMessage after the manifest) added to `assembler` as
// AddChunkMessage adds an upload's: in place when laid out as the coordinator lays it out
// (the chunk the only field), else parsed, with TensorAssembler::Add's checks either way.
Status AddModelChunkMessage(const grpc::ByteBuffer& message, TensorAssembler& assembler, const std::string& what);

// An inline update (TaskSessionMessage.update, on the task session) read from gRPC's buffer:
// Start() parses its header; once the update is admitted, AddChunks() places its chunks in the
// update's tensors, in place when they are laid out as Tessera's writers lay them out (the
// header first, then each chunk with its data last), else from the parsed message with the
// same checks. The reader keeps a reference to the message's slices until the next Start().
class InlineUpdateReader {
 public:
  explicit InlineUpdateReader(std::string what) : what_(std::move(what)) {}

  // INVALID_ARGUMENT naming `what` when `message` is not a TaskSessionMessage with an update.
  // The reader takes `message`'s slices (it is left empty) and holds them until it ends.
  Status Start(grpc::ByteBuffer&& message, v1::UpdateHeader* header);
  Status AddChunks(UpdateAssembler& assembler);

 private:
  const std::string what_;
  grpc::ByteBuffer message_;
  uint64_t chunks_at_ = 0;                        // where the chunks begin, read in place
  std::optional<v1::TaskSessionMessage> parsed_;  // the message parsed whole, when not
};

}  // namespace tessera::wire
