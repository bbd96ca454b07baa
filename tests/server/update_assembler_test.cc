// Reading an encoded update back (proto/update_assembler.h) as the coordinator does: each
// encoding decodes to float32, and a manifest or chunks that do not fit its encoding are
// refused naming the set and the tensor.
#include <grpcpp/impl/codegen/proto_utils.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "base/sha256.h"
#include "core/value_scan.h"
#include "proto/byte_buffers.h"
#include "proto/update_assembler.h"
#include "proto/update_chunk_reader.h"
#include "proto/update_envelope.h"
#include "tests/server/message_bytes.h"

namespace tessera::wire {
namespace {

TensorSet Model() {
  TensorSet model = {{"layer.w", {4, 25}, std::vector<float>(100)}, {"layer.b", {4}, std::vector<float>(4)}};
  for (size_t i = 0; i < 100; ++i) model[0].values[i] = 0.001f * static_cast<float>(i);
  model[1].values = {0.5f, -0.25f, 0.125f, 0};
  return model;
}

struct Upload {
  v1::UpdateHeader header;
  UpdateBytes bytes;
};

Upload Encode(UpdateEncoding encoding, double fraction, uint32_t chunk_bytes = 16) {
  Upload upload;
  AppendUpdateSet(kDeltaSet, Model(), encoding, fraction, chunk_bytes, &upload.header, &upload.bytes);
  return upload;
}

// Assembles `upload` as the coordinator would; the decoded delta, or the first error.
Result<TensorSet> Read(const Upload& upload, double fraction, uint64_t max_bytes = 1 << 20) {
  ASSIGN_OR_RETURN(auto sets, UpdateSets(upload.header, "update from worker 'w1'"));
  UpdateAssembler assembler("update from worker 'w1'", max_bytes, fraction);
  RETURN_IF_ERROR(assembler.Start(sets));
  RETURN_IF_ERROR(ForEachChunk(upload.bytes, 16, [&](const v1::TensorChunk& c) { return assembler.Add(c); }));
  ASSIGN_OR_RETURN(auto decoded, assembler.Finish());
  return decoded[kDeltaSet];
}

void ExpectRefused(const Result<TensorSet>& got, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(got.ok()) << "accepted";
  for (const std::string& part : parts) {
    EXPECT_NE(got.status().message().find(part), std::string::npos) << "lacks '" << part << "': " << got.status().message();
  }
}

TEST(UpdateAssemblerTest, EachEncodingComesBackAsFloat32WithItsSize) {
  const TensorSet model = Model();
  const struct {
    UpdateEncoding encoding;
    double fraction;
    uint64_t bytes;
    double tolerance;
  } cases[] = {{UpdateEncoding::kFloat32, 0, 416, 0},
               {UpdateEncoding::kFloat16, 0, 208, 5e-4},
               {UpdateEncoding::kBFloat16, 0, 208, 4e-3},
               {UpdateEncoding::kInt8, 0, 112, 0.5 / 127 * 0.5 + 1e-6},
               {UpdateEncoding::kTopK, 0.1, 8 * (10 + 1), 0.25}};  // what it did not send
  for (const auto& c : cases) {
    SCOPED_TRACE(UpdateEncodingName(c.encoding));
    const Upload upload = Encode(c.encoding, c.fraction);
    EXPECT_EQ(upload.header.sets(0).encoding(), ToWireEncoding(c.encoding));
    EXPECT_EQ(upload.header.sets(0).manifest().total_bytes(), c.bytes);
    Result<TensorSet> delta = Read(upload, c.fraction);
    ASSERT_TRUE(delta.ok()) << delta.status().ToString();
    ASSERT_EQ(delta->size(), 2u);
    for (size_t i = 0; i < model.size(); ++i) {
      EXPECT_EQ((*delta)[i].name, model[i].name);
      EXPECT_EQ((*delta)[i].shape, model[i].shape);
      for (size_t j = 0; j < model[i].values.size(); ++j) {
        ASSERT_LE(std::fabs((*delta)[i].values[j] - model[i].values[j]), c.tolerance) << model[i].name << " " << j;
      }
    }
  }
  // Top-k: 10 of layer.w's 100 entries, its largest (the end of the ramp, 0.099 down to
  // 0.090), and 1 of layer.b's 4 (0.5).
  Result<TensorSet> sparse = Read(Encode(UpdateEncoding::kTopK, 0.1), 0.1);
  ASSERT_TRUE(sparse.ok());
  for (size_t j = 0; j < 100; ++j) {
    EXPECT_EQ((*sparse)[0].values[j], j >= 90 ? model[0].values[j] : 0.0f) << j;
  }
  EXPECT_EQ((*sparse)[1].values, (std::vector<float>{0.5f, 0, 0, 0}));
}

TEST(UpdateAssemblerTest, AManifestThatDoesNotFitItsEncodingIsRefusedNamingTheTensor) {
  Upload wrong_dtype = Encode(UpdateEncoding::kFloat16, 0);
  wrong_dtype.header.mutable_sets(0)->mutable_manifest()->mutable_tensors(1)->set_dtype(v1::DTYPE_FLOAT32);
  ExpectRefused(Read(wrong_dtype, 0), {"update from worker 'w1'", "set 'delta', tensor 'layer.b'",
                                       "expected dtype DTYPE_FLOAT16 for float16, got DTYPE_FLOAT32"});
  Upload wrong_size = Encode(UpdateEncoding::kInt8, 0);
  wrong_size.header.mutable_sets(0)->mutable_manifest()->mutable_tensors(0)->set_byte_size(100);
  ExpectRefused(Read(wrong_size, 0), {"tensor 'layer.w'", "shape [4, 25] in int8 needs 104 bytes, manifest says 100"});
  // Top-k's pair count is the job's fraction's, not the worker's.
  ExpectRefused(Read(Encode(UpdateEncoding::kTopK, 0.2), 0.1),
                {"tensor 'layer.w'", "in topk needs 80 bytes, manifest says 160"});
  ExpectRefused(Read(Encode(UpdateEncoding::kTopK, 0.1), 0), {"set 'delta' is top-k encoded, but the job sends no top-k"});
  Upload total = Encode(UpdateEncoding::kBFloat16, 0);
  total.header.mutable_sets(0)->mutable_manifest()->set_total_bytes(1);
  ExpectRefused(Read(total, 0), {"set 'delta': manifest total_bytes 1 does not match its tensors' 208"});
  // Dimensions whose product wraps around 64 bits.
  Upload huge = Encode(UpdateEncoding::kFloat16, 0);
  auto* info = huge.header.mutable_sets(0)->mutable_manifest()->mutable_tensors(0);
  info->clear_shape();
  for (int i = 0; i < 4; ++i) info->add_shape(int64_t{1} << 16);
  ExpectRefused(Read(huge, 0), {"tensor 'layer.w'", "holds more than the expected 1048576 bytes of float32"});
  // More than the coordinator's bound in all.
  ExpectRefused(Read(Encode(UpdateEncoding::kInt8, 0), 0, 400), {"exceed the expected 400 bytes of float32"});
}

TEST(UpdateAssemblerTest, BytesThatDoNotDecodeAreRefusedNamingTheTensor) {
  // Bytes changed after hashing: the manifest's hash covers the bytes as sent.
  Upload tampered = Encode(UpdateEncoding::kFloat16, 0);
  tampered.bytes[1][0] ^= 1;
  ExpectRefused(Read(tampered, 0), {"set 'delta', tensor 'layer.b'", "content hash"});
  // Consistent hashes over hostile contents: the decoder's checks, with the tensor named.
  auto rehash = [](Upload* upload, int tensor) {
    const std::string& bytes = upload->bytes[static_cast<size_t>(tensor)];
    upload->header.mutable_sets(0)->mutable_manifest()->mutable_tensors(tensor)->set_sha256(
        Sha256Hex(bytes.data(), bytes.size()));
  };
  Upload out_of_range = Encode(UpdateEncoding::kTopK, 0.1);
  out_of_range.bytes[1][0] = 7;  // layer.b's one pair: index 7 of 4
  rehash(&out_of_range, 1);
  ExpectRefused(Read(out_of_range, 0.1),
                {"set 'delta', tensor 'layer.b': topk encoding: pair 0 has index 7, expected below 4"});
  Upload repeated = Encode(UpdateEncoding::kTopK, 0.1);
  std::memcpy(repeated.bytes[0].data() + 8, repeated.bytes[0].data(), 4);  // pair 1 takes pair 0's index
  rehash(&repeated, 0);
  ExpectRefused(Read(repeated, 0.1), {"tensor 'layer.w'", "expected strictly increasing indices"});
  Upload nan_scale = Encode(UpdateEncoding::kInt8, 0);
  nan_scale.bytes[0].replace(0, 4, std::string("\x00\x00\xc0\x7f", 4));
  rehash(&nan_scale, 0);
  ExpectRefused(Read(nan_scale, 0), {"tensor 'layer.w': int8 encoding: expected a finite scale >= 0, got NaN"});
  // A chunk past a tensor's declared bytes.
  Upload whole = Encode(UpdateEncoding::kFloat16, 0);
  auto sets = UpdateSets(whole.header, "update");
  ASSERT_TRUE(sets.ok());
  UpdateAssembler assembler("update", 1 << 20, 0);
  ASSERT_TRUE(assembler.Start(*sets).ok());
  v1::TensorChunk chunk;
  chunk.set_tensor_index(0);
  chunk.set_offset(0);
  chunk.set_data(std::string(201, '\0'));
  Status s = assembler.Add(chunk);
  EXPECT_NE(s.message().find("does not fit set 'delta', tensor 'layer.w' of 200 bytes"), std::string::npos)
      << s.message();
}


TEST(UpdateAssemblerTest, TensorsWithXxh3DigestsAreCheckedAgainstThemNotSha256) {
  Upload upload;
  AppendUpdateSet(kDeltaSet, Model(), UpdateEncoding::kFloat32, 0, 16, &upload.header, &upload.bytes,
                  UpdateDigest::kXxh3);
  const v1::TensorInfo& w = upload.header.sets(0).manifest().tensors(0);
  EXPECT_TRUE(w.sha256().empty());
  EXPECT_EQ(w.xxh3_128().size(), 32u);
  const Result<TensorSet> read = Read(upload, 0);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ((*read)[0].values, Model()[0].values);
  // One byte changed on the way: refused, naming the checksum.
  Upload altered = upload;
  altered.bytes[0][5] ^= 1;
  ExpectRefused(Read(altered, 0), {"tensor 'layer.w'", "content checksum (xxh3_128)", "does not match"});
  // A wrong checksum in the manifest, with the right SHA-256 beside it: xxh3_128 decides.
  Upload lying = upload;
  SetDigest(UpdateDigest::kSha256, lying.bytes[0], lying.header.mutable_sets(0)->mutable_manifest()->mutable_tensors(0));
  lying.header.mutable_sets(0)->mutable_manifest()->mutable_tensors(0)->set_xxh3_128(std::string(32, '0'));
  ExpectRefused(Read(lying, 0), {"content checksum (xxh3_128)"});
}

// One hash state serves tensor after tensor: each tensor's digest covers its bytes alone,
// whichever digest the tensor before it used.
TEST(UpdateAssemblerTest, TensorsMixingXxh3AndSha256DigestsAreEachCheckedAgainstTheirOwn) {
  TensorSet model = Model();
  model.push_back({"head.w", {3, 5}, std::vector<float>(15)});
  for (size_t i = 0; i < 15; ++i) model[2].values[i] = -0.01f * static_cast<float>(i);
  Upload upload;
  AppendUpdateSet(kDeltaSet, model, UpdateEncoding::kFloat32, 0, 16, &upload.header, &upload.bytes,
                  UpdateDigest::kXxh3);
  // The middle tensor gives SHA-256 only; the first and last xxh3_128.
  SetDigest(UpdateDigest::kSha256, upload.bytes[1], upload.header.mutable_sets(0)->mutable_manifest()->mutable_tensors(1));
  upload.header.mutable_sets(0)->mutable_manifest()->mutable_tensors(1)->clear_xxh3_128();
  const Result<TensorSet> read = Read(upload, 0);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  for (size_t i = 0; i < model.size(); ++i) EXPECT_EQ((*read)[i].values, model[i].values) << model[i].name;
  Upload altered = upload;
  altered.bytes[2][7] ^= 1;
  ExpectRefused(Read(altered, 0), {"tensor 'head.w'", "content checksum (xxh3_128)", "does not match"});
  altered = upload;
  altered.bytes[1][0] ^= 1;
  ExpectRefused(Read(altered, 0), {"tensor 'layer.b'", "content hash"});
}

// A message's serialized bytes as gRPC would hand them over, cut into `pieces` slices.
grpc::ByteBuffer AsReceived(const std::string& bytes, size_t pieces) {
  std::vector<grpc::Slice> slices;
  const size_t step = std::max<size_t>(1, bytes.size() / pieces);
  for (size_t at = 0; at < bytes.size(); at += step) slices.emplace_back(bytes.substr(at, step));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

using testing::Flatten;

// The chunks of `upload` as their messages' bytes: as every writer lays them out, or with the
// data first (valid protobuf a reader must take all the same).
std::vector<std::string> ChunkMessages(const Upload& upload, bool data_first) {
  std::vector<std::string> messages;
  ForEachChunk(upload.bytes, 16, [&](const v1::TensorChunk& c) {
    if (!data_first) {
      v1::UpdateChunkMessage message;
      *message.mutable_chunk() = c;
      messages.push_back(message.SerializeAsString());
      return Status::Ok();
    }
    v1::TensorChunk data_only;
    data_only.set_data(c.data());
    v1::TensorChunk position;
    position.set_tensor_index(c.tensor_index());
    position.set_offset(c.offset());
    const std::string inner = data_only.SerializeAsString() + position.SerializeAsString();  // fields merge
    std::string outer;
    outer.push_back(static_cast<char>((2 << 3) | 2));  // UpdateChunkMessage.chunk
    google::protobuf::io::StringOutputStream stream(&outer);
    {
      google::protobuf::io::CodedOutputStream out(&stream);
      out.WriteVarint32(static_cast<uint32_t>(inner.size()));
      out.WriteRaw(inner.data(), static_cast<int>(inner.size()));
    }
    messages.push_back(outer);
    return Status::Ok();
  }).ok();
  return messages;
}

Result<TensorSet> ReadMessages(const Upload& upload, const std::vector<std::string>& messages, size_t pieces,
                               FloatBufferPool* pool = nullptr) {
  ASSIGN_OR_RETURN(auto sets, UpdateSets(upload.header, "update from worker 'w1'"));
  UpdateAssembler assembler("update from worker 'w1'", 1 << 20, 0, pool);
  RETURN_IF_ERROR(assembler.Start(sets));
  for (const std::string& message : messages) {
    RETURN_IF_ERROR(AddChunkMessage(AsReceived(message, pieces), assembler, "update from worker 'w1'"));
  }
  ASSIGN_OR_RETURN(auto decoded, assembler.Finish());
  return std::move(decoded[kDeltaSet]);
}

TEST(UpdateChunkReaderTest, ChunksReadFromTheTransportsSlicesMatchTheParsedOnesInEitherFieldOrder) {
  const Upload upload = Encode(UpdateEncoding::kFloat32, 0);
  const Result<TensorSet> parsed = Read(upload, 0);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  for (bool data_first : {false, true}) {
    for (size_t pieces : {1, 3, 40}) {
      SCOPED_TRACE(std::string(data_first ? "data first" : "as written") + ", " + std::to_string(pieces) + " slices");
      const Result<TensorSet> read = ReadMessages(upload, ChunkMessages(upload, data_first), pieces);
      ASSERT_TRUE(read.ok()) << read.status().ToString();
      ASSERT_EQ(read->size(), parsed->size());
      for (size_t i = 0; i < parsed->size(); ++i) EXPECT_EQ((*read)[i].values, (*parsed)[i].values);
    }
  }
  // An encoding other than float32 goes through its staging buffer the same way.
  const Upload half = Encode(UpdateEncoding::kFloat16, 0);
  const Result<TensorSet> half_read = ReadMessages(half, ChunkMessages(half, false), 3);
  ASSERT_TRUE(half_read.ok()) << half_read.status().ToString();
  EXPECT_EQ((*half_read)[1].values, (std::vector<float>{0.5f, -0.25f, 0.125f, 0}));
}

// The worker's chunk messages, built over the update's own bytes: each parses to the chunk
// ForEachChunk emits (explicit zeros for index and offset are the same fields), and the
// coordinator reads them in place into the same update.
TEST(UpdateChunkReaderTest, ChunkMessagesOverTheUpdatesBytesAreItsChunks) {
  const Upload upload = Encode(UpdateEncoding::kFloat32, 0);
  std::vector<v1::TensorChunk> chunks;
  ASSERT_TRUE(ForEachChunk(upload.bytes, 16, [&](const v1::TensorChunk& c) {
                chunks.push_back(c);
                return Status::Ok();
              }).ok());
  std::vector<std::string> messages;
  auto shared = std::make_shared<const UpdateBytes>(upload.bytes);
  ASSERT_TRUE(ForEachChunkMessage(shared, 16, [&](const grpc::ByteBuffer& m) {
                v1::UpdateChunkMessage parsed;
                EXPECT_TRUE(FromByteBuffer(m, &parsed));
                const size_t i = messages.size();
                EXPECT_LT(i, chunks.size());
                if (i < chunks.size()) {
                  EXPECT_EQ(parsed.chunk().tensor_index(), chunks[i].tensor_index());
                  EXPECT_EQ(parsed.chunk().offset(), chunks[i].offset());
                  EXPECT_EQ(parsed.chunk().data(), chunks[i].data());
                }
                messages.push_back(Flatten(m));
                return Status::Ok();
              }).ok());
  ASSERT_EQ(messages.size(), chunks.size());
  EXPECT_EQ(shared.use_count(), 1);  // every message's slices have let go of the bytes
  for (size_t pieces : {1, 3}) {
    const Result<TensorSet> read = ReadMessages(upload, messages, pieces);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_EQ((*read)[0].values, Model()[0].values);
    EXPECT_EQ((*read)[1].values, Model()[1].values);
  }
}

// Chunks of 100,000 bytes read in place from slices of any size: the tensor comes back
// whole under either digest, and one byte changed deep inside the first chunk is caught.
TEST(UpdateChunkReaderTest, LargeChunksReadInPlaceAreWholeAndEveryByteIsChecked) {
  TensorSet big = {{"big.w", {30000}, std::vector<float>(30000)}};
  for (size_t i = 0; i < big[0].values.size(); ++i) big[0].values[i] = 0.5f * static_cast<float>(i % 1000) - 7.0f;
  for (UpdateDigest digest : {UpdateDigest::kXxh3, UpdateDigest::kSha256}) {
    SCOPED_TRACE(digest == UpdateDigest::kXxh3 ? "xxh3_128" : "sha256");
    Upload upload;
    AppendUpdateSet(kDeltaSet, big, UpdateEncoding::kFloat32, 0, 100000, &upload.header, &upload.bytes, digest);
    const auto messages_of = [](const Upload& u) {
      std::vector<std::string> messages;
      EXPECT_TRUE(ForEachChunkMessage(std::make_shared<const UpdateBytes>(u.bytes), 100000, [&](const grpc::ByteBuffer& m) {
                    messages.push_back(Flatten(m));
                    return Status::Ok();
                  }).ok());
      return messages;
    };
    const std::vector<std::string> messages = messages_of(upload);
    ASSERT_EQ(messages.size(), 2u);  // 100,000 bytes, then 20,000
    for (size_t pieces : {1, 7}) {
      const Result<TensorSet> read = ReadMessages(upload, messages, pieces);
      ASSERT_TRUE(read.ok()) << read.status().ToString();
      EXPECT_EQ((*read)[0].values, big[0].values);
    }
    Upload altered = upload;
    altered.bytes[0][70001] ^= 1;
    ExpectRefused(ReadMessages(upload, messages_of(altered), 3), {"tensor 'big.w'", "does not match"});
  }
}

// An update of a megabyte or more, read from slices that split its values: copied into
// place past the caches, hashed and scanned from the slices, and still whole, scanned as one
// pass over it, and checked to the byte.
TEST(UpdateChunkReaderTest, ALargeUpdateReadFromSlicesIsWholeScannedAsOnePassAndChecked) {
  TensorSet big = {{"big.w", {300000}, std::vector<float>(300000)}, {"big.b", {7}, std::vector<float>(7, 0.5f)}};
  for (size_t i = 0; i < big[0].values.size(); ++i) big[0].values[i] = 0.001f * static_cast<float>(i % 997) - 0.3f;
  big[0].values[123457] = -42.0f;
  Upload upload;
  AppendUpdateSet(kDeltaSet, big, UpdateEncoding::kFloat32, 0, 512 * 1024, &upload.header, &upload.bytes,
                  UpdateDigest::kXxh3);
  const auto messages_of = [](const Upload& u) {
    std::vector<std::string> messages;
    EXPECT_TRUE(ForEachChunkMessage(std::make_shared<const UpdateBytes>(u.bytes), 512 * 1024, [&](const grpc::ByteBuffer& m) {
                  messages.push_back(Flatten(m));
                  return Status::Ok();
                }).ok());
    return messages;
  };
  const auto read = [](const Upload& u, const std::vector<std::string>& messages, size_t pieces,
                       TensorScans* scans) -> Result<TensorSet> {
    ASSIGN_OR_RETURN(auto sets, UpdateSets(u.header, "update from worker 'w1'"));
    UpdateAssembler assembler("update from worker 'w1'", 4 << 20, 0);
    assembler.ScanSet(std::string(kDeltaSet));
    RETURN_IF_ERROR(assembler.Start(sets));
    EXPECT_GE(assembler.decoded_bytes(), UpdateAssembler::kStreamingMinBytes);
    for (const std::string& m : messages) RETURN_IF_ERROR(AddChunkMessage(AsReceived(m, pieces), assembler, "update"));
    ASSIGN_OR_RETURN(auto decoded, assembler.Finish());
    *scans = assembler.TakeScans();
    return std::move(decoded[std::string(kDeltaSet)]);
  };
  const std::vector<std::string> messages = messages_of(upload);
  ASSERT_EQ(messages.size(), 4u);  // big.w in 512 KiB, 512 KiB and the rest; big.b
  for (size_t pieces : {1, 13, 4099}) {
    SCOPED_TRACE(std::to_string(pieces) + " slices a message");
    TensorScans scans;
    const Result<TensorSet> got = read(upload, messages, pieces, &scans);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->size(), 2u);
    EXPECT_EQ((*got)[0].values, big[0].values);
    EXPECT_EQ((*got)[1].values, big[1].values);
    ASSERT_EQ(scans.size(), 2u);
    for (size_t t = 0; t < 2; ++t) {
      ASSERT_TRUE(scans[t].has_value());
      const ValueScan::Result whole = ValueScan::Of(big[t].values.data(), big[t].values.size());
      for (size_t k = 0; k < ValueScan::kLanes; ++k) EXPECT_EQ(scans[t]->lanes[k], whole.lanes[k]) << t << " lane " << k;
      EXPECT_EQ(scans[t]->max_abs, whole.max_abs);
    }
    EXPECT_EQ(scans[0]->max_abs, 42.0f);
  }
  Upload altered = upload;
  altered.bytes[0][600001] ^= 0x10;  // inside the second chunk
  TensorScans scans;
  ExpectRefused(read(altered, messages_of(altered), 13, &scans), {"tensor 'big.w'", "does not match"});
}

TEST(UpdateAssemblerTest, PiecesThatDoNotAddUpToTheirChunkAreRefused) {
  const Upload upload = Encode(UpdateEncoding::kFloat32, 0, 64);
  auto sets = UpdateSets(upload.header, "update from worker 'w1'");
  ASSERT_TRUE(sets.ok());
  const std::vector<uint8_t> bytes(64, 0);
  {
    UpdateAssembler assembler("update from worker 'w1'", 1 << 20, 0);
    ASSERT_TRUE(assembler.Start(*sets).ok());
    EXPECT_FALSE(assembler.TakePiece(bytes.data(), 4).ok()) << "no chunk begun";
    ASSERT_TRUE(assembler.BeginChunk(0, 0, 16).ok());
    const Status over = assembler.TakePiece(bytes.data(), 20);
    EXPECT_NE(over.message().find("more bytes than the chunk's 16"), std::string::npos) << over.ToString();
  }
  {
    UpdateAssembler assembler("update from worker 'w1'", 1 << 20, 0);
    ASSERT_TRUE(assembler.Start(*sets).ok());
    ASSERT_TRUE(assembler.BeginChunk(0, 0, 16).ok());
    ASSERT_TRUE(assembler.TakePiece(bytes.data(), 12).ok());
    const Status short_chunk = assembler.EndChunk();
    EXPECT_NE(short_chunk.message().find("a chunk ended after 12 of its 16 bytes"), std::string::npos)
        << short_chunk.ToString();
  }
}

// The scanned set's float32 tensors are scanned as their chunks land: chunks of 30 bytes
// split values, and the scans still equal one pass over each decoded tensor; a set in another
// encoding, or not named, is not scanned.
TEST(UpdateAssemblerTest, TheScannedSetIsScannedChunkByChunkAsOnePass) {
  TensorSet model = Model();
  model[0].values[37] = -123.5f;
  Upload upload;
  AppendUpdateSet(kDeltaSet, model, UpdateEncoding::kFloat32, 0, 30, &upload.header, &upload.bytes);
  AppendUpdateSet("control", model, UpdateEncoding::kFloat32, 0, 30, &upload.header, &upload.bytes);
  auto sets = UpdateSets(upload.header, "update from worker 'w1'");
  ASSERT_TRUE(sets.ok()) << sets.status().ToString();
  UpdateAssembler assembler("update from worker 'w1'", 1 << 20, 0);
  assembler.ScanSet(std::string(kDeltaSet));
  ASSERT_TRUE(assembler.Start(*sets).ok());
  ASSERT_TRUE(ForEachChunk(upload.bytes, 30, [&](const v1::TensorChunk& c) { return assembler.Add(c); }).ok());
  auto decoded = assembler.Finish();
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  const TensorScans scans = assembler.TakeScans();
  ASSERT_EQ(scans.size(), model.size());  // the delta's tensors only
  for (size_t i = 0; i < model.size(); ++i) {
    ASSERT_TRUE(scans[i].has_value()) << i;
    const std::vector<float>& values = (*decoded)[std::string(kDeltaSet)][i].values;
    const ValueScan::Result whole = ValueScan::Of(values.data(), values.size());
    for (size_t k = 0; k < ValueScan::kLanes; ++k) EXPECT_EQ(scans[i]->lanes[k], whole.lanes[k]) << i << " lane " << k;
    EXPECT_EQ(scans[i]->finite, whole.finite);
    EXPECT_EQ(scans[i]->max_abs, whole.max_abs);
    EXPECT_EQ(scans[i]->values, model[i].values.size());
  }
  EXPECT_EQ(scans[0]->max_abs, 123.5f);

  // The delta in float16: nothing to scan as it lands (it is decoded at the end).
  Upload half;
  AppendUpdateSet(kDeltaSet, model, UpdateEncoding::kFloat16, 0, 30, &half.header, &half.bytes);
  auto half_sets = UpdateSets(half.header, "update from worker 'w1'");
  ASSERT_TRUE(half_sets.ok());
  UpdateAssembler half_assembler("update from worker 'w1'", 1 << 20, 0);
  half_assembler.ScanSet(std::string(kDeltaSet));
  ASSERT_TRUE(half_assembler.Start(*half_sets).ok());
  ASSERT_TRUE(ForEachChunk(half.bytes, 30, [&](const v1::TensorChunk& c) { return half_assembler.Add(c); }).ok());
  ASSERT_TRUE(half_assembler.Finish().ok());
  const auto half_scans = half_assembler.TakeScans();
  ASSERT_EQ(half_scans.size(), model.size());
  for (const auto& scan : half_scans) EXPECT_FALSE(scan.has_value());
}

TEST(UpdateChunkReaderTest, WhatIsNotAChunkOrBreaksTheOrderIsRefusedAsByTheParser) {
  const Upload upload = Encode(UpdateEncoding::kFloat32, 0);
  std::vector<std::string> messages = ChunkMessages(upload, false);
  ASSERT_GE(messages.size(), 3u);

  v1::UpdateChunkMessage header;
  *header.mutable_header() = upload.header;
  ExpectRefused(ReadMessages(upload, {header.SerializeAsString()}, 1), {"expected tensor chunks after the header"});
  ExpectRefused(ReadMessages(upload, {std::string("\xff\xff\xff")}, 1), {"not an UpdateChunkMessage"});
  std::swap(messages[1], messages[2]);
  ExpectRefused(ReadMessages(upload, messages, 2), {"expected a chunk of tensor 0 at offset 16", "at offset 32"});
  // A message cut inside its data.
  std::vector<std::string> cut = ChunkMessages(upload, false);
  cut[0].resize(cut[0].size() - 3);
  ExpectRefused(ReadMessages(upload, cut, 1), {"update from worker 'w1'"});
  // A chunk whose bytes were altered fails the tensor's hash, read in place or not.
  for (bool data_first : {false, true}) {
    std::vector<std::string> altered = ChunkMessages(upload, data_first);
    altered[0][data_first ? 4 : altered[0].size() - 1] ^= 1;
    ExpectRefused(ReadMessages(upload, altered, 1), {"tensor 'layer.w'", "content hash"});
  }
}

TEST(UpdateChunkReaderTest, ABufferPoolLendsTheTensorsAndTakesThemBack) {
  const Upload upload = Encode(UpdateEncoding::kFloat32, 0);
  FloatBufferPool pool(1 << 20);
  Result<TensorSet> first = ReadMessages(upload, ChunkMessages(upload, false), 1, &pool);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const float* storage = (*first)[0].values.data();
  pool.Give(std::move(*first));
  Result<TensorSet> second = ReadMessages(upload, ChunkMessages(upload, false), 1, &pool);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ((*second)[0].values.data(), storage);  // the same memory, every value rewritten
  EXPECT_EQ((*second)[0].values, Model()[0].values);
}

// A model download's chunk messages (ModelChunkMessage after the manifest) as the coordinator
// serializes them, read as the worker reads them: from the transport's slices into the tensors.
std::vector<std::string> ModelChunkMessages(const TensorSet& model, bool with_version) {
  std::vector<std::string> messages;
  ForEachChunk(model, 16, 0, [&](const v1::TensorChunk& c) {
    v1::ModelChunkMessage message;
    *message.mutable_chunk() = c;
    if (with_version) message.set_model_version(7);  // another field: not the writers' layout
    messages.push_back(message.SerializeAsString());
    return Status::Ok();
  }).ok();
  return messages;
}

Result<TensorSet> ReadModel(const std::vector<std::string>& messages, size_t pieces) {
  TensorAssembler assembler("model version 7 of job j", 1 << 20);
  RETURN_IF_ERROR(assembler.Start(BuildManifest(Model(), 16)));
  for (const std::string& message : messages) {
    RETURN_IF_ERROR(AddModelChunkMessage(AsReceived(message, pieces), assembler, "model version 7 of job j"));
  }
  return assembler.Finish();
}

TEST(ModelChunkReaderTest, ADownloadReadFromTheTransportsSlicesIsTheModelLaidOutOrNot) {
  for (bool with_version : {false, true}) {
    for (size_t pieces : {1, 3, 40}) {
      SCOPED_TRACE(std::string(with_version ? "parsed" : "in place") + ", " + std::to_string(pieces) + " slices");
      const Result<TensorSet> read = ReadModel(ModelChunkMessages(Model(), with_version), pieces);
      ASSERT_TRUE(read.ok()) << read.status().ToString();
      ASSERT_EQ(read->size(), 2u);
      EXPECT_EQ((*read)[0].values, Model()[0].values);
      EXPECT_EQ((*read)[1].values, Model()[1].values);
    }
  }
}

TEST(ModelChunkReaderTest, WhatIsNotAChunkOrBreaksTheOrderIsRefused) {
  std::vector<std::string> messages = ModelChunkMessages(Model(), false);
  ASSERT_GE(messages.size(), 3u);
  v1::ModelChunkMessage manifest;
  *manifest.mutable_manifest() = BuildManifest(Model(), 16);
  ExpectRefused(ReadModel({manifest.SerializeAsString()}, 1), {"model version 7 of job j", "a second manifest arrived"});
  ExpectRefused(ReadModel({v1::ModelChunkMessage().SerializeAsString()}, 1), {"expected tensor chunks after the manifest"});
  ExpectRefused(ReadModel({std::string("\xff\xff\xff")}, 1), {"not a ModelChunkMessage"});
  std::vector<std::string> swapped = messages;
  std::swap(swapped[1], swapped[2]);
  ExpectRefused(ReadModel(swapped, 2), {"model version 7 of job j", "expected a chunk of tensor 0 at offset 16"});
  std::vector<std::string> cut = messages;
  cut[0].resize(cut[0].size() - 3);
  ExpectRefused(ReadModel(cut, 1), {"model version 7 of job j"});
  std::vector<std::string> altered = messages;
  altered[0].back() ^= 1;
  ExpectRefused(ReadModel(altered, 1), {"model version 7 of job j", "layer.w"});
  ExpectRefused(ReadModel({messages[0]}, 1), {"model version 7 of job j"});  // incomplete
}

// An inline update (TaskSessionMessage.update) as `header` then `chunks`, each the bytes of an
// UpdateChunkMessage (whose fields are InlineUpdate's), behind the session's tag and length.
std::string InlineMessage(const std::string& header, const std::vector<std::string>& chunks) {
  std::string inner = header;
  for (const std::string& chunk : chunks) inner += chunk;
  std::string outer;
  outer.push_back(static_cast<char>((2 << 3) | 2));  // TaskSessionMessage.update
  google::protobuf::io::StringOutputStream stream(&outer);
  {
    google::protobuf::io::CodedOutputStream out(&stream);
    out.WriteVarint32(static_cast<uint32_t>(inner.size()));
    out.WriteRaw(inner.data(), static_cast<int>(inner.size()));
  }
  return outer;
}

// The header an inline message carries, and its delta, or the first error.
Result<TensorSet> ReadInline(const std::string& message, size_t pieces, v1::UpdateHeader* header) {
  InlineUpdateReader reader("inline update from worker 'w1'");
  RETURN_IF_ERROR(reader.Start(AsReceived(message, pieces), header));
  ASSIGN_OR_RETURN(auto sets, UpdateSets(*header, "inline update from worker 'w1'"));
  UpdateAssembler assembler("inline update from worker 'w1'", 1 << 20, 0);
  RETURN_IF_ERROR(assembler.Start(sets));
  RETURN_IF_ERROR(reader.AddChunks(assembler));
  ASSIGN_OR_RETURN(auto decoded, assembler.Finish());
  return std::move(decoded[kDeltaSet]);
}

TEST(InlineUpdateReaderTest, AnInlineUpdateReadsAsItsUploadWhateverItsLayoutAndSlices) {
  const Upload upload = Encode(UpdateEncoding::kFloat32, 0);
  const Result<TensorSet> parsed = Read(upload, 0);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  v1::UpdateChunkMessage header;
  *header.mutable_header() = upload.header;
  header.mutable_header()->set_job_id("job-1-abc");
  const std::string head = header.SerializeAsString();
  // As Tessera's writers lay it out (read in place), with the data first in each chunk, and
  // with the header after the chunks (both parsed as a message).
  const std::vector<std::string> chunks = ChunkMessages(upload, false);
  std::string header_last;
  for (const std::string& chunk : chunks) header_last += chunk;
  header_last = InlineMessage(header_last + head, {});
  const std::pair<const char*, std::string> layouts[] = {
      {"as written", InlineMessage(head, chunks)},
      {"data first", InlineMessage(head, ChunkMessages(upload, true))},
      {"header last", header_last}};
  for (const auto& [layout, message] : layouts) {
    for (size_t pieces : {1, 3, 40}) {
      SCOPED_TRACE(std::string(layout) + ", " + std::to_string(pieces) + " slices");
      v1::UpdateHeader read_header;
      const Result<TensorSet> read = ReadInline(message, pieces, &read_header);
      ASSERT_TRUE(read.ok()) << read.status().ToString();
      EXPECT_EQ(read_header.job_id(), "job-1-abc");
      ASSERT_EQ(read->size(), parsed->size());
      for (size_t i = 0; i < parsed->size(); ++i) EXPECT_EQ((*read)[i].values, (*parsed)[i].values);
    }
  }
  // The same message built by protobuf itself.
  v1::TaskSessionMessage built;
  *built.mutable_update()->mutable_header() = header.header();
  ForEachChunk(upload.bytes, 16, [&](const v1::TensorChunk& c) {
    *built.mutable_update()->add_chunks() = c;
    return Status::Ok();
  }).ok();
  EXPECT_EQ(built.SerializeAsString(), InlineMessage(head, chunks));
  // And built as the worker builds it, the chunks appended in place.
  v1::TaskSessionMessage appended;
  *appended.mutable_update()->mutable_header() = header.header();
  AppendChunks(upload.bytes, 16, appended.mutable_update()->mutable_chunks());
  EXPECT_EQ(appended.SerializeAsString(), built.SerializeAsString());
}

TEST(InlineUpdateReaderTest, WhatIsNotAnInlineUpdateOrDoesNotAddUpIsRefused) {
  const Upload upload = Encode(UpdateEncoding::kFloat32, 0);
  v1::UpdateChunkMessage header;
  *header.mutable_header() = upload.header;
  const std::string head = header.SerializeAsString();
  std::vector<std::string> chunks = ChunkMessages(upload, false);
  v1::UpdateHeader got;
  // A session's `open`, garbage, and an update without its header.
  v1::TaskSessionMessage open;
  open.mutable_open()->set_worker_id("w1");
  ExpectRefused(ReadInline(open.SerializeAsString(), 1, &got), {"not a TaskSessionMessage carrying an update"});
  ExpectRefused(ReadInline(std::string("\x12\xff\xff\xff"), 1, &got), {"not a TaskSessionMessage"});
  ExpectRefused(ReadInline(InlineMessage("", chunks), 2, &got), {"without its header"});
  // Chunks out of order, a chunk missing, an altered byte: as an upload's.
  std::swap(chunks[1], chunks[2]);
  ExpectRefused(ReadInline(InlineMessage(head, chunks), 3, &got), {"expected a chunk of tensor 0 at offset 16"});
  chunks = ChunkMessages(upload, false);
  chunks.pop_back();
  ExpectRefused(ReadInline(InlineMessage(head, chunks), 3, &got), {"inline update from worker 'w1'"});
  chunks = ChunkMessages(upload, false);
  chunks[0][chunks[0].size() - 1] ^= 1;
  ExpectRefused(ReadInline(InlineMessage(head, chunks), 1, &got), {"tensor 'layer.w'", "content hash"});
  // A message whose length runs past its end.
  std::string cut = InlineMessage(head, ChunkMessages(upload, false));
  cut.resize(cut.size() - 5);
  ExpectRefused(ReadInline(cut, 1, &got), {"inline update from worker 'w1'"});
}

}  // namespace
}  // namespace tessera::wire
