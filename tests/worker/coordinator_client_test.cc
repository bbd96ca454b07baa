// The worker's gRPC client against a stand-in WorkerService on loopback (real gRPC, real
// connections): an update at least as large as the coordinator's
// JoinResponse.upload_connection_min_bytes goes on a connection of its own, a new one per
// upload, and a smaller one (or any, with 0) on the worker's connection. The coordinator's
// side of the same protocol is exercised with real workers in
// tests/integration/inline_model_test.cc.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <mutex>
#include <string>
#include <vector>

#include "proto/transport_security.h"
#include "tessera/v1/worker_service.grpc.pb.h"
#include "worker/coordinator_client.h"

namespace tessera::worker {
namespace {

// Answers Join with the given threshold and takes every upload whole, noting the peer
// (address and port: one per connection) of each call.
class StandInService final : public v1::WorkerService::Service {
 public:
  explicit StandInService(uint64_t own_from) : own_from_(own_from) {}

  grpc::Status Join(grpc::ServerContext* ctx, const v1::JoinRequest*, v1::JoinResponse* response) override {
    response->set_worker_id("w1");
    response->set_session("s1");
    response->set_upload_connection_min_bytes(own_from_);
    std::lock_guard<std::mutex> lock(mu_);
    join_peer_ = ctx->peer();
    return grpc::Status::OK;
  }

  grpc::Status UploadUpdate(grpc::ServerContext* ctx, grpc::ServerReader<v1::UpdateChunkMessage>* reader,
                            v1::UploadResult* result) override {
    v1::UpdateChunkMessage message;
    uint64_t bytes = 0;
    while (reader->Read(&message)) {
      if (message.has_chunk()) bytes += message.chunk().data().size();
    }
    result->set_accepted(true);
    std::lock_guard<std::mutex> lock(mu_);
    upload_peers_.push_back(ctx->peer());
    upload_bytes_.push_back(bytes);
    return grpc::Status::OK;
  }

  std::string join_peer() {
    std::lock_guard<std::mutex> lock(mu_);
    return join_peer_;
  }
  std::vector<std::string> upload_peers() {
    std::lock_guard<std::mutex> lock(mu_);
    return upload_peers_;
  }
  std::vector<uint64_t> upload_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return upload_bytes_;
  }

 private:
  const uint64_t own_from_;
  std::mutex mu_;
  std::string join_peer_;
  std::vector<std::string> upload_peers_;
  std::vector<uint64_t> upload_bytes_;
};

struct StandIn {
  explicit StandIn(uint64_t own_from) : service(own_from) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~StandIn() {
    if (server) server->Shutdown();
  }
  StandInService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

// Joins, then uploads an update of `bytes` bytes twice.
void JoinAndUploadTwice(StandIn& stand_in, size_t bytes) {
  wire::ClientTls tls;
  tls.insecure = true;
  auto client = MakeGrpcCoordinatorClient("127.0.0.1:" + std::to_string(stand_in.port), tls);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  v1::JoinRequest join;
  join.set_name("w1");
  auto joined = (*client)->Join(join);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  v1::UpdateHeader header;
  header.add_sets()->set_name("delta");
  const wire::UpdateBytes tensors = {std::string(bytes, '\x01')};
  for (int i = 0; i < 2; ++i) {
    auto result = (*client)->UploadUpdate(header, tensors, 4096);
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    EXPECT_TRUE(result->accepted());
  }
}

TEST(CoordinatorClientTest, AnUpdateAtTheThresholdGoesOnANewConnectionEachTime) {
  StandIn stand_in(/*own_from=*/8192);
  ASSERT_NE(stand_in.server, nullptr);
  JoinAndUploadTwice(stand_in, 8192);
  const auto peers = stand_in.service.upload_peers();
  ASSERT_EQ(peers.size(), 2u);
  EXPECT_EQ(stand_in.service.upload_bytes(), (std::vector<uint64_t>{8192, 8192}));
  EXPECT_NE(peers[0], stand_in.service.join_peer()) << "the upload came on the worker's connection";
  EXPECT_NE(peers[1], stand_in.service.join_peer()) << "the upload came on the worker's connection";
  EXPECT_NE(peers[0], peers[1]) << "the second upload reused the first one's connection";
}

TEST(CoordinatorClientTest, ASmallerUpdateOrAZeroThresholdStaysOnTheWorkersConnection) {
  for (uint64_t own_from : {uint64_t{8193}, uint64_t{0}}) {
    SCOPED_TRACE(own_from);
    StandIn stand_in(own_from);
    ASSERT_NE(stand_in.server, nullptr);
    JoinAndUploadTwice(stand_in, 8192);
    const auto peers = stand_in.service.upload_peers();
    ASSERT_EQ(peers.size(), 2u);
    EXPECT_EQ(peers[0], stand_in.service.join_peer());
    EXPECT_EQ(peers[1], stand_in.service.join_peer());
  }
}

}  // namespace
}  // namespace tessera::worker
