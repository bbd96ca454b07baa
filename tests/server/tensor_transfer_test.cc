// The wire's tensor transfer: manifest + chunks round trips, resumption, and every way a
// transfer can be wrong.
#include "proto/tensor_transfer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "base/xxh3.h"
#include "core/update_codec.h"

namespace tessera::wire {
namespace {

TensorSet MakeTensors() {
  TensorSet set;
  set.push_back({"conv.weight", {2, 3, 5}, {}});
  set.push_back({"conv.bias", {2}, {}});
  set.push_back({"empty", {0}, {}});
  set.push_back({"fc.weight", {7, 11}, {}});
  float v = 0.5f;
  for (auto& t : set) {
    t.values.resize(static_cast<size_t>(t.NumElements()));
    for (auto& x : t.values) x = (v += 0.37f);
  }
  return set;
}

std::vector<v1::TensorChunk> Chunks(const TensorSet& set, uint32_t chunk_bytes, uint64_t resume = 0) {
  std::vector<v1::TensorChunk> chunks;
  EXPECT_TRUE(ForEachChunk(set, chunk_bytes, resume, [&](const v1::TensorChunk& c) {
                chunks.push_back(c);
                return Status::Ok();
              }).ok());
  return chunks;
}

TEST(TensorTransferTest, RoundTripsInSmallChunks) {
  const TensorSet set = MakeTensors();
  for (uint32_t chunk_bytes : {4u, 12u, 64u, 1u << 20}) {
    const auto manifest = BuildManifest(set, chunk_bytes);
    EXPECT_EQ(manifest.total_bytes(), static_cast<uint64_t>(TotalElements(set)) * 4);
    TensorAssembler assembler("test", 1 << 20);
    ASSERT_TRUE(assembler.Start(manifest).ok());
    for (const auto& c : Chunks(set, chunk_bytes)) {
      EXPECT_LE(c.data().size(), chunk_bytes);
      ASSERT_TRUE(assembler.Add(c).ok());
    }
    auto out = assembler.Finish();
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ASSERT_EQ(out->size(), set.size());
    for (size_t i = 0; i < set.size(); ++i) {
      EXPECT_EQ((*out)[i].name, set[i].name);
      EXPECT_EQ((*out)[i].shape, set[i].shape);
      EXPECT_EQ((*out)[i].values, set[i].values);
    }
    EXPECT_EQ(TensorSetSha256(*out), TensorSetSha256(set));
  }
}

TEST(TensorTransferTest, ChunksNeverExceedOneMebibyte) {
  TensorSet big{{"big", {3 << 18}, std::vector<float>(3 << 18, 1.0f)}};  // 3 MiB
  auto chunks = Chunks(big, 64u << 20);
  EXPECT_EQ(chunks.size(), 3u);
  for (const auto& c : chunks) EXPECT_LE(c.data().size(), kMaxChunkBytes);
}

TEST(TensorTransferTest, ResumeSkipsTheBytesAlreadyHeld) {
  const TensorSet set = MakeTensors();
  const auto all = Chunks(set, 16);
  uint64_t skipped = 0;
  for (size_t i = 0; i < 5; ++i) skipped += all[i].data().size();
  const auto rest = Chunks(set, 16, skipped);
  ASSERT_EQ(rest.size(), all.size() - 5);
  EXPECT_EQ(rest.front().tensor_index(), all[5].tensor_index());
  EXPECT_EQ(rest.front().offset(), all[5].offset());
}

TEST(TensorTransferTest, RefusesOutOfOrderChunks) {
  const TensorSet set = MakeTensors();
  auto chunks = Chunks(set, 16);
  TensorAssembler assembler("update from worker 'w1'", 1 << 20);
  ASSERT_TRUE(assembler.Start(BuildManifest(set, 16)).ok());
  Status s = assembler.Add(chunks[1]);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("update from worker 'w1'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("offset 0"), std::string::npos) << s.message();
}

TEST(TensorTransferTest, DetectsCorruptContent) {
  const TensorSet set = MakeTensors();
  auto chunks = Chunks(set, 16);
  std::string data = chunks[2].data();
  data[0] ^= 0x40;
  chunks[2].set_data(data);
  TensorAssembler assembler("model", 1 << 20);
  ASSERT_TRUE(assembler.Start(BuildManifest(set, 16)).ok());
  for (const auto& c : chunks) ASSERT_TRUE(assembler.Add(c).ok());
  auto out = assembler.Finish();
  EXPECT_EQ(out.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(out.status().message().find("conv.weight"), std::string::npos) << out.status().message();
}

// A manifest with XXH3-128 checksums (a coordinator's model versions carry them beside
// SHA-256): the receiver checks them and not SHA-256, which still names the version.
TEST(TensorTransferTest, AnXxh3ChecksumIsCheckedInSha256sPlace) {
  const TensorSet set = MakeTensors();
  v1::TensorManifest manifest = BuildManifest(set, 16);
  for (size_t i = 0; i < set.size(); ++i) {
    v1::TensorInfo* info = manifest.mutable_tensors(static_cast<int>(i));
    info->set_xxh3_128(Xxh3Hex(set[i].values.data(), set[i].ByteSize()));
    info->set_sha256(std::string(64, '0'));  // wrong, and not what decides
  }
  auto assemble = [&](const std::vector<v1::TensorChunk>& chunks) {
    TensorAssembler assembler("model", 1 << 20);
    EXPECT_TRUE(assembler.Start(manifest).ok());
    for (const auto& c : chunks) EXPECT_TRUE(assembler.Add(c).ok());
    return assembler.Finish();
  };
  auto out = assemble(Chunks(set, 16));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ((*out)[3].values, set[3].values);
  // One bit changed on the way: refused, naming the checksum and the tensor.
  auto chunks = Chunks(set, 16);
  std::string data = chunks.back().data();
  data[1] ^= 0x01;
  chunks.back().set_data(data);
  auto altered = assemble(chunks);
  EXPECT_EQ(altered.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(altered.status().message().find("tensor 'fc.weight': content checksum (xxh3_128)"), std::string::npos)
      << altered.status().message();
}

TEST(TensorTransferTest, DetectsATruncatedTransfer) {
  const TensorSet set = MakeTensors();
  auto chunks = Chunks(set, 16);
  TensorAssembler assembler("model", 1 << 20);
  ASSERT_TRUE(assembler.Start(BuildManifest(set, 16)).ok());
  for (size_t i = 0; i + 1 < chunks.size(); ++i) ASSERT_TRUE(assembler.Add(chunks[i]).ok());
  auto out = assembler.Finish();
  EXPECT_EQ(out.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(out.status().message().find("ended early"), std::string::npos) << out.status().message();
}

TEST(TensorTransferTest, RefusesAManifestLargerThanExpected) {
  const TensorSet set = MakeTensors();
  TensorAssembler assembler("update", 64);
  Status s = assembler.Start(BuildManifest(set));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("expected 64"), std::string::npos) << s.message();
}

TEST(TensorTransferTest, RefusesAShapeThatDisagreesWithTheByteSize) {
  const TensorSet set = MakeTensors();
  auto manifest = BuildManifest(set);
  manifest.mutable_tensors(0)->set_byte_size(12);
  TensorAssembler assembler("update", 1 << 20);
  Status s = assembler.Start(manifest);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("conv.weight"), std::string::npos) << s.message();
}

// Dimensions whose product wraps around 2^64 to a small number must not pass as a tensor of
// that many bytes (here 2^62 x 4 elements, "0 bytes").
TEST(TensorTransferTest, RefusesAShapeWhoseElementCountOverflows) {
  v1::TensorManifest manifest;
  auto* info = manifest.add_tensors();
  info->set_name("huge");
  info->add_shape(int64_t{1} << 62);
  info->add_shape(4);
  info->set_dtype(v1::DTYPE_FLOAT32);
  info->set_byte_size(0);
  info->set_sha256(NamedTensor{}.Sha256());
  manifest.set_total_bytes(0);
  TensorAssembler assembler("update", 1 << 20);
  Status s = assembler.Start(manifest);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("huge"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("more than the expected 1048576 bytes"), std::string::npos) << s.message();
}

TEST(TensorTransferTest, AcceptsAnEmptyTensorWithLargeDimensions) {
  TensorSet set;
  set.push_back({"empty", {int64_t{1} << 40, 0, int64_t{1} << 40}, {}});
  TensorAssembler assembler("update", 1 << 20);
  ASSERT_TRUE(assembler.Start(BuildManifest(set)).ok());
  auto tensors = assembler.Finish();
  ASSERT_TRUE(tensors.ok()) << tensors.status().ToString();
  EXPECT_TRUE((*tensors)[0].values.empty());
}

// A tensor's name is the sender's: a chunk that does not fit it is refused naming it escaped and
// bounded, never with its line breaks or its megabyte.
TEST(TensorTransferTest, AChunkThatDoesNotFitNamesItsTensorEscapedAndBounded) {
  const std::string name = "fc.weight\n[error] forged line" + std::string(1 << 20, 'x');
  TensorSet set{{name, {2}, {1.0f, 2.0f}}};
  TensorAssembler assembler("model", 1 << 20);
  ASSERT_TRUE(assembler.Start(BuildManifest(set)).ok());
  v1::TensorChunk chunk;
  chunk.set_tensor_index(0);
  chunk.set_offset(0);
  chunk.set_data(std::string(12, '\0'));  // three floats for a tensor of two
  Status s = assembler.Add(chunk);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not fit tensor 'fc.weight\\n[error] forged line"), std::string::npos)
      << s.message().substr(0, 200);
  EXPECT_EQ(s.message().find('\n'), std::string::npos);
  EXPECT_LT(s.message().size(), 1024u);
}

// A model inside its task carries all its bytes: a manifest that declares more than its chunks
// hold is refused before the tensors it declares are allocated, whatever the task's bound; so
// is one whose tensors outgrow its chunks while its total_bytes claims less.
TEST(TensorTransferTest, AnInlineModelDeclaringMoreThanItsChunksCarryIsRefusedBeforeAllocating) {
  const TensorSet small = MakeTensors();
  v1::InlineModel model;
  v1::TensorManifest& manifest = *model.mutable_manifest();  // 256 MiB in one tensor, whose bytes do not come
  v1::TensorInfo& huge = *manifest.add_tensors();
  huge.set_name("huge");
  huge.add_shape(int64_t{64} << 20);
  huge.set_dtype(v1::DTYPE_FLOAT32);
  huge.set_byte_size(uint64_t{256} << 20);
  manifest.set_total_bytes(uint64_t{256} << 20);
  for (const auto& chunk : Chunks(small, 64)) *model.add_chunks() = chunk;
  auto read = ReadInlineModel(model, "model version 3 (in its task)", uint64_t{1} << 30);
  EXPECT_EQ(read.status().code(), StatusCode::kDataLoss) << read.status().ToString();
  EXPECT_NE(read.status().message().find("manifest declares 268435456 bytes, its chunks carry"), std::string::npos)
      << read.status().ToString();

  manifest.set_total_bytes(4);  // the tensor's 256 MiB still declared
  read = ReadInlineModel(model, "model version 3 (in its task)", uint64_t{1} << 30);
  EXPECT_EQ(read.status().code(), StatusCode::kInvalidArgument) << read.status().ToString();
  EXPECT_NE(read.status().message().find("more than the expected"), std::string::npos) << read.status().ToString();

  // What the chunks carry in full reads back.
  v1::InlineModel whole;
  *whole.mutable_manifest() = BuildManifest(small, 64);
  for (const auto& chunk : Chunks(small, 64)) *whole.add_chunks() = chunk;
  auto tensors = ReadInlineModel(whole, "model", uint64_t{1} << 30);
  ASSERT_TRUE(tensors.ok()) << tensors.status().ToString();
  EXPECT_EQ(TensorSetSha256(*tensors), TensorSetSha256(small));
}

// A model sent compressed (JobSpec.compression.download): each tensor's dtype, byte size and
// bytes are checked as a float32 one's are, against the encoding, and decoded at the end.
TEST(TensorTransferTest, EncodedTensorsAreCheckedAgainstTheirEncodingAndDecoded) {
  auto manifest_of = [](v1::DType dtype, int64_t elements, uint64_t bytes) {
    v1::TensorManifest manifest;
    v1::TensorInfo& info = *manifest.add_tensors();
    info.set_name("w\n");
    info.add_shape(elements);
    info.set_dtype(dtype);
    info.set_byte_size(bytes);
    manifest.set_total_bytes(bytes);
    return manifest;
  };
  auto refused = [](TensorAssembler& assembler, const v1::TensorManifest& manifest, const std::string& part) {
    Status s = assembler.Start(manifest);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << part;
    EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
  };
  {
    TensorAssembler assembler("model version 2 of job j", 1 << 20);
    assembler.AcceptEncoded(1 << 20);
    refused(assembler, manifest_of(v1::DTYPE_FLOAT16, 5, 20),
            "model version 2 of job j: tensor 'w\\n': shape [5] needs 10 bytes in float16, manifest says 20");
    refused(assembler, manifest_of(v1::DTYPE_INT8, 5, 5), "needs 9 bytes in int8");
    refused(assembler, manifest_of(v1::DTYPE_INT32, 5, 20), "expected dtype FLOAT32, FLOAT16, BFLOAT16 or INT8, got DTYPE_INT32");
    refused(assembler, manifest_of(static_cast<v1::DType>(77), 5, 20), "got 77");
  }
  {
    // int8 sends about a byte a value: 90 values fit 100 bytes as sent but not 100 of float32.
    TensorAssembler assembler("m", 100);
    assembler.AcceptEncoded(100);
    refused(assembler, manifest_of(v1::DTYPE_INT8, 90, 94), "holds more than the expected 100 bytes of float32 values");
    TensorAssembler roomier("m", 100);
    roomier.AcceptEncoded(360);
    EXPECT_TRUE(roomier.Start(manifest_of(v1::DTYPE_INT8, 90, 94)).ok());
  }
  // The bytes decode at the end; a scale the encoder never sends is refused, naming the tensor.
  const std::vector<float> values = {0.5f, -1.0f, 2.0f};
  for (const float scale : {2.0f / 127, -1.0f}) {
    std::string bytes = EncodeValues(UpdateEncoding::kInt8, values, 0);
    std::memcpy(bytes.data(), &scale, 4);
    v1::TensorManifest manifest = manifest_of(v1::DTYPE_INT8, 3, bytes.size());
    manifest.mutable_tensors(0)->set_xxh3_128(Xxh3Hex(bytes.data(), bytes.size()));
    TensorAssembler assembler("m", 1 << 10);
    assembler.AcceptEncoded(1 << 10);
    ASSERT_TRUE(assembler.Start(manifest).ok());
    v1::TensorChunk chunk;
    chunk.set_data(bytes);
    ASSERT_TRUE(assembler.Add(chunk).ok());
    auto got = assembler.Finish();
    if (scale > 0) {
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_NEAR((*got)[0].values[0], 0.5f, 0.01f);
      EXPECT_NEAR((*got)[0].values[2], 2.0f, 1e-6f);
    } else {
      EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(got.status().message().find("m: tensor 'w\\n': int8 encoding: expected a finite scale >= 0"),
                std::string::npos)
          << got.status().ToString();
    }
  }
}

}  // namespace
}  // namespace tessera::wire
