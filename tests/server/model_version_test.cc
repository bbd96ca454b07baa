// A model version's serialized messages: a whole download reassembles to the tensors, and a
// download resumed at any byte offset sends exactly the bytes after it, once.
#include "server/jobs/model_version.h"

#include <gtest/gtest.h>

#include <cstring>

#include "base/xxh3.h"
#include "proto/tensor_transfer.h"
#include "tessera/v1/worker_service.grpc.pb.h"

namespace tessera::server {
namespace {

TensorSet ThreeTensors() {
  TensorSet set = {{"a", {5}, {}}, {"b", {2, 3}, {}}, {"c", {1}, {}}};
  float next = 0.5f;
  for (NamedTensor& t : set) {
    t.values.resize(static_cast<size_t>(t.NumElements()));
    for (float& v : t.values) v = (next += 1.25f);
  }
  return set;
}

v1::ModelChunkMessage Parse(const grpc::ByteBuffer& buffer) {
  grpc::ByteBuffer copy(buffer);
  v1::ModelChunkMessage message;
  EXPECT_TRUE(grpc::SerializationTraits<v1::ModelChunkMessage>::Deserialize(&copy, &message).ok());
  return message;
}

std::string Bytes(const TensorSet& set) {
  std::string all;
  for (const NamedTensor& t : set) all.append(reinterpret_cast<const char*>(t.values.data()), t.ByteSize());
  return all;
}

TEST(ModelVersionTest, AWholeDownloadReassemblesToTheTensors) {
  const TensorSet set = ThreeTensors();
  auto version = ModelVersion::Encode(std::make_shared<const TensorSet>(set), 7, 16);
  const v1::ModelChunkMessage manifest = Parse(version->wire_manifest());
  EXPECT_EQ(manifest.model_version(), 7u);
  EXPECT_EQ(manifest.model_sha256(), version->sha256());
  // Each tensor carries its SHA-256 (the version's name is made of them) and the XXH3-128
  // checksum a worker checks its download against.
  ASSERT_EQ(manifest.manifest().tensors_size(), 3);
  for (int i = 0; i < 3; ++i) {
    const NamedTensor& t = set[static_cast<size_t>(i)];
    EXPECT_EQ(manifest.manifest().tensors(i).sha256(), t.Sha256());
    EXPECT_EQ(manifest.manifest().tensors(i).xxh3_128(), Xxh3Hex(t.values.data(), t.ByteSize()));
  }
  wire::TensorAssembler assembler("download", 1 << 20);
  ASSERT_TRUE(assembler.Start(manifest.manifest()).ok());
  EXPECT_GT(version->wire_chunks().size(), 3u);  // 16-byte chunks: several per tensor
  for (const grpc::ByteBuffer& chunk : version->wire_chunks()) {
    ASSERT_TRUE(assembler.Add(Parse(chunk).chunk()).ok());
  }
  auto rebuilt = assembler.Finish();
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status().ToString();
  EXPECT_EQ(Bytes(*rebuilt), Bytes(set));
}

TEST(ModelVersionTest, AResumedDownloadSendsExactlyTheBytesAfterItsOffset) {
  const TensorSet set = ThreeTensors();
  const std::string all = Bytes(set);
  auto version = ModelVersion::Encode(std::make_shared<const TensorSet>(set), 1, 16);
  for (uint64_t offset = 0; offset <= all.size(); ++offset) {
    SCOPED_TRACE(offset);
    auto plan = version->PlanDownload(offset);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    std::string sent;
    uint64_t position = offset;  // where the next chunk must start, in the concatenated tensors
    auto take = [&](const v1::TensorChunk& chunk) {
      uint64_t start = chunk.offset();
      for (uint32_t i = 0; i < chunk.tensor_index(); ++i) start += set[i].ByteSize();
      EXPECT_EQ(start, position);
      position += chunk.data().size();
      sent += chunk.data();
    };
    if (plan->first_partial) take(Parse(*plan->first_partial).chunk());
    for (size_t i = plan->first_chunk; i < version->wire_chunks().size(); ++i) {
      take(Parse(version->wire_chunks()[i]).chunk());
    }
    EXPECT_EQ(sent, all.substr(offset));
  }
  EXPECT_EQ(version->PlanDownload(all.size() + 1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::server
