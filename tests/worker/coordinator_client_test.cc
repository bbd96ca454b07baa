// The worker's gRPC client against a coordinator of its own making (a fake WorkerService on
// loopback): what the client does with answers a coordinator of another version, or a broken
// one, may give.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "tessera/v1/worker_service.grpc.pb.h"
#include "tests/captured_log.h"
#include "worker/coordinator_client.h"

namespace tessera::worker {
namespace {

constexpr auto kWait = std::chrono::seconds(60);

// A coordinator that takes inline updates in its task sessions. Once a session is open it
// hands over a verdict of an update never sent (the worker's cue that its session stands);
// each inline update after that is answered by `answer`, which writes what it likes (or
// nothing) down the session. Its Settings make it a coordinator that takes no inline updates
// (a task channel, which hands over the same cue), one that offers them but answers a task
// session UNIMPLEMENTED, or one whose upload calls never answer.
class FakeCoordinator final : public v1::WorkerService::Service {
 public:
  using Answer = std::function<void(const v1::InlineUpdate&, grpc::ServerReaderWriter<v1::Task, v1::TaskSessionMessage>*)>;
  struct Settings {
    uint64_t inline_update_max_bytes = 1 << 20;
    bool serves_task_sessions = true;
    bool answers_uploads = true;  // else an upload call waits until the worker gives it up
  };
  FakeCoordinator(Answer answer, Settings settings) : answer_(std::move(answer)), settings_(settings) {}

  grpc::Status Join(grpc::ServerContext*, const v1::JoinRequest* request, v1::JoinResponse* response) override {
    response->set_worker_id(request->name());
    response->set_session("session-1");
    response->set_heartbeat_interval_ms(1000);
    response->set_inline_update_max_bytes(settings_.inline_update_max_bytes);
    return grpc::Status::OK;
  }
  grpc::Status TaskSession(grpc::ServerContext*,
                           grpc::ServerReaderWriter<v1::Task, v1::TaskSessionMessage>* stream) override {
    Count(&task_sessions_);
    if (!settings_.serves_task_sessions) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "");
    v1::TaskSessionMessage message;
    if (!stream->Read(&message) || !message.has_open()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "open");
    stream->Write(Hello());
    while (stream->Read(&message)) {
      if (message.has_update()) answer_(message.update(), stream);
    }
    return grpc::Status::OK;
  }
  grpc::Status OpenTaskChannel(grpc::ServerContext* ctx, const v1::TaskChannelRequest*,
                               grpc::ServerWriter<v1::Task>* writer) override {
    Count(&task_channels_);
    writer->Write(Hello());
    while (!ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return grpc::Status::CANCELLED;
  }
  grpc::Status UploadUpdate(grpc::ServerContext* ctx, grpc::ServerReader<v1::UpdateChunkMessage>* reader,
                            v1::UploadResult* result) override {
    v1::UpdateChunkMessage message;
    while (reader->Read(&message)) {
    }
    Count(&upload_calls_);
    if (!settings_.answers_uploads) {
      while (!ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return grpc::Status::CANCELLED;
    }
    result->set_accepted(true);
    return grpc::Status::OK;
  }
  // A download that never sends a byte of its model: it ends when the worker gives it up.
  grpc::Status DownloadModel(grpc::ServerContext* ctx, const v1::DownloadModelRequest*,
                             grpc::ServerWriter<v1::ModelChunkMessage>*) override {
    while (!ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return grpc::Status::CANCELLED;
  }

  int task_sessions() { return Read(task_sessions_); }
  int task_channels() { return Read(task_channels_); }
  int upload_calls() { return Read(upload_calls_); }

 private:
  static v1::Task Hello() {
    v1::Task hello;
    hello.mutable_verdict()->set_job_id("never-sent");
    hello.mutable_verdict()->set_accepted(true);
    return hello;
  }
  void Count(int* calls) {
    std::lock_guard<std::mutex> lock(mu_);
    ++*calls;
  }
  int Read(const int& calls) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls;
  }

  Answer answer_;
  const Settings settings_;
  std::mutex mu_;
  int task_sessions_ = 0;
  int task_channels_ = 0;
  int upload_calls_ = 0;
};

// Unix milliseconds `d` from now, on this machine's clock.
int64_t UnixMsIn(std::chrono::milliseconds d) {
  const auto at = std::chrono::system_clock::now() + d;
  return std::chrono::duration_cast<std::chrono::milliseconds>(at.time_since_epoch()).count();
}

// A failure report for (job-1, round, 1): an update of no tensors, small enough to go inside
// the session.
v1::UpdateHeader Report(uint32_t round) {
  v1::UpdateHeader header;
  header.set_worker_id("w1");
  header.set_session("session-1");
  header.set_job_id("job-1");
  header.set_round(round);
  header.set_attempt(1);
  header.set_failure("the data could not be read");
  return header;
}

class CoordinatorClientTest : public ::testing::Test {
 protected:
  // Starts `service` and the client's task session against it, whose tasks go to the client as
  // the worker's agent hands them (a cancel ends the task's transfers); returns once the
  // session stands, or once the client's task channel has ended (channel_ended_).
  void Start(FakeCoordinator::Answer answer, FakeCoordinator::Settings settings = {}) {
    service_ = std::make_unique<FakeCoordinator>(std::move(answer), settings);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr && port > 0);
    wire::ClientTls tls;
    tls.insecure = true;
    auto client = MakeGrpcCoordinatorClient("127.0.0.1:" + std::to_string(port), tls, {.transfer_deadline = kWait});
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(client).value();
    v1::JoinRequest join;
    join.set_name("w1");
    auto joined = client_->Join(join);
    ASSERT_TRUE(joined.ok()) << joined.status().ToString();
    channel_ = std::thread([this] {
      v1::TaskChannelRequest open;
      open.set_worker_id("w1");
      open.set_session("session-1");
      Status ended = client_->RunTaskChannel(open, [this](const v1::Task& task) {
        if (task.has_cancel()) client_->CancelUpload(task.cancel().job_id(), task.cancel().round(), task.cancel().attempt());
        std::lock_guard<std::mutex> lock(mu_);
        open_ = true;
        cv_.notify_all();
      });
      std::lock_guard<std::mutex> lock(mu_);
      channel_ended_ = ended;
      cv_.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, kWait, [&] { return open_ || !channel_ended_.ok(); }));
  }
  void TearDown() override {
    if (client_) client_->CancelTaskChannel();
    if (channel_.joinable()) channel_.join();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  std::unique_ptr<FakeCoordinator> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CoordinatorClient> client_;
  std::thread channel_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  Status channel_ended_;  // what the client's task channel ended with (OK while it runs)
};

// A coordinator that cancels a task whose update came inside the session, and never gives
// that update a verdict: the upload ends with the cancel (CANCELLED, as an upload call a
// cancel ended), not at the transfer deadline, and the session carries the next update.
TEST_F(CoordinatorClientTest, ACancelEndsTheWaitForAnInlineUpdatesVerdict) {
  Start([](const v1::InlineUpdate& update, grpc::ServerReaderWriter<v1::Task, v1::TaskSessionMessage>* stream) {
    v1::Task answer;
    if (update.header().round() == 1) {
      answer.mutable_cancel()->set_job_id(update.header().job_id());
      answer.mutable_cancel()->set_round(1);
      answer.mutable_cancel()->set_attempt(update.header().attempt());
      answer.mutable_cancel()->set_reason("the round's deadline passed");
    } else {
      answer.mutable_verdict()->set_job_id(update.header().job_id());
      answer.mutable_verdict()->set_round(update.header().round());
      answer.mutable_verdict()->set_attempt(update.header().attempt());
      answer.mutable_verdict()->set_accepted(true);
    }
    stream->Write(answer);
  });
  auto cancelled = client_->UploadUpdate(Report(1), std::make_shared<const wire::UpdateBytes>(), 1 << 20, 0);
  ASSERT_FALSE(cancelled.ok());
  EXPECT_EQ(cancelled.status().code(), StatusCode::kCancelled) << cancelled.status().ToString();
  auto next = client_->UploadUpdate(Report(2), std::make_shared<const wire::UpdateBytes>(), 1 << 20, 0);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_TRUE(next->accepted());
}

// A coordinator that hands a task out, then neither serves its model nor cancels it: the
// download ends at the task's deadline (here 2 s away), named as such, not at the transfer's
// (a minute); the round is over by then, and would take no update.
TEST_F(CoordinatorClientTest, ADownloadEndsAtItsTasksDeadline) {
  Start([](const v1::InlineUpdate&, grpc::ServerReaderWriter<v1::Task, v1::TaskSessionMessage>*) {});
  v1::DownloadModelRequest request;
  request.set_worker_id("w1");
  request.set_session("session-1");
  request.set_job_id("job-1");
  request.set_model_version(0);
  const int64_t deadline = UnixMsIn(std::chrono::seconds(2));
  auto downloaded = client_->DownloadModel(request, 1 << 20, 1, 1, deadline);
  ASSERT_FALSE(downloaded.ok());
  EXPECT_EQ(downloaded.status().code(), StatusCode::kDeadlineExceeded) << downloaded.status().ToString();
  EXPECT_NE(downloaded.status().message().find("the task's deadline_unix_ms " + std::to_string(deadline)),
            std::string::npos)
      << downloaded.status().ToString();
}

// A coordinator that offers inline updates but answers the task session UNIMPLEMENTED (an
// older one, or one with sessions switched off): the client opens a task channel in its place
// in the same call, says so once, and sends every update by an upload call. Ending the call
// would have the worker join again, be offered the same, and never keep a session.
TEST_F(CoordinatorClientTest, ACoordinatorThatServesNoTaskSessionGetsATaskChannel) {
  testing::CapturedLog log;
  Start([](const v1::InlineUpdate&, grpc::ServerReaderWriter<v1::Task, v1::TaskSessionMessage>*) {},
        {.serves_task_sessions = false});
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSERT_TRUE(open_) << "the task channel ended: " << channel_ended_.ToString();
  }
  EXPECT_EQ(service_->task_sessions(), 1);
  EXPECT_EQ(service_->task_channels(), 1);
  auto sent = client_->UploadUpdate(Report(1), std::make_shared<const wire::UpdateBytes>(), 1 << 20, 0);
  ASSERT_TRUE(sent.ok()) << sent.status().ToString();
  EXPECT_TRUE(sent->accepted());
  EXPECT_EQ(service_->upload_calls(), 1);
  const std::string text = log.text();
  const std::string said = "offers inline updates but does not serve task sessions";
  const size_t at = text.find(said);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_EQ(text.find(said, at + 1), std::string::npos) << text;
}

// A coordinator that takes an update's call and never answers it: the upload ends at its
// task's deadline (here 2 s away), naming the round and that deadline, not at the transfer's
// (a minute); the round is over by then. One whose deadline has passed is not sent at all.
TEST_F(CoordinatorClientTest, AnUploadEndsAtItsTasksDeadline) {
  Start([](const v1::InlineUpdate&, grpc::ServerReaderWriter<v1::Task, v1::TaskSessionMessage>*) {},
        {.inline_update_max_bytes = 0, .answers_uploads = false});
  const int64_t deadline = UnixMsIn(std::chrono::seconds(2));
  auto sent = client_->UploadUpdate(Report(3), std::make_shared<const wire::UpdateBytes>(), 1 << 20, deadline);
  ASSERT_FALSE(sent.ok());
  EXPECT_EQ(sent.status().code(), StatusCode::kDeadlineExceeded) << sent.status().ToString();
  for (const std::string& said : {std::string("job-1 round 3 attempt 1"),
                                  "the task's deadline_unix_ms " + std::to_string(deadline)}) {
    EXPECT_NE(sent.status().message().find(said), std::string::npos) << said << " not in " << sent.status().ToString();
  }
  EXPECT_EQ(service_->upload_calls(), 1);
  const int64_t passed = UnixMsIn(-std::chrono::seconds(1));
  auto late = client_->UploadUpdate(Report(4), std::make_shared<const wire::UpdateBytes>(), 1 << 20, passed);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded) << late.status().ToString();
  EXPECT_NE(late.status().message().find("round 4 attempt 1: the task's deadline_unix_ms " + std::to_string(passed)),
            std::string::npos)
      << late.status().ToString();
  EXPECT_EQ(service_->upload_calls(), 1) << "an update whose round was over was sent";
}

// The same inside the task session: a coordinator that never gives an inline update its
// verdict is waited for until the task's deadline, not the transfer's.
TEST_F(CoordinatorClientTest, AnInlineUpdatesVerdictIsWaitedForUntilItsTasksDeadline) {
  Start([](const v1::InlineUpdate&, grpc::ServerReaderWriter<v1::Task, v1::TaskSessionMessage>*) {});
  const int64_t deadline = UnixMsIn(std::chrono::seconds(2));
  auto sent = client_->UploadUpdate(Report(5), std::make_shared<const wire::UpdateBytes>(), 1 << 20, deadline);
  ASSERT_FALSE(sent.ok());
  EXPECT_EQ(sent.status().code(), StatusCode::kDeadlineExceeded) << sent.status().ToString();
  EXPECT_NE(sent.status().message().find("round 5 attempt 1: the task's deadline_unix_ms " + std::to_string(deadline)),
            std::string::npos)
      << sent.status().ToString();
  EXPECT_EQ(service_->upload_calls(), 0);
}

}  // namespace
}  // namespace tessera::worker
