// A chunk record as a receiver meets it off the wire, for the fuzzers of the chunk readers.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::fuzz {

// `chunk` (a serialized TensorChunk) as the bytes of a message whose field 2 it is (an
// UpdateChunkMessage's or a ModelChunkMessage's chunk), in two gRPC slices cut at `cut`.
inline grpc::ByteBuffer AsMessage(std::string_view chunk, size_t cut) {
  std::string message(1, static_cast<char>((2 << 3) | 2));
  for (uint64_t n = chunk.size(); ; n >>= 7) {  // the length, a varint
    message.push_back(static_cast<char>((n & 0x7f) | (n > 0x7f ? 0x80 : 0)));
    if (n <= 0x7f) break;
  }
  message.append(chunk);
  cut = message.empty() ? 0 : cut % message.size();
  std::vector<grpc::Slice> slices;
  slices.emplace_back(message.substr(0, cut));
  slices.emplace_back(message.substr(cut));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace tessera::fuzz
