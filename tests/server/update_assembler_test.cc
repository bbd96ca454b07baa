// Reading an encoded update back (proto/update_assembler.h) as the coordinator does: each
// encoding decodes to float32, and a manifest or chunks that do not fit its encoding are
// refused naming the set and the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "base/sha256.h"
#include "proto/update_assembler.h"
#include "proto/update_envelope.h"

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

}  // namespace
}  // namespace tessera::wire
