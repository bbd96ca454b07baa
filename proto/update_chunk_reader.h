// An upload's chunk messages read from gRPC's buffers straight into the update being
// assembled: one copy from the transport's slices into the tensor's memory, instead of one
// into a parsed message, one into a staging buffer and one more to decode. The coordinator's
// upload stream is a raw method (ByteBuffers in) for this.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <string>

#include "base/status.h"
#include "proto/update_assembler.h"

namespace tessera::wire {

// Adds one UpdateChunkMessage after the header to `assembler`. Messages laid out as every
// Tessera writer lays them out (the chunk the message's only field, its data the chunk's
// last) are read in place; any other valid encoding is parsed as a message and added as
// UpdateAssembler::Add does, with the same checks. A message that is not a chunk, or not a
// message, is INVALID_ARGUMENT naming `what`.
Status AddChunkMessage(const grpc::ByteBuffer& message, UpdateAssembler& assembler, const std::string& what);

}  // namespace tessera::wire
