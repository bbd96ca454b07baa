// The worker's gRPC client against a stand-in WorkerService on loopback, under mutual TLS
// with the test PKI (real gRPC, real connections): an update at least as large as the
// coordinator's JoinResponse.upload_connection_min_bytes goes on a connection of its own, a
// new one per upload, closed when the upload ends; a smaller one (or any, with 0) goes on
// the worker's connection; and an update refused on its own connection for want of a
// connection (UNAVAILABLE) goes on the worker's. The coordinator's side, with real workers,
// is in inline_model_test.cc. A cancel that finds no task channel open ends only the next
// channel of its own session; a cancel of a task ends that task's upload in flight, and no
// other; the same goes for a model download, which is refused when it holds another model
// version than asked for. An update inside the task session waits for its verdict no longer than the client's
// transfer deadline, and the coordinator's inline limit is taken up to kMaxInlineUpdateBytes.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "proto/tensor_transfer.h"
#include "proto/transport_security.h"
#include "tessera/v1/worker_service.grpc.pb.h"
#include "tests/integration/harness.h"
#include "worker/coordinator_client.h"

namespace tessera::testing {
namespace {

// Answers Join with the given threshold and takes every upload whole, noting the peer
// (address and port: one per connection) of each call. With `refuse_new_connections`, an
// upload that does not come on the Join's connection is answered UNAVAILABLE.
class StandInService final : public v1::WorkerService::Service {
 public:
  StandInService(uint64_t own_from, bool refuse_new_connections)
      : own_from_(own_from), refuse_new_connections_(refuse_new_connections) {}

  grpc::Status Join(grpc::ServerContext* ctx, const v1::JoinRequest*, v1::JoinResponse* response) override {
    response->set_worker_id("w1");
    response->set_session("s1");
    response->set_upload_connection_min_bytes(own_from_);
    response->set_inline_update_max_bytes(inline_update_max_bytes);
    std::lock_guard<std::mutex> lock(mu_);
    join_peer_ = ctx->peer();
    return grpc::Status::OK;
  }

  grpc::Status UploadUpdate(grpc::ServerContext* ctx, grpc::ServerReader<v1::UpdateChunkMessage>* reader,
                            v1::UploadResult* result) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      upload_peers_.push_back(ctx->peer());
      if (refuse_new_connections_ && ctx->peer() != join_peer_) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "stand-in: no upload on a new connection");
      }
    }
    v1::UpdateChunkMessage message;
    uint64_t bytes = 0;
    bool held = false;
    while (reader->Read(&message)) {
      if (message.has_chunk()) bytes += message.chunk().data().size();
      if (message.has_chunk() && !held && after_first_chunk) {
        held = true;
        after_first_chunk();  // nothing more is read meanwhile
      }
    }
    result->set_accepted(true);
    std::lock_guard<std::mutex> lock(mu_);
    upload_bytes_.push_back(bytes);
    uploads_done_.notify_all();
    return grpc::Status::OK;
  }

  // Waits until `count` uploads have been read to their end (or their cancel).
  void WaitForUploads(size_t count) {
    std::unique_lock<std::mutex> lock(mu_);
    uploads_done_.wait(lock, [&] { return upload_bytes_.size() >= count; });
  }

  // When set (before the uploads), runs on each upload's first chunk, before the next is read.
  std::function<void()> after_first_chunk;

  // One task, then the channel ends as when the coordinator closes it.
  grpc::Status OpenTaskChannel(grpc::ServerContext*, const v1::TaskChannelRequest*,
                               grpc::ServerWriter<v1::Task>* writer) override {
    v1::Task task;
    task.mutable_train()->set_job_id("job-1");
    task.mutable_train()->set_round(1);
    writer->Write(task);
    return grpc::Status::OK;
  }

  // When set, writes each download's messages; else every download is held: nothing is sent
  // until the client ends it.
  std::function<void(grpc::ServerWriter<v1::ModelChunkMessage>*)> serve_download;

  grpc::Status DownloadModel(grpc::ServerContext* ctx, const v1::DownloadModelRequest*,
                             grpc::ServerWriter<v1::ModelChunkMessage>* writer) override {
    if (serve_download) {
      serve_download(writer);
      return grpc::Status::OK;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++downloads_started_;
      uploads_done_.notify_all();
    }
    while (!ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return grpc::Status(grpc::StatusCode::CANCELLED, "stand-in: the client ended the download");
  }

  // Waits until `count` downloads have reached the stand-in.
  void WaitForDownloads(int count) {
    std::unique_lock<std::mutex> lock(mu_);
    uploads_done_.wait(lock, [&] { return downloads_started_ >= count; });
  }

  // Opened by `open`, hands over one task, then takes inline updates, each answered by an
  // accepting verdict unless `answer_inline_updates` is false (then none is ever answered).
  grpc::Status TaskSession(grpc::ServerContext*, grpc::ServerReaderWriter<v1::Task, v1::TaskSessionMessage>* stream)
      override {
    v1::TaskSessionMessage message;
    if (!stream->Read(&message) || !message.has_open()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "stand-in: the session must open first");
    }
    v1::Task task;
    task.mutable_train()->set_job_id("job-1");
    task.mutable_train()->set_round(1);
    stream->Write(task);
    while (stream->Read(&message)) {
      if (!message.has_update()) continue;
      uint64_t bytes = 0;
      for (const auto& chunk : message.update().chunks()) bytes += chunk.data().size();
      {
        std::lock_guard<std::mutex> lock(mu_);
        inline_bytes_.push_back(bytes);
      }
      if (!answer_inline_updates) continue;
      v1::Task verdict;
      verdict.mutable_verdict()->set_job_id(message.update().header().job_id());
      verdict.mutable_verdict()->set_round(message.update().header().round());
      verdict.mutable_verdict()->set_attempt(message.update().header().attempt());
      verdict.mutable_verdict()->set_accepted(true);
      stream->Write(verdict);
    }
    return grpc::Status::OK;
  }

  // What Join offers as JoinResponse.inline_update_max_bytes (set before the join).
  uint64_t inline_update_max_bytes = 0;
  bool answer_inline_updates = true;

  std::vector<uint64_t> inline_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return inline_bytes_;
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
  const bool refuse_new_connections_;
  std::mutex mu_;
  std::string join_peer_;
  std::vector<std::string> upload_peers_;  // every upload's, refused ones too
  std::vector<uint64_t> upload_bytes_;     // the taken ones'
  std::vector<uint64_t> inline_bytes_;     // each inline update's
  int downloads_started_ = 0;
  std::condition_variable uploads_done_;
};

struct StandIn {
  explicit StandIn(uint64_t own_from, bool refuse_new_connections = false)
      : service(own_from, refuse_new_connections) {
    auto credentials = wire::MakeServerCredentials(TestPki::Get().CoordinatorTls(), HostPort{"127.0.0.1", 0});
    EXPECT_TRUE(credentials.ok()) << credentials.status().ToString();
    if (!credentials.ok()) return;
    grpc::ServerBuilder builder;
    // The stream's flow-control window stays at its 64 KiB: an upload the service stops reading
    // (after_first_chunk) waits for it after at most that much, as one to a busy coordinator.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.AddListeningPort("127.0.0.1:0", *credentials, &port);
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

// Established TCP connections whose local end is 127.0.0.1:`port` (the server's ends of its
// connections), from /proc/net/tcp and /proc/net/tcp6 (where gRPC's dual-stack sockets list
// 127.0.0.1 as the IPv4-mapped ::ffff:127.0.0.1).
int ServerConnections(int port) {
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "0100007F:%04X", port);
  int count = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const bool ours = local.size() >= std::strlen(suffix) &&
                        local.compare(local.size() - std::strlen(suffix), std::string::npos, suffix) == 0;
      if (ours && state == "01") ++count;  // 01: ESTABLISHED
    }
  }
  return count;
}

// Joins, then uploads an update of `bytes` bytes twice; the client stays alive until the
// checks in `then` are done.
void JoinAndUploadTwice(StandIn& stand_in, size_t bytes, const std::function<void()>& then = {}) {
  auto client = worker::MakeGrpcCoordinatorClient("127.0.0.1:" + std::to_string(stand_in.port),
                                                  TestPki::Get().WorkerTls("w1"));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  v1::JoinRequest join;
  join.set_name("w1");
  auto joined = (*client)->Join(join);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  v1::UpdateHeader header;
  header.add_sets()->set_name("delta");
  const auto tensors = std::make_shared<const wire::UpdateBytes>(wire::UpdateBytes{std::string(bytes, '\x01')});
  for (int i = 0; i < 2; ++i) {
    auto result = (*client)->UploadUpdate(header, tensors, 4096, 0);
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    EXPECT_TRUE(result->accepted());
  }
  if (then) then();
}

TEST(UploadConnectionTest, AnUpdateAtTheThresholdGoesOnANewConnectionEachTimeClosedAfterIt) {
  StandIn stand_in(/*own_from=*/8192);
  ASSERT_NE(stand_in.server, nullptr);
  JoinAndUploadTwice(stand_in, 8192, [&] {
    // The uploads' connections are gone; the worker's own stays.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (ServerConnections(stand_in.port) > 1 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(ServerConnections(stand_in.port), 1);
  });
  const auto peers = stand_in.service.upload_peers();
  ASSERT_EQ(peers.size(), 2u);
  EXPECT_EQ(stand_in.service.upload_bytes(), (std::vector<uint64_t>{8192, 8192}));
  EXPECT_NE(peers[0], stand_in.service.join_peer()) << "the upload came on the worker's connection";
  EXPECT_NE(peers[1], stand_in.service.join_peer()) << "the upload came on the worker's connection";
  EXPECT_NE(peers[0], peers[1]) << "the second upload reused the first one's connection";
}

TEST(UploadConnectionTest, ASmallerUpdateOrAZeroThresholdStaysOnTheWorkersConnection) {
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

TEST(UploadConnectionTest, AnUpdateThatFindsNoConnectionOfItsOwnGoesOnTheWorkersConnection) {
  StandIn stand_in(/*own_from=*/8192, /*refuse_new_connections=*/true);
  ASSERT_NE(stand_in.server, nullptr);
  JoinAndUploadTwice(stand_in, 8192);
  const auto peers = stand_in.service.upload_peers();
  ASSERT_EQ(peers.size(), 4u);  // each upload tried on its own connection, then on the worker's
  EXPECT_NE(peers[0], stand_in.service.join_peer());
  EXPECT_EQ(peers[1], stand_in.service.join_peer());
  EXPECT_NE(peers[2], stand_in.service.join_peer());
  EXPECT_EQ(peers[3], stand_in.service.join_peer());
  EXPECT_EQ(stand_in.service.upload_bytes(), (std::vector<uint64_t>{8192, 8192}));
}

// A cancel that finds no task channel open (a heartbeat refused just as the session's channel
// closed) was for the session that ended: after a Join the new session's channel opens
// uncancelled, where it used to end at its start and cost the worker another join. Without a
// Join between (a stop while the channel was about to open), it still ends the next channel.
TEST(TaskChannelCancelTest, ACancelWithNoChannelOpenEndsOnlyTheNextChannelOfItsSession) {
  StandIn stand_in(/*own_from=*/0);
  ASSERT_NE(stand_in.server, nullptr);
  auto client = worker::MakeGrpcCoordinatorClient("127.0.0.1:" + std::to_string(stand_in.port),
                                                  TestPki::Get().WorkerTls("w1"));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  v1::JoinRequest join;
  join.set_name("w1");
  ASSERT_TRUE((*client)->Join(join).ok());
  v1::TaskChannelRequest open;
  open.set_worker_id("w1");
  open.set_session("s1");
  int tasks = 0;
  const auto count = [&](const v1::Task&) { ++tasks; };
  Status ended = (*client)->RunTaskChannel(open, count);
  EXPECT_EQ(ended.code(), StatusCode::kUnavailable) << ended.ToString();
  EXPECT_EQ(tasks, 1);
  (*client)->CancelTaskChannel();  // meant for the channel that has just closed

  ASSERT_TRUE((*client)->Join(join).ok());
  ended = (*client)->RunTaskChannel(open, count);
  EXPECT_EQ(ended.code(), StatusCode::kUnavailable) << "the new session's channel was cancelled: " << ended.ToString();
  EXPECT_EQ(tasks, 2);

  (*client)->CancelTaskChannel();  // a stop before the channel opens
  ended = (*client)->RunTaskChannel(open, count);
  EXPECT_EQ(ended.code(), StatusCode::kCancelled) << ended.ToString();
  EXPECT_EQ(tasks, 2);
}

// An upload held by the coordinator after its first chunk, while `during` runs (from another
// thread); what the upload returned, and how many of its bytes the coordinator read. With
// `ends_held`, the upload is expected to return while still held (cancelled); else the
// coordinator reads on and it returns its verdict.
struct HeldUpload {
  Result<v1::UploadResult> result = InternalError("not run");
  uint64_t bytes_read = 0;
};
constexpr size_t kHeldUploadBytes = size_t{16} << 20;

HeldUpload UploadHeld(StandIn& stand_in, worker::CoordinatorClient& client, bool ends_held,
                      const std::function<void()>& during) {
  std::mutex mu;
  std::condition_variable cv;
  bool first_chunk = false, go = false;
  stand_in.service.after_first_chunk = [&] {
    std::unique_lock<std::mutex> lock(mu);
    first_chunk = true;
    cv.notify_all();
    cv.wait(lock, [&] { return go; });
  };
  v1::UpdateHeader header;
  header.set_job_id("job-1");
  header.set_round(1);
  header.set_attempt(1);
  header.add_sets()->set_name("delta");
  const auto tensors = std::make_shared<const wire::UpdateBytes>(wire::UpdateBytes{std::string(kHeldUploadBytes, '\x01')});
  HeldUpload held;
  bool returned = false;
  std::thread upload([&] {
    auto result = client.UploadUpdate(header, tensors, 64 << 10, 0);
    std::lock_guard<std::mutex> lock(mu);
    held.result = std::move(result);
    returned = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return first_chunk; });
  }
  during();
  const auto release = [&] {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
    cv.notify_all();
  };
  if (ends_held) {
    // Bounded only so that a failure ends before the upload's own five-minute deadline.
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return returned; }))
        << "the upload did not end while the coordinator held it";
  }
  release();
  upload.join();
  stand_in.service.WaitForUploads(1);
  held.bytes_read = stand_in.service.upload_bytes().at(0);
  return held;
}

std::unique_ptr<worker::CoordinatorClient> JoinedClient(StandIn& stand_in, worker::GrpcClientOptions options = {}) {
  auto client = worker::MakeGrpcCoordinatorClient("127.0.0.1:" + std::to_string(stand_in.port),
                                                  TestPki::Get().WorkerTls("w1"), options);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  if (!client.ok()) return nullptr;
  v1::JoinRequest join;
  join.set_name("w1");
  EXPECT_TRUE((*client)->Join(join).ok());
  return std::move(client).value();
}

// The coordinator cancels a round while the worker is sending its update: the upload ends
// there, CANCELLED, and the rest of its chunks are never sent.
TEST(UploadCancelTest, ACancelOfTheTaskEndsItsUploadInFlight) {
  StandIn stand_in(/*own_from=*/0);
  ASSERT_NE(stand_in.server, nullptr);
  auto client = JoinedClient(stand_in);
  ASSERT_NE(client, nullptr);
  const HeldUpload held = UploadHeld(stand_in, *client, /*ends_held=*/true,
                                     [&] { client->CancelUpload("job-1", 1, 1); });
  EXPECT_EQ(held.result.status().code(), StatusCode::kCancelled) << held.result.status().ToString();
  EXPECT_LT(held.bytes_read, kHeldUploadBytes / 2) << "the cancelled upload kept sending";
}

// Attempt 0, from a coordinator that does not send the attempt, cancels every attempt.
TEST(UploadCancelTest, ACancelWithoutAnAttemptEndsEveryAttemptsUpload) {
  StandIn stand_in(/*own_from=*/0);
  ASSERT_NE(stand_in.server, nullptr);
  auto client = JoinedClient(stand_in);
  ASSERT_NE(client, nullptr);
  const HeldUpload held = UploadHeld(stand_in, *client, /*ends_held=*/true,
                                     [&] { client->CancelUpload("job-1", 1, 0); });
  EXPECT_EQ(held.result.status().code(), StatusCode::kCancelled) << held.result.status().ToString();
  EXPECT_LT(held.bytes_read, kHeldUploadBytes / 2) << "the cancelled upload kept sending";
}

TEST(UploadCancelTest, ACancelOfAnotherTaskLetsTheUploadFinish) {
  StandIn stand_in(/*own_from=*/0);
  ASSERT_NE(stand_in.server, nullptr);
  auto client = JoinedClient(stand_in);
  ASSERT_NE(client, nullptr);
  const HeldUpload held = UploadHeld(stand_in, *client, /*ends_held=*/false, [&] {
    client->CancelUpload("job-1", 1, 2);
    client->CancelUpload("job-1", 2, 1);
    client->CancelUpload("job-2", 1, 1);
  });
  ASSERT_TRUE(held.result.ok()) << held.result.status().ToString();
  EXPECT_TRUE(held.result->accepted());
  EXPECT_EQ(held.bytes_read, kHeldUploadBytes);
}

// A cancel that comes before its task's upload starts (while the update is encoded) stops it
// from starting; a Join forgets it with its session, as the coordinator that resumes a round
// under the same attempt hands the task out again.
TEST(UploadCancelTest, ACancelBeforeTheUploadStopsItUntilTheNextJoin) {
  StandIn stand_in(/*own_from=*/0);
  ASSERT_NE(stand_in.server, nullptr);
  auto client = JoinedClient(stand_in);
  ASSERT_NE(client, nullptr);
  client->CancelUpload("job-1", 1, 1);
  v1::UpdateHeader header;
  header.set_job_id("job-1");
  header.set_round(1);
  header.set_attempt(1);
  header.add_sets()->set_name("delta");
  const auto tensors = std::make_shared<const wire::UpdateBytes>(wire::UpdateBytes{std::string(8192, '\x01')});
  auto result = client->UploadUpdate(header, tensors, 4096, 0);
  EXPECT_EQ(result.status().code(), StatusCode::kCancelled) << result.status().ToString();
  for (uint64_t bytes : stand_in.service.upload_bytes()) EXPECT_EQ(bytes, 0u) << "the cancelled task's update was sent";
  v1::JoinRequest join;
  join.set_name("w1");
  ASSERT_TRUE(client->Join(join).ok());
  result = client->UploadUpdate(header, tensors, 4096, 0);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ASSERT_FALSE(stand_in.service.upload_bytes().empty());
  EXPECT_EQ(stand_in.service.upload_bytes().back(), 8192u);
}

// The coordinator cancels a task while its model downloads: the download ends there,
// CANCELLED, where it used to run on (up to its five-minute deadline) until training's first
// step looked for the cancel. A cancel of another task leaves it be; a download of the
// cancelled task that starts later ends at once.
TEST(DownloadCancelTest, ACancelOfTheTaskEndsItsModelDownload) {
  StandIn stand_in(/*own_from=*/0);
  ASSERT_NE(stand_in.server, nullptr);
  auto client = JoinedClient(stand_in);
  ASSERT_NE(client, nullptr);
  client->CancelUpload("job-1", 1, 2);  // another attempt's
  v1::DownloadModelRequest request;
  request.set_job_id("job-1");
  std::mutex mu;
  std::condition_variable cv;
  bool returned = false;
  Result<TensorSet> result = InternalError("not run");
  std::thread download([&] {
    auto downloaded = client->DownloadModel(request, 1 << 20, 1, 1, 0);
    std::lock_guard<std::mutex> lock(mu);
    result = std::move(downloaded);
    returned = true;
    cv.notify_all();
  });
  stand_in.service.WaitForDownloads(1);
  client->CancelUpload("job-1", 1, 1);
  {
    // Bounded only so that a failure ends before the download's own five-minute deadline.
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return returned; }))
        << "the download did not end at its task's cancel";
  }
  client->CancelTransfers();  // when the cancel did not end it
  download.join();
  EXPECT_EQ(result.status().code(), StatusCode::kCancelled) << result.status().ToString();
  EXPECT_NE(result.status().message().find("the coordinator cancelled the task"), std::string::npos)
      << result.status().ToString();
}

TEST(DownloadCancelTest, ADownloadOfACancelledTaskDoesNotStart) {
  StandIn stand_in(/*own_from=*/0);
  ASSERT_NE(stand_in.server, nullptr);
  // The deadline bounds only a failure: the stand-in holds a download that starts.
  auto client = JoinedClient(stand_in, worker::GrpcClientOptions{.transfer_deadline = std::chrono::seconds(60)});
  ASSERT_NE(client, nullptr);
  client->CancelUpload("job-1", 1, 0);  // every attempt of round 1
  v1::DownloadModelRequest request;
  request.set_job_id("job-1");
  const auto result = client->DownloadModel(request, 1 << 20, 1, 3, 0);
  EXPECT_EQ(result.status().code(), StatusCode::kCancelled) << result.status().ToString();
}

// The first message of a download names the model version it holds: one other than the task's
// is refused, where it used to be trained from, its update reported as based on the task's.
TEST(DownloadVersionTest, AModelOfAnotherVersionThanAskedForIsRefused) {
  StandIn stand_in(/*own_from=*/0);
  ASSERT_NE(stand_in.server, nullptr);
  const TensorSet model = {NamedTensor{"w", {2}, {1.0f, 2.0f}}};
  uint64_t served = 0;
  stand_in.service.serve_download = [&](grpc::ServerWriter<v1::ModelChunkMessage>* writer) {
    v1::ModelChunkMessage first;
    *first.mutable_manifest() = wire::BuildManifest(model);
    first.set_model_version(served);
    writer->Write(first);
    wire::ForEachChunk(model, wire::kMaxChunkBytes, 0, [&](const v1::TensorChunk& chunk) {
      v1::ModelChunkMessage message;
      *message.mutable_chunk() = chunk;
      writer->Write(message);
      return Status::Ok();
    }).ok();
  };
  auto client = JoinedClient(stand_in);
  ASSERT_NE(client, nullptr);
  v1::DownloadModelRequest request;
  request.set_job_id("job-1");
  request.set_model_version(5);
  served = 5;
  auto same = client->DownloadModel(request, 1 << 20, 6, 1, 0);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ((*same)[0].values, model[0].values);
  served = 6;
  auto other = client->DownloadModel(request, 1 << 20, 6, 1, 0);
  EXPECT_EQ(other.status().code(), StatusCode::kDataLoss) << other.status().ToString();
  EXPECT_NE(other.status().message().find("model version 5 of job job-1: the coordinator sent model version 6"),
            std::string::npos)
      << other.status().ToString();
}

// A client joined to `stand_in` (with `options`) whose task session is open: its first task
// has arrived. The session ends, and its thread with it, when the value goes.
class OpenSession {
 public:
  OpenSession(StandIn& stand_in, worker::GrpcClientOptions options) {
    auto client = worker::MakeGrpcCoordinatorClient("127.0.0.1:" + std::to_string(stand_in.port),
                                                    TestPki::Get().WorkerTls("w1"), options);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    if (!client.ok()) return;
    client_ = std::move(client).value();
    v1::JoinRequest join;
    join.set_name("w1");
    auto joined = client_->Join(join);
    EXPECT_TRUE(joined.ok()) << joined.status().ToString();
    reader_ = std::thread([this] {
      v1::TaskChannelRequest open;
      open.set_worker_id("w1");
      open.set_session("s1");
      // How the channel ends is not this fixture's concern: the tests look at the uploads.
      (void)client_->RunTaskChannel(open, [this](const v1::Task&) {
        std::lock_guard<std::mutex> lock(mu_);
        open_ = true;
        cv_.notify_all();
      });
    });
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }
  ~OpenSession() {
    if (client_) client_->CancelTaskChannel();
    if (reader_.joinable()) reader_.join();
  }

  // Uploads an update of `bytes` bytes for job-1 round 1 attempt 1 of session s1.
  Result<v1::UploadResult> Upload(size_t bytes) {
    v1::UpdateHeader header;
    header.set_job_id("job-1");
    header.set_round(1);
    header.set_attempt(1);
    header.set_session("s1");
    header.add_sets()->set_name("delta");
    return client_->UploadUpdate(
        header, std::make_shared<const wire::UpdateBytes>(wire::UpdateBytes{std::string(bytes, '\x01')}), 64 << 10, 0);
  }

 private:
  std::unique_ptr<worker::CoordinatorClient> client_;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// A coordinator that never answers an update sent inside the session: the upload fails at the
// client's transfer deadline, saying so, where it used to claim that the session had ended.
TEST(SessionUploadTest, AnUpdateWithoutAVerdictFailsAtTheTransferDeadlineNamingIt) {
  StandIn stand_in(/*own_from=*/0);
  ASSERT_NE(stand_in.server, nullptr);
  stand_in.service.inline_update_max_bytes = 1 << 20;
  stand_in.service.answer_inline_updates = false;
  OpenSession session(stand_in, worker::GrpcClientOptions{.transfer_deadline = std::chrono::milliseconds(300)});
  const auto result = session.Upload(8192);
  EXPECT_EQ(result.status().code(), StatusCode::kDeadlineExceeded) << result.status().ToString();
  EXPECT_NE(result.status().message().find("within the transfer deadline of 300 ms"), std::string::npos)
      << result.status().ToString();
  EXPECT_EQ(result.status().message().find("session ended"), std::string::npos) << result.status().ToString();
  EXPECT_EQ(stand_in.service.inline_bytes(), (std::vector<uint64_t>{8192}));
  EXPECT_TRUE(stand_in.service.upload_bytes().empty()) << "the update went by an upload call";
}

// A coordinator offering more than gRPC's default receive limit does not get an update larger
// than that as one message: it goes by an upload call, where it used to go inside the session
// and be refused there. A small one still rides inside the session.
TEST(SessionUploadTest, AnInlineLimitPastFourMebibytesIsTakenAsFour) {
  StandIn stand_in(/*own_from=*/0);
  ASSERT_NE(stand_in.server, nullptr);
  stand_in.service.inline_update_max_bytes = uint64_t{1} << 40;
  OpenSession session(stand_in, worker::GrpcClientOptions{});
  const size_t large = worker::kMaxInlineUpdateBytes + (64 << 10);
  auto result = session.Upload(large);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_TRUE(result->accepted());
  EXPECT_EQ(stand_in.service.upload_bytes(), (std::vector<uint64_t>{large}));
  EXPECT_TRUE(stand_in.service.inline_bytes().empty()) << "the large update went inside the session";
  result = session.Upload(8192);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_TRUE(result->accepted());
  EXPECT_EQ(stand_in.service.inline_bytes(), (std::vector<uint64_t>{8192}));
}

}  // namespace
}  // namespace tessera::testing
