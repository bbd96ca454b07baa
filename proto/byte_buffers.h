// Protobuf messages to and from gRPC's ByteBuffers, for the raw methods and the generic stub
// (server/jobs/model_version.cc, server/rpc/transfers.cc, the load generator).
#pragma once

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/byte_buffer.h>

namespace tessera::wire {

// `message` serialized into `out`; false if it cannot be (larger than protobuf's 2 GiB).
template <typename Message>
bool ToByteBuffer(const Message& message, grpc::ByteBuffer* out) {
  bool own = false;
  return grpc::SerializationTraits<Message>::Serialize(message, out, &own).ok();
}

// `buffer` for a grpc::ProtoBufferReader, which only reads its slices (it takes a pointer to a
// mutable buffer all the same): no copy of the slice list, as grpc::ByteBuffer's copy makes.
inline grpc::ByteBuffer* Unowned(const grpc::ByteBuffer& buffer) { return const_cast<grpc::ByteBuffer*>(&buffer); }

// `in` parsed into `message`; false for bytes that are not one. `in` is left as it was (the
// parse reads a copy that shares its slices).
template <typename Message>
bool FromByteBuffer(const grpc::ByteBuffer& in, Message* message) {
  grpc::ByteBuffer copy(in);
  return grpc::SerializationTraits<Message>::Deserialize(&copy, message).ok();
}

}  // namespace tessera::wire
