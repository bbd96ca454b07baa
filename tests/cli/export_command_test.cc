// `tessera export` against a coordinator's reply that is not what it should be: the model's
// digest missing or not the tensors', each refused before a file is written.
#include "cli/export_command.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "proto/tensor_transfer.h"
#include "tests/fresh_directory.h"

namespace tessera::cli {
namespace {

// Sends one model as the coordinator does, with `sha256` as the model's digest.
class FakeJobService final : public v1::JobService::Service {
 public:
  std::string sha256;
  TensorSet tensors = {{"fc.weight", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"fc.bias", {2}, {0.5f, -0.5f}}};

  grpc::Status ExportModel(grpc::ServerContext*, const v1::ExportModelRequest*,
                           grpc::ServerWriter<v1::ModelChunkMessage>* writer) override {
    v1::ModelChunkMessage first;
    *first.mutable_manifest() = wire::BuildManifest(tensors);
    first.set_model_version(3);
    first.set_model_sha256(sha256);
    writer->Write(first);
    Status sent = wire::ForEachChunk(tensors, wire::kMaxChunkBytes, 0, [&](const v1::TensorChunk& chunk) {
      v1::ModelChunkMessage message;
      *message.mutable_chunk() = chunk;
      writer->Write(message);
      return Status::Ok();
    });
    return sent.ok() ? grpc::Status::OK : grpc::Status(grpc::StatusCode::INTERNAL, sent.message());
  }
};

class ExportCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::tessera::testing::FreshTestDirectory("tessera-export");
    std::filesystem::create_directories(dir_);
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    stub_ = v1::JobService::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }
  void TearDown() override {
    server_->Shutdown();
    std::filesystem::remove_all(dir_);
  }
  Status Export(std::ostream& out) {
    return ExportCommand(*stub_, {"job-1", std::nullopt, (dir_ / "model.npz").string(), false}, out);
  }

  FakeJobService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::JobService::Stub> stub_;
  std::filesystem::path dir_;
};

TEST_F(ExportCommandTest, AModelWithItsDigestIsWritten) {
  service_.sha256 = TensorSetSha256(service_.tensors);
  std::ostringstream out;
  Status exported = Export(out);
  ASSERT_TRUE(exported.ok()) << exported.ToString();
  EXPECT_TRUE(std::filesystem::exists(dir_ / "model.npz"));
  EXPECT_NE(out.str().find("round 3, 2 tensors, 8 parameters (model SHA-256 " + service_.sha256.substr(0, 16)),
            std::string::npos)
      << out.str();
}

TEST_F(ExportCommandTest, AModelWithoutItsDigestIsRefused) {
  std::ostringstream out;
  Status exported = Export(out);
  EXPECT_EQ(exported.code(), StatusCode::kDataLoss) << exported.ToString();
  EXPECT_EQ(exported.message(), "model of job job-1 (newest round): the coordinator sent no SHA-256 for the model");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "model.npz"));
  EXPECT_EQ(out.str(), "");
}

TEST_F(ExportCommandTest, AWrongDigestIsRefusedAndShownEscapedAndCut) {
  service_.sha256 = "\x1b[2J" + std::string(100000, 'f');
  std::ostringstream out;
  Status exported = Export(out);
  EXPECT_EQ(exported.code(), StatusCode::kDataLoss) << exported.ToString();
  EXPECT_EQ(exported.message().rfind("model of job job-1 (newest round): the tensors do not hash to the model's "
                                     "SHA-256 '\\x1b[2Jfff",
                                     0),
            0u)
      << exported.message();
  EXPECT_LT(exported.message().size(), 256u);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "model.npz"));
}

}  // namespace
}  // namespace tessera::cli
