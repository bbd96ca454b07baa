// A gRPC message's bytes as one string, its slices joined: what the wire tests compare and
// cut into other slices.
#pragma once

#include <gtest/gtest.h>
#include <grpcpp/support/byte_buffer.h>

#include <string>
#include <vector>

namespace tessera::wire::testing {

inline std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& slice : slices) out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return out;
}

}  // namespace tessera::wire::testing
