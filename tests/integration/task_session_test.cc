// Task sessions (WorkerService.TaskSession): the task channel as a two-way stream, with small
// updates sent inside it and answered by an UpdateVerdict down the same stream. The worker's
// own client sends an update that fits inside its session and gets the coordinator's verdict
// as an upload call would; a session refuses what is not its worker's, names what it expected,
// and a coordinator with --inline-update-kib 0 serves no sessions.
#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "proto/update_envelope.h"
#include "server/monitoring/coordinator_metrics.h"
#include "tests/integration/harness.h"
#include "tessera/v1/worker_service.grpc.pb.h"

namespace tessera::testing {
namespace {

// A coordinator taking inline updates of at most `inline_limit` bytes, with one small job of
// one round for one party.
struct OneRound {
  explicit OneRound(uint64_t inline_limit, const std::function<void(server::CoordinatorOptions&)>& adjust = {})
      : dir("task-session") {
    auto options = TestCoordinatorOptions(dir.str());
    options.inline_update_max_bytes = inline_limit;
    if (adjust) adjust(options);
    auto started = server::Coordinator::Start(options);
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    if (started.ok()) coordinator = std::move(started).value();
  }
  int port() const { return coordinator->port(); }

  TempDir dir;
  std::unique_ptr<server::Coordinator> coordinator;
};

// A hand-driven worker (the real client) that keeps its last train task.
class Keeper {
 public:
  Keeper(int port, const std::string& name)
      : hand_(std::make_unique<HandWorker>("127.0.0.1:" + std::to_string(port), name, [this](const v1::TrainTask& t) {
          std::lock_guard<std::mutex> lock(mu_);
          task_ = t;
        })) {}
  std::optional<v1::TrainTask> task() {
    std::lock_guard<std::mutex> lock(mu_);
    return task_;
  }
  HandWorker& hand() { return *hand_; }

  // An unchanged model's update for `task`: its header and bytes.
  void BuildUpdate(const v1::TrainTask& task, v1::UpdateHeader* header, wire::UpdateBytes* bytes) {
    auto model = hand_->Download(task);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    TensorSet delta = *model;
    for (auto& t : delta) std::fill(t.values.begin(), t.values.end(), 0.0f);
    header->set_worker_id(hand_->joined().worker_id());
    header->set_session(hand_->joined().session());
    header->set_job_id(task.job_id());
    header->set_round(task.round());
    header->set_attempt(task.attempt());
    header->set_base_model_version(task.model_version());
    header->set_samples(100);
    wire::AppendUpdateSet(wire::kDeltaSet, delta, UpdateEncoding::kFloat32, 0, 1 << 20, header, bytes);
  }

 private:
  std::mutex mu_;
  std::optional<v1::TrainTask> task_;
  std::unique_ptr<HandWorker> hand_;  // last: its threads end before the members above go
};

// One worker of a coordinator taking inline updates of at most `inline_limit` bytes uploads an
// unchanged model's update for the one round of a one-party job, with its own client: the
// update is accepted, and came the way `expected_way` says ("session" or "call"). The job
// then commits its round with it.
void UploadOnce(uint64_t inline_limit, const std::string& expected_way) {
  OneRound c(inline_limit);
  ASSERT_TRUE(c.coordinator);
  Keeper worker(c.port(), "session-worker");
  EXPECT_EQ(worker.hand().joined().inline_update_max_bytes(), inline_limit);
  auto stub = JobStub(c.port());
  ASSERT_TRUE(WaitForWorkers(*stub, 1, std::chrono::seconds(20)));
  auto job = c.coordinator->SubmitJob(SmallJob(1, 1, 1000));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return worker.task().has_value(); }, std::chrono::milliseconds(20000)));
  v1::UpdateHeader header;
  wire::UpdateBytes bytes;
  worker.BuildUpdate(*worker.task(), &header, &bytes);
  const double sessions = server::UpdatesReceived("session"), calls = server::UpdatesReceived("call");
  auto result =
      worker.hand().client().UploadUpdate(header, std::make_shared<const wire::UpdateBytes>(bytes), 1 << 20, 0);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_TRUE(result->accepted()) << result->reason();
  EXPECT_EQ(server::UpdatesReceived("session"), sessions + (expected_way == "session" ? 1 : 0));
  EXPECT_EQ(server::UpdatesReceived("call"), calls + (expected_way == "call" ? 1 : 0));
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(60));
  EXPECT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  ASSERT_EQ(done.rounds_size(), 1);
  EXPECT_EQ(done.rounds(0).workers(0).outcome(), "accepted");
}

// The worker's client sends an update that fits inside its session, and gets its verdict there.
TEST(TaskSessionTest, AnUpdateThatFitsGoesInsideTheSessionAndIsAnsweredThere) { UploadOnce(uint64_t{1} << 20, "session"); }

// Larger than the coordinator takes inside a session: the same client sends it by a call.
TEST(TaskSessionTest, AnUpdateLargerThanTheLimitGoesByAnUploadCall) { UploadOnce(4 << 10, "call"); }

// A session spoken by hand, over the worker's own certificate.
class HandSession {
 public:
  HandSession(int port, const std::string& name) : stub_(WorkerStub(port, name)) {
    v1::JoinRequest join;
    join.set_join_token(kToken);
    join.set_name(name);
    grpc::ClientContext ctx;
    grpc::Status s = stub_->Join(&ctx, join, &joined_);
    EXPECT_TRUE(s.ok()) << s.error_message();
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stream_ = stub_->TaskSession(&ctx_);
  }
  ~HandSession() {
    if (finished_) return;
    ctx_.TryCancel();
    stream_->Finish();
  }
  const v1::JoinResponse& joined() const { return joined_; }
  bool Open() {
    v1::TaskSessionMessage open;
    open.mutable_open()->set_worker_id(joined_.worker_id());
    open.mutable_open()->set_session(joined_.session());
    return stream_->Write(open);
  }
  bool Send(const v1::TaskSessionMessage& message) { return stream_->Write(message); }
  // The next verdict down the stream, or nullopt when the stream ends first.
  std::optional<v1::UpdateVerdict> NextVerdict() {
    v1::Task task;
    while (stream_->Read(&task)) {
      if (task.has_verdict()) return task.verdict();
    }
    return std::nullopt;
  }
  // Reads until the stream ends; its status.
  grpc::Status End() {
    v1::Task task;
    while (stream_->Read(&task)) {
    }
    stream_->WritesDone();
    grpc::Status s = stream_->Finish();
    finished_ = true;
    return s;
  }

 private:
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  v1::JoinResponse joined_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::TaskSessionMessage, v1::Task>> stream_;
  bool finished_ = false;
};

// An update for `job`, round 1, of `values` float32 zeros in one tensor, from `joined`.
v1::TaskSessionMessage UpdateOf(const v1::JoinResponse& joined, const std::string& job, size_t values) {
  v1::TaskSessionMessage message;
  v1::InlineUpdate& update = *message.mutable_update();
  v1::UpdateHeader& header = *update.mutable_header();
  header.set_worker_id(joined.worker_id());
  header.set_session(joined.session());
  header.set_job_id(job);
  header.set_round(1);
  header.set_attempt(1);
  header.set_samples(10);
  TensorSet delta{NamedTensor{"w", {static_cast<int64_t>(values)}, std::vector<float>(values, 0.0f)}};
  wire::UpdateBytes bytes;
  wire::AppendUpdateSet(wire::kDeltaSet, delta, UpdateEncoding::kFloat32, 0, 1 << 20, &header, &bytes);
  wire::ForEachChunk(bytes, 1 << 20, [&](const v1::TensorChunk& chunk) {
    *update.add_chunks() = chunk;
    return Status::Ok();
  }).ok();
  return message;
}

TEST(TaskSessionTest, ASessionMustOpenFirst) {
  OneRound c(uint64_t{256} << 10);
  ASSERT_TRUE(c.coordinator);
  HandSession session(c.port(), "hand-1");
  ASSERT_TRUE(session.Send(UpdateOf(session.joined(), "job-1-abc", 4)));
  grpc::Status s = session.End();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("first message must be 'open'"), std::string::npos) << s.error_message();
}

// A session that never sends its first message counts as a stream of its caller and ends at
// the idle timeout: a caller cannot hold silent sessions outside the stream limits.
TEST(TaskSessionTest, ASessionThatNeverSpeaksCountsAsAStreamAndEndsAtTheIdleTimeout) {
  OneRound c(uint64_t{256} << 10, [](server::CoordinatorOptions& options) {
    options.streams.idle_timeout = std::chrono::milliseconds(500);
    options.streams.max_streams_per_caller = 4;
  });
  ASSERT_TRUE(c.coordinator);
  std::vector<std::unique_ptr<HandSession>> silent;
  for (int i = 0; i < 4; ++i) silent.push_back(std::make_unique<HandSession>(c.port(), "hand-1"));
  HandSession one_more(c.port(), "hand-1");  // the caller's four slots are taken by the silent four
  grpc::Status refused = one_more.End();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  for (auto& session : silent) {
    grpc::Status ended = session->End();
    EXPECT_EQ(ended.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << ended.error_message();
    EXPECT_NE(ended.error_message().find("task session (its first message)"), std::string::npos)
        << ended.error_message();
  }
}

// An update naming another worker, or an earlier session of this one (a worker that rejoined
// while it trained), is refused by a verdict and the session goes on: a worker whose session
// ended with PERMISSION_DENIED would stop for good.
TEST(TaskSessionTest, AnUpdateOfAnotherWorkerOrSessionIsRefusedAndTheSessionGoesOn) {
  OneRound c(uint64_t{256} << 10);
  ASSERT_TRUE(c.coordinator);
  HandSession session(c.port(), "hand-1");
  ASSERT_TRUE(session.Open());
  v1::JoinResponse other = session.joined();
  other.set_worker_id("someone-else");
  ASSERT_TRUE(session.Send(UpdateOf(other, "job-1-abc", 4)));
  auto verdict = session.NextVerdict();
  ASSERT_TRUE(verdict.has_value());
  EXPECT_FALSE(verdict->accepted());
  EXPECT_NE(verdict->reason().find("names worker 'someone-else'"), std::string::npos) << verdict->reason();
  other = session.joined();
  other.set_session("an-earlier-session");
  ASSERT_TRUE(session.Send(UpdateOf(other, "job-1-abc", 4)));
  verdict = session.NextVerdict();
  ASSERT_TRUE(verdict.has_value());
  EXPECT_FALSE(verdict->accepted());
  EXPECT_NE(verdict->reason().find("an earlier session"), std::string::npos) << verdict->reason();
  // Still open: the next update is judged on its merits (no such job).
  ASSERT_TRUE(session.Send(UpdateOf(session.joined(), "job-1-abc", 4)));
  verdict = session.NextVerdict();
  ASSERT_TRUE(verdict.has_value());
  EXPECT_NE(verdict->reason().find("not running"), std::string::npos) << verdict->reason();
}

// Refusals come back as verdicts, each naming its round, and the session goes on.
TEST(TaskSessionTest, RefusedUpdatesAreAnsweredByVerdictsAndTheSessionGoesOn) {
  OneRound c(8 << 10);
  ASSERT_TRUE(c.coordinator);
  HandSession session(c.port(), "hand-1");
  ASSERT_TRUE(session.Open());
  // No such job.
  ASSERT_TRUE(session.Send(UpdateOf(session.joined(), "job-1-abc", 4)));
  auto verdict = session.NextVerdict();
  ASSERT_TRUE(verdict.has_value());
  EXPECT_FALSE(verdict->accepted());
  EXPECT_EQ(verdict->job_id(), "job-1-abc");
  EXPECT_EQ(verdict->round(), 1u);
  EXPECT_NE(verdict->reason().find("not running"), std::string::npos) << verdict->reason();
  // Over the limit: 4,096 floats are 16 KiB against 8 KiB.
  ASSERT_TRUE(session.Send(UpdateOf(session.joined(), "job-1-abc", 4096)));
  verdict = session.NextVerdict();
  ASSERT_TRUE(verdict.has_value());
  EXPECT_FALSE(verdict->accepted());
  EXPECT_NE(verdict->reason().find("expected at most 8192"), std::string::npos) << verdict->reason();
  EXPECT_NE(verdict->reason().find("round 1"), std::string::npos) << verdict->reason();
  // Not an update at all.
  v1::TaskSessionMessage again;
  again.mutable_open()->set_worker_id(session.joined().worker_id());
  ASSERT_TRUE(session.Send(again));
  grpc::Status s = session.End();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
}

TEST(TaskSessionTest, ACoordinatorWithoutInlineUpdatesServesNoSessions) {
  OneRound c(0);
  ASSERT_TRUE(c.coordinator);
  HandSession session(c.port(), "hand-1");
  EXPECT_EQ(session.joined().inline_update_max_bytes(), 0u);
  session.Open();
  grpc::Status s = session.End();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << s.error_message();
  // The worker's client then holds a task channel and uploads by calls.
  Keeper worker(c.port(), "channel-worker");
  auto stub = JobStub(c.port());
  ASSERT_TRUE(WaitForWorkers(*stub, 1, std::chrono::seconds(20)));
}

}  // namespace
}  // namespace tessera::testing
