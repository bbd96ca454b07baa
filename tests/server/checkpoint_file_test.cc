// Checkpoint files as the SQLite store reads them: a damaged one is DataLoss naming the file
// (a changed value, a manifest cut, wrapped or not fitting its tensors, a file larger than any
// job's), so that a resume falls back to the checkpoint before it; XXH3-128 checks them, and
// files written with SHA-256 still load.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "server/state/sqlite_state_store.h"
#include "tests/server/test_directory.h"

namespace tessera::server {
namespace {

class CheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = FreshTestDirectory("tessera-checkpoint"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TensorSet Model(float v) { return {{"w", {2, 2}, {v, v + 1, v + 2, v + 3}}, {"b", {2}, {v, -v}}}; }

TEST_F(CheckpointFileTest, ACorruptCheckpointIsNamed) {
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->SaveInitialModel("job-x", Model(1)).ok());
  const auto path = dir_ / "checkpoints" / "job-x-round-0.ckpt";
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() - 3] ^= 0x10;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  auto loaded = (*store)->LoadCheckpoint("job-x", 0);
  EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(loaded.status().message().find("job-x-round-0.ckpt"), std::string::npos) << loaded.status().message();
  bytes.resize(bytes.size() / 2);
  EXPECT_EQ(DecodeCheckpoint(bytes, "half").status().code(), StatusCode::kDataLoss);
}

// Checkpoints carry each tensor's XXH3-128 and no SHA-256; a changed value is found by it.
// The store writes them from the tensors as they are, the same bytes as EncodeCheckpoint's.
// A checkpoint written with SHA-256, as before, still loads, and its damage is found too.
TEST_F(CheckpointFileTest, CheckpointsAreCheckedByXxh3AndOnesWithSha256StillLoad) {
  const TensorSet model = Model(2);
  std::string bytes = EncodeCheckpoint(model);
  uint64_t length = 0;
  std::memcpy(&length, bytes.data() + 8, sizeof(length));
  v1::TensorManifest manifest;
  ASSERT_TRUE(manifest.ParseFromArray(bytes.data() + 16, static_cast<int>(length)));
  ASSERT_EQ(manifest.tensors_size(), 2);
  for (const auto& info : manifest.tensors()) {
    EXPECT_EQ(info.xxh3_128().size(), 32u) << info.name();
    EXPECT_TRUE(info.sha256().empty()) << info.name();
  }
  // The store writes the same bytes, piece by piece.
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->SaveInitialModel("job-y", model).ok());
    std::ifstream in(dir_ / "checkpoints" / "job-y-round-0.ckpt", std::ios::binary);
    const std::string written(std::istreambuf_iterator<char>(in), {});
    EXPECT_EQ(written, bytes);
  }
  auto decoded = DecodeCheckpoint(bytes, "new.ckpt");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ((*decoded)[0].values, model[0].values);
  std::string damaged = bytes;
  damaged[damaged.size() - 1] ^= 0x01;  // the last value of "b"
  auto refused = DecodeCheckpoint(damaged, "new.ckpt");
  EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(refused.status().message().find("xxh3_128"), std::string::npos) << refused.status().message();

  // The same tensors as a checkpoint written with SHA-256: the format's manifest with the
  // older checksum, the values unchanged.
  v1::TensorManifest old_manifest = manifest;
  for (int i = 0; i < old_manifest.tensors_size(); ++i) {
    old_manifest.mutable_tensors(i)->clear_xxh3_128();
    old_manifest.mutable_tensors(i)->set_sha256(model[static_cast<size_t>(i)].Sha256());
  }
  const std::string old_bytes_manifest = old_manifest.SerializeAsString();
  std::string old_bytes = bytes.substr(0, 8);
  const uint64_t old_length = old_bytes_manifest.size();
  old_bytes.append(reinterpret_cast<const char*>(&old_length), sizeof(old_length));
  old_bytes += old_bytes_manifest;
  old_bytes += bytes.substr(16 + length);
  auto old_decoded = DecodeCheckpoint(old_bytes, "old.ckpt");
  ASSERT_TRUE(old_decoded.ok()) << old_decoded.status().ToString();
  EXPECT_EQ((*old_decoded)[1].values, model[1].values);
  old_bytes[old_bytes.size() - 1] ^= 0x01;
  auto old_refused = DecodeCheckpoint(old_bytes, "old.ckpt");
  EXPECT_EQ(old_refused.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(old_refused.status().message().find("hash"), std::string::npos) << old_refused.status().message();
}

// A manifest length near 2^64 wrapped "16 + length" around and reached the protobuf parser.
TEST_F(CheckpointFileTest, ACheckpointWithAnImpossibleManifestLengthIsDataLoss) {
  std::string bytes = EncodeCheckpoint(Model(1));
  const uint64_t length = ~uint64_t{0} - 7;
  std::memcpy(bytes.data() + 8, &length, sizeof(length));
  auto decoded = DecodeCheckpoint(bytes, "wrapped.ckpt");
  EXPECT_EQ(decoded.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(decoded.status().message().find("wrapped.ckpt: truncated manifest"), std::string::npos)
      << decoded.status().message();
}

// A manifest longer than any the coordinator writes is refused by its length, before it is
// parsed: a long one of tiny entries would parse to many times its size in memory.
TEST_F(CheckpointFileTest, ACheckpointWithAManifestLongerThanAnyWrittenIsDataLossBeforeItIsParsed) {
  v1::TensorManifest manifest;
  v1::TensorInfo* info = manifest.add_tensors();
  info->set_name(std::string(kMaxCheckpointManifestBytes, 'n'));
  info->add_shape(1);
  info->set_byte_size(4);
  manifest.set_total_bytes(4);
  const std::string serialized = manifest.SerializeAsString();
  ASSERT_GT(serialized.size(), kMaxCheckpointManifestBytes);
  std::string bytes = "TSRCKPT1";
  const uint64_t length = serialized.size();
  bytes.append(reinterpret_cast<const char*>(&length), sizeof(length));
  bytes += serialized;
  bytes.append(4, '\0');
  auto decoded = DecodeCheckpoint(bytes, "long.ckpt");
  EXPECT_EQ(decoded.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(decoded.status().message().find("long.ckpt: manifest length field: " + std::to_string(length) +
                                            " bytes; expected at most " + std::to_string(kMaxCheckpointManifestBytes)),
            std::string::npos)
      << decoded.status().message().substr(0, 200);
}

// A manifest that still parses but no longer describes the tensors after it (a shape or a
// dtype damaged) is DataLoss, as a changed value is: a resume falls back to the checkpoint
// before it instead of failing the job.
TEST_F(CheckpointFileTest, ACheckpointWhoseManifestDoesNotFitItsTensorsIsDataLoss) {
  const std::string bytes = EncodeCheckpoint(Model(1));
  uint64_t length = 0;
  std::memcpy(&length, bytes.data() + 8, sizeof(length));
  v1::TensorManifest manifest;
  ASSERT_TRUE(manifest.ParseFromArray(bytes.data() + 16, static_cast<int>(length)));
  const auto rewritten = [&](const v1::TensorManifest& changed) {
    const std::string m = changed.SerializeAsString();
    std::string out = bytes.substr(0, 8);
    const uint64_t n = m.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof(n));
    return out + m + bytes.substr(16 + length);
  };
  v1::TensorManifest reshaped = manifest;
  reshaped.mutable_tensors(0)->set_shape(0, 3);
  v1::TensorManifest retyped = manifest;
  retyped.mutable_tensors(1)->set_dtype(v1::DTYPE_INT8);
  for (const v1::TensorManifest& changed : {reshaped, retyped}) {
    auto decoded = DecodeCheckpoint(rewritten(changed), "changed.ckpt");
    EXPECT_EQ(decoded.status().code(), StatusCode::kDataLoss) << decoded.status().ToString();
    EXPECT_NE(decoded.status().message().find("changed.ckpt"), std::string::npos) << decoded.status().message();
  }
  // In the store, the checkpoint before it is taken.
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->SaveInitialModel("job-z", Model(0)).ok());
  ASSERT_TRUE((*store)->WriteCheckpoint("job-z", 1, Model(1)).ok());
  std::ofstream(dir_ / "checkpoints" / "job-z-round-1.ckpt", std::ios::binary | std::ios::trunc) << rewritten(reshaped);
  std::vector<Status> damaged;
  auto newest = (*store)->LoadNewestCheckpoint("job-z", 1, &damaged);
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(newest->round, 0u);
  ASSERT_EQ(damaged.size(), 1u);
  EXPECT_NE(damaged[0].message().find("job-z-round-1.ckpt"), std::string::npos) << damaged[0].message();
}

// A checkpoint file larger than any job's model and state is refused by its size, before a
// buffer is made for it: here a sparse file of a few GiB that takes no disk, round 1's, and
// the job falls back to the initial model.
TEST_F(CheckpointFileTest, ACheckpointLargerThanAnyJobsIsRefusedBeforeItIsRead) {
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->SaveInitialModel("job-big", Model(0)).ok());
  const auto path = dir_ / "checkpoints" / "job-big-round-1.ckpt";
  std::ofstream(path, std::ios::binary) << EncodeCheckpoint(Model(1));
  std::filesystem::resize_file(path, kMaxCheckpointBytes + 1);
  auto loaded = (*store)->LoadCheckpoint("job-big", 1);
  EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss) << loaded.status().ToString();
  EXPECT_NE(loaded.status().message().find("job-big-round-1.ckpt': " + std::to_string(kMaxCheckpointBytes + 1) +
                                           " bytes; expected at most"),
            std::string::npos)
      << loaded.status().message();
  std::vector<Status> damaged;
  auto newest = (*store)->LoadNewestCheckpoint("job-big", 1, &damaged);
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(newest->round, 0u);
}

}  // namespace
}  // namespace tessera::server
