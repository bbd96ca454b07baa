// A model version's serialized messages: a whole download reassembles to the tensors, and a
// download resumed at any byte offset sends exactly the bytes after it, once. A version sent
// compressed decodes to the encoding's values, inside a task and by download, keeps the
// float32 model's name, and sends a tensor the encoding cannot hold in float32.
#include "server/jobs/model_version.h"

#include <gtest/gtest.h>

#include <cstring>

#include "base/xxh3.h"
#include "core/update_codec.h"
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

// What `set` decodes to after a trip through `encoding`, tensor by tensor.
TensorSet RoundTripped(const TensorSet& set, UpdateEncoding encoding) {
  TensorSet out = set;
  for (NamedTensor& t : out) {
    EXPECT_TRUE(DecodeValues(encoding, EncodeValues(encoding, t.values, 0), 0, t.values).ok());
  }
  return out;
}

TEST(ModelVersionTest, ACompressedVersionDecodesToTheEncodingsValuesInsideATaskAndByDownload) {
  TensorSet set = ThreeTensors();
  // Two values in "c": int8 does not make a tensor of one value smaller (below).
  set[2].shape = {2};
  set[2].values.push_back(set[2].values[0] + 1.25f);
  for (NamedTensor& t : set) {
    for (float& v : t.values) v += 1.0f / 3;  // none of them held exactly in 16 bits
  }
  const auto float32 = ModelVersion::Encode(std::make_shared<const TensorSet>(set), 3, 16);
  const std::pair<UpdateEncoding, v1::DType> cases[] = {{UpdateEncoding::kFloat16, v1::DTYPE_FLOAT16},
                                                        {UpdateEncoding::kBFloat16, v1::DTYPE_BFLOAT16},
                                                        {UpdateEncoding::kInt8, v1::DTYPE_INT8}};
  for (const auto& [encoding, dtype] : cases) {
    SCOPED_TRACE(UpdateEncodingName(encoding));
    auto version = ModelVersion::Encode(std::make_shared<const TensorSet>(set), 3, 16, encoding);
    // Named, evaluated and exported as the float32 model.
    EXPECT_EQ(version->sha256(), float32->sha256());
    EXPECT_EQ(Bytes(version->tensors()), Bytes(set));
    EXPECT_EQ(version->encoded_tensors(), 3u);
    const v1::ModelChunkMessage manifest = Parse(version->wire_manifest());
    EXPECT_EQ(manifest.model_sha256(), float32->sha256());
    uint64_t total = 0;
    for (int i = 0; i < 3; ++i) {
      const v1::TensorInfo& info = manifest.manifest().tensors(i);
      const NamedTensor& t = set[static_cast<size_t>(i)];
      EXPECT_EQ(info.dtype(), dtype);
      const uint64_t bytes = encoding == UpdateEncoding::kInt8 ? t.values.size() + 4 : 2 * t.values.size();
      EXPECT_EQ(info.byte_size(), bytes);
      total += bytes;
    }
    EXPECT_EQ(version->total_bytes(), total);
    EXPECT_EQ(manifest.manifest().total_bytes(), total);
    const std::string expected = Bytes(RoundTripped(set, encoding));
    EXPECT_NE(expected, Bytes(set));  // the encodings are lossy for these values

    // By download, in 16-byte chunks.
    wire::TensorAssembler assembler("download", 1 << 20);
    assembler.AcceptEncoded(1 << 20);
    ASSERT_TRUE(assembler.Start(manifest.manifest()).ok());
    for (const grpc::ByteBuffer& chunk : version->wire_chunks()) ASSERT_TRUE(assembler.Add(Parse(chunk).chunk()).ok());
    auto downloaded = assembler.Finish();
    ASSERT_TRUE(downloaded.ok()) << downloaded.status().ToString();
    EXPECT_EQ(Bytes(*downloaded), expected);

    // Inside a task.
    ASSERT_NE(version->inline_model(), nullptr);
    v1::InlineModel inside;
    ASSERT_TRUE(inside.ParseFromString(*version->inline_model()));
    auto read = wire::ReadInlineModel(inside, "task", 1 << 20);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_EQ(Bytes(*read), expected);

    // A download resumed at any offset sends the encoded bytes after it.
    std::string all;
    for (const grpc::ByteBuffer& chunk : version->wire_chunks()) all += Parse(chunk).chunk().data();
    ASSERT_EQ(all.size(), total);
    for (uint64_t offset = 0; offset <= total; ++offset) {
      auto plan = version->PlanDownload(offset);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      std::string sent;
      if (plan->first_partial) sent += Parse(*plan->first_partial).chunk().data();
      for (size_t i = plan->first_chunk; i < version->wire_chunks().size(); ++i) {
        sent += Parse(version->wire_chunks()[i]).chunk().data();
      }
      EXPECT_EQ(sent, all.substr(offset)) << offset;
    }

    // A receiver that takes float32 alone refuses it, naming the tensor and the dtype.
    wire::TensorAssembler plain("export", 1 << 20);
    Status refused = plain.Start(manifest.manifest());
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.message().find("tensor 'a': expected dtype FLOAT32, got " + v1::DType_Name(dtype)),
              std::string::npos)
        << refused.message();
  }
}

TEST(ModelVersionTest, ATensorTheEncodingCannotHoldTravelsInFloat32) {
  // float16's largest finite value is 65504: "big" would decode to infinity.
  const TensorSet set = {{"small", {3}, {0.5f, -1.25f, 3.0f}}, {"big", {2}, {1e6f, -2.0f}}};
  auto version = ModelVersion::Encode(std::make_shared<const TensorSet>(set), 1, 1024, UpdateEncoding::kFloat16);
  EXPECT_EQ(version->encoded_tensors(), 1u);
  const v1::ModelChunkMessage manifest = Parse(version->wire_manifest());
  EXPECT_EQ(manifest.manifest().tensors(0).dtype(), v1::DTYPE_FLOAT16);
  EXPECT_EQ(manifest.manifest().tensors(1).dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(manifest.manifest().tensors(1).byte_size(), 8u);
  EXPECT_EQ(manifest.manifest().tensors(1).sha256(), set[1].Sha256());
  EXPECT_EQ(version->total_bytes(), 6u + 8u);
  v1::InlineModel inside;
  ASSERT_TRUE(inside.ParseFromString(*version->inline_model()));
  auto read = wire::ReadInlineModel(inside, "task", 1 << 20);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ((*read)[0].values, set[0].values);  // exact in float16
  EXPECT_EQ((*read)[1].values, set[1].values);
}

// int8 takes a 4-byte scale beside a byte a value: a tensor of one value (or none) would take
// more than in float32, and goes in float32, so that a version as sent is never larger than
// the float32 model a worker bounds its download by (DownloadBound).
TEST(ModelVersionTest, ATensorTheEncodingWouldNotMakeSmallerTravelsInFloat32) {
  const TensorSet set = {{"weight", {1, 1}, {0.75f}}, {"bias", {1}, {-0.5f}}, {"none", {0}, {}}};
  auto version = ModelVersion::Encode(std::make_shared<const TensorSet>(set), 1, 1024, UpdateEncoding::kInt8);
  EXPECT_EQ(version->encoded_tensors(), 0u);
  const v1::ModelChunkMessage manifest = Parse(version->wire_manifest());
  for (const v1::TensorInfo& info : manifest.manifest().tensors()) {
    EXPECT_EQ(info.dtype(), v1::DTYPE_FLOAT32) << info.name();
  }
  EXPECT_EQ(version->total_bytes(), 8u);
  // A worker's bound for this model: its 2 parameters in float32.
  wire::TensorAssembler assembler("download", 8);
  assembler.AcceptEncoded(8);
  Status started = assembler.Start(manifest.manifest());
  ASSERT_TRUE(started.ok()) << started.ToString();
  for (const grpc::ByteBuffer& chunk : version->wire_chunks()) ASSERT_TRUE(assembler.Add(Parse(chunk).chunk()).ok());
  auto downloaded = assembler.Finish();
  ASSERT_TRUE(downloaded.ok()) << downloaded.status().ToString();
  EXPECT_EQ(Bytes(*downloaded), Bytes(set));

  // Beside a tensor int8 does make smaller, only that one is encoded.
  const TensorSet mixed = {{"weight", {8}, {0.5f, -1.0f, 2.0f, 0.25f, 1.0f, -2.0f, 0.0f, 1.5f}}, {"bias", {1}, {0.5f}}};
  auto both = ModelVersion::Encode(std::make_shared<const TensorSet>(mixed), 1, 1024, UpdateEncoding::kInt8);
  EXPECT_EQ(both->encoded_tensors(), 1u);
  EXPECT_EQ(both->total_bytes(), 8u + 4u + 4u);
}

}  // namespace
}  // namespace tessera::server
