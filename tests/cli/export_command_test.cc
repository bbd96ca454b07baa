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

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::GetJobResponse* response) override {
    *response->mutable_job()->mutable_spec() = spec;
    return grpc::Status::OK;
  }
  v1::JobSpec spec;
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
  Status Export(std::ostream& out, std::optional<uint32_t> round = std::nullopt, const std::string& file = "model.npz") {
    return ExportCommand(*stub_, {"job-1", round, (dir_ / file).string(), false}, out);
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

// The file's name is the user's -o: the line that says it was written shows it escaped, on
// one line.
TEST_F(ExportCommandTest, TheFileWrittenIsNamedEscaped) {
  service_.sha256 = TensorSetSha256(service_.tensors);
  const std::string file = "model\x1b[2J\nforged.npz";
  std::ostringstream out;
  Status exported = Export(out, std::nullopt, file);
  ASSERT_TRUE(exported.ok()) << exported.ToString();
  EXPECT_TRUE(std::filesystem::exists(dir_ / file));
  const std::string said = out.str();
  EXPECT_EQ(said.find('\x1b'), std::string::npos) << said;
  EXPECT_EQ(said.find('\n'), said.size() - 1) << said;
  EXPECT_EQ(said.rfind("wrote '" + (dir_ / "model\\x1b[2J\\nforged.npz").string() + "': job job-1 round 3", 0), 0u)
      << said;
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

// Asked for round 2, the coordinator's model of round 3 was written as the export of round 2.
TEST_F(ExportCommandTest, AModelOfAnotherRoundThanTheOneAskedForIsRefused) {
  service_.sha256 = TensorSetSha256(service_.tensors);
  std::ostringstream out;
  Status exported = Export(out, 2);
  EXPECT_EQ(exported.code(), StatusCode::kDataLoss) << exported.ToString();
  EXPECT_EQ(exported.message(), "model of job job-1 round 2: the coordinator sent the model of round 3");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "model.npz"));
  EXPECT_TRUE(Export(out, 3).ok());
}

// The ONNX graph comes from the job's spec: one that declares another model than the export's
// (here 3,256,330 values against 8) was built, its weights drawn, before the layouts were
// compared, however large it was. It is refused by its size, naming the job.
TEST_F(ExportCommandTest, AnOnnxExportWhoseSpecDeclaresAnotherModelIsRefusedBeforeItIsBuilt) {
  service_.sha256 = TensorSetSha256(service_.tensors);
  service_.spec.mutable_model()->set_name("mlp");
  service_.spec.mutable_model()->add_hidden(4096);
  std::ostringstream out;
  Status exported = Export(out, std::nullopt, "model.onnx");
  EXPECT_EQ(exported.code(), StatusCode::kDataLoss) << exported.ToString();
  EXPECT_EQ(exported.message(), "model of job job-1 (newest round): the job's model spec ('mlp') has 3256330 values; "
                                "the exported model has 8");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "model.onnx"));
}

// The spec that matches the export (a linear layer from 3 inputs to 2 classes) is written.
TEST_F(ExportCommandTest, AnOnnxExportWhoseSpecMatchesIsWritten) {
  service_.sha256 = TensorSetSha256(service_.tensors);
  service_.spec.mutable_model()->set_name("declared");
  service_.spec.mutable_model()->add_layers()->set_type("linear");
  service_.spec.mutable_model()->mutable_layers(0)->set_name("fc");
  auto* shape = service_.spec.mutable_data()->mutable_input_shape();
  shape->set_channels(1);
  shape->set_rows(1);
  shape->set_cols(3);
  shape->set_classes(2);
  std::ostringstream out;
  Status exported = Export(out, std::nullopt, "model.onnx");
  ASSERT_TRUE(exported.ok()) << exported.ToString();
  EXPECT_TRUE(std::filesystem::exists(dir_ / "model.onnx"));
}

}  // namespace
}  // namespace tessera::cli
