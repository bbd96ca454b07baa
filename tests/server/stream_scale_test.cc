// The coordinator's long-lived streams hold no thread while they wait: hundreds of task
// channels open at once keep its thread count far below one per channel, each still gets the
// task queued for it, and a cancel, a rejoin or a shutdown ends a channel as it did before.
// WatchJob follows a job's log live and ends with it, and sends a long history of committed
// rounds a page of the state store at a time.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "proto/transport_security.h"
#include "server/coordinator.h"
#include "server/state/sqlite_state_store.h"
#include "tessera/v1/job_service.grpc.pb.h"
#include "tessera/v1/worker_service.grpc.pb.h"
#include "tests/server/stream_reader.h"
#include "tests/server/test_directory.h"

namespace tessera::server {
namespace {

constexpr char kToken[] = "stream-test-token";
constexpr char kAdminToken[] = "stream-test-admin-token";
constexpr auto kWait = std::chrono::seconds(30);

size_t ProcessThreadCount() {
  size_t count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++count;
  return count;
}

using TaskReader = StreamReader<v1::Task>;

class StreamScaleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDirectory("tessera-streams");
    // Plaintext on loopback: hundreds of TLS handshakes would measure TLS.
    CoordinatorOptions options = LoopbackCoordinatorOptions(dir_, "streams-test");
    options.join_token = kToken;
    options.admin_token = kAdminToken;
    options.registry.heartbeat_timeout_ms = 600000;  // these workers never heartbeat
    options_ = options;
    StartCoordinator();
  }

  void StartCoordinator() {
    auto started = Coordinator::Start(options_);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    coordinator_ = std::move(started).value();
    wire::ClientTls plaintext;
    plaintext.insecure = true;
    channel_ = *wire::MakeChannel("127.0.0.1:" + std::to_string(coordinator_->port()), plaintext);
    workers_ = v1::WorkerService::NewStub(channel_);
    plaintext.admin_token = kAdminToken;  // operator calls carry the admin token
    jobs_ = v1::JobService::NewStub(*wire::MakeChannel("127.0.0.1:" + std::to_string(coordinator_->port()), plaintext));
  }

  void TearDown() override {
    if (coordinator_) coordinator_->Shutdown();
    for (auto& reader : readers_) EXPECT_TRUE(reader->WaitDone(kWait));
    readers_.clear();
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }

  v1::JoinResponse Join(const std::string& name) {
    v1::JoinRequest request;
    request.set_name(name);
    request.set_join_token(kToken);
    v1::JoinResponse response;
    grpc::ClientContext context;
    grpc::Status s = workers_->Join(&context, request, &response);
    EXPECT_TRUE(s.ok()) << name << ": " << s.error_message();
    return response;
  }

  TaskReader* OpenChannel(const v1::JoinResponse& joined) {
    readers_.push_back(std::make_unique<TaskReader>());
    TaskReader* reader = readers_.back().get();
    v1::TaskChannelRequest request;
    request.set_worker_id(joined.worker_id());
    request.set_session(joined.session());
    workers_->async()->OpenTaskChannel(reader->context(), &request, reader);
    reader->Begin();
    return reader;
  }

  bool WaitForReady(size_t count) {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (coordinator_->registry().ReadyWorkers().size() != count) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  static v1::Task CancelTask(const std::string& tag) {
    v1::Task task;
    task.mutable_cancel()->set_job_id(tag);
    return task;
  }

  std::filesystem::path dir_;
  CoordinatorOptions options_;
  std::unique_ptr<Coordinator> coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::vector<std::unique_ptr<TaskReader>> readers_;  // destroyed only once done
};

TEST_F(StreamScaleTest, TwoHundredOpenChannelsHoldNoThreadEach) {
  constexpr size_t kChannels = 200;
  std::vector<v1::JoinResponse> joined;
  for (size_t i = 0; i < kChannels; ++i) joined.push_back(Join("w" + std::to_string(i)));
  const size_t before = ProcessThreadCount();
  std::vector<TaskReader*> readers;
  for (const auto& j : joined) readers.push_back(OpenChannel(j));
  ASSERT_TRUE(WaitForReady(kChannels)) << coordinator_->registry().ReadyWorkers().size() << " of " << kChannels
                                       << " channels open";

  // Every channel is open and idle: the whole process (coordinator and clients) has a few
  // dozen threads at most, not one per stream.
  const size_t open = ProcessThreadCount();
  RecordProperty("threads_before", static_cast<int>(before));
  RecordProperty("threads_with_channels_open", static_cast<int>(open));
  EXPECT_LT(open, kChannels / 4) << "threads before the channels opened: " << before;

  for (size_t i = 0; i < kChannels; ++i) {
    ASSERT_TRUE(coordinator_->registry().Send(joined[i].worker_id(), CancelTask("for-" + joined[i].worker_id())).ok());
  }
  for (size_t i = 0; i < kChannels; ++i) {
    ASSERT_TRUE(readers[i]->WaitForMessages(1, kWait)) << "worker " << joined[i].worker_id() << " got no task";
    auto tasks = readers[i]->received();
    ASSERT_EQ(tasks.size(), 1u);
    EXPECT_EQ(tasks[0].cancel().job_id(), "for-" + joined[i].worker_id());
  }
  EXPECT_LT(ProcessThreadCount(), kChannels / 4);
  EXPECT_EQ(coordinator_->registry().ReadyWorkers().size(), kChannels);

  // Shutdown finishes every stream promptly, with OK as a superseded channel does.
  const auto start = std::chrono::steady_clock::now();
  coordinator_->Shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  for (auto* reader : readers) {
    ASSERT_TRUE(reader->WaitDone(kWait));
    EXPECT_TRUE(reader->status().ok()) << reader->status().error_message();
  }
}

TEST_F(StreamScaleTest, TasksArriveInOrderAndQueuedOnesAreSentOnOpen) {
  v1::JoinResponse joined = Join("ordered");
  ASSERT_TRUE(coordinator_->registry().Send("ordered", CancelTask("t0")).ok());  // before the channel opens
  TaskReader* reader = OpenChannel(joined);
  ASSERT_TRUE(WaitForReady(1));
  for (int i = 1; i < 50; ++i) {
    ASSERT_TRUE(coordinator_->registry().Send("ordered", CancelTask("t" + std::to_string(i))).ok());
  }
  ASSERT_TRUE(reader->WaitForMessages(50, kWait));
  auto tasks = reader->received();
  for (int i = 0; i < 50; ++i) EXPECT_EQ(tasks[i].cancel().job_id(), "t" + std::to_string(i));
}

TEST_F(StreamScaleTest, AWorkerThatGoesAwayLeavesTheReadySetAtOnce) {
  TaskReader* reader = OpenChannel(Join("leaver"));
  ASSERT_TRUE(WaitForReady(1));
  reader->context()->TryCancel();
  ASSERT_TRUE(reader->WaitDone(kWait));
  ASSERT_TRUE(WaitForReady(0));
  EXPECT_FALSE(coordinator_->registry().IsAlive("leaver"));
}

TEST_F(StreamScaleTest, ARejoinClosesTheOldChannelAndTheNewOneGetsTheTasks) {
  TaskReader* old_reader = OpenChannel(Join("rejoiner"));
  ASSERT_TRUE(WaitForReady(1));
  v1::JoinResponse again = Join("rejoiner");
  ASSERT_TRUE(old_reader->WaitDone(kWait));
  EXPECT_TRUE(old_reader->status().ok()) << old_reader->status().error_message();

  TaskReader* new_reader = OpenChannel(again);
  ASSERT_TRUE(WaitForReady(1));
  ASSERT_TRUE(coordinator_->registry().Send("rejoiner", CancelTask("after-rejoin")).ok());
  ASSERT_TRUE(new_reader->WaitForMessages(1, kWait));
  EXPECT_EQ(new_reader->received()[0].cancel().job_id(), "after-rejoin");
  EXPECT_TRUE(coordinator_->registry().IsAlive("rejoiner"));
}

TEST_F(StreamScaleTest, AChannelReopenedInTheSameSessionKeepsTheWorkerAlive) {
  // The worker opens a second channel without joining again (its first stream looked dead
  // to it). The first channel is closed by the second; its late close must not mark the
  // worker lost, and the second channel gets the tasks.
  v1::JoinResponse joined = Join("reopener");
  TaskReader* first = OpenChannel(joined);
  ASSERT_TRUE(WaitForReady(1));
  TaskReader* second = OpenChannel(joined);
  ASSERT_TRUE(first->WaitDone(kWait));
  EXPECT_TRUE(first->status().ok()) << first->status().error_message();
  ASSERT_TRUE(WaitForReady(1)) << "the worker left the ready set after its old channel closed";
  EXPECT_TRUE(coordinator_->registry().IsAlive("reopener"));
  ASSERT_TRUE(coordinator_->registry().Send("reopener", CancelTask("after-reopen")).ok());
  ASSERT_TRUE(second->WaitForMessages(1, kWait));
  EXPECT_EQ(second->received()[0].cancel().job_id(), "after-reopen");
}

TEST_F(StreamScaleTest, AStaleSessionIsRefused) {
  v1::JoinResponse first = Join("stale");
  Join("stale");
  TaskReader* reader = OpenChannel(first);
  ASSERT_TRUE(reader->WaitDone(kWait));
  EXPECT_EQ(reader->status().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(reader->received().empty());
}

// A job no worker will ever serve: it waits for workers (or fails if the dataset is absent).
v1::JobSpec LonelyJob() {
  v1::JobSpec spec;
  spec.set_name("lonely");
  spec.mutable_model()->set_name("mlp");
  spec.mutable_model()->add_hidden(8);
  spec.mutable_data()->set_dataset("fashion-mnist");
  spec.mutable_data()->set_max_train_samples(100);
  spec.mutable_data()->set_max_test_samples(100);
  spec.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_IID);
  spec.mutable_data()->mutable_partition()->set_parties(1);
  spec.set_strategy("fedavg");
  spec.set_rounds(1);
  spec.set_clients_per_round(1);
  spec.set_min_clients(1);
  spec.set_round_deadline_ms(60000);
  spec.set_local_epochs(1);
  spec.set_batch_size(8);
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_learning_rate(0.01);
  spec.set_max_round_attempts(1);
  return spec;
}

TEST_F(StreamScaleTest, WatchFollowsAJobLiveUntilItEnds) {
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = LonelyJob();
  v1::SubmitJobResponse submitted;
  {
    grpc::ClientContext context;
    grpc::Status s = jobs_->SubmitJob(&context, submit, &submitted);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const std::string job_id = submitted.job().id();
  StreamReader<v1::JobEvent> watch;
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  jobs_->async()->WatchJob(watch.context(), &request, &watch);
  watch.Begin();
  const bool ended_early = watch.WaitDone(std::chrono::milliseconds(300));
  auto job = coordinator_->GetJob(job_id);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  if (job->state() == v1::JOB_PENDING || job->state() == v1::JOB_RUNNING) {
    EXPECT_FALSE(ended_early) << "the watch of a job still waiting for workers ended";
  }

  v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id);
  v1::CancelJobResponse cancelled;
  grpc::ClientContext context;
  jobs_->CancelJob(&context, cancel, &cancelled);  // refused if the job already failed
  ASSERT_TRUE(watch.WaitDone(kWait));
  EXPECT_TRUE(watch.status().ok()) << watch.status().error_message();
  auto events = watch.received();
  ASSERT_FALSE(events.empty());
  EXPECT_NE(events.back().message().find("job " + job_id), std::string::npos) << events.back().message();

  // A watch of a job that has ended sends its end at once.
  StreamReader<v1::JobEvent> late;
  jobs_->async()->WatchJob(late.context(), &request, &late);
  late.Begin();
  ASSERT_TRUE(late.WaitDone(kWait));
  EXPECT_TRUE(late.status().ok()) << late.status().error_message();
  ASSERT_FALSE(late.received().empty());
  EXPECT_NE(late.received().back().message().find("job " + job_id), std::string::npos);
}

// A finished job of 12 rounds of 1,000 clients each: about 7 MiB of round records, more than
// the 4 MiB a watch reads from the state store at once.
TEST_F(StreamScaleTest, AWatchSendsEveryCommittedRoundInOrderAPageAtATimeThenTheEnd) {
  coordinator_->Shutdown();
  coordinator_.reset();
  const std::string job_id = "job-7-5eed00";
  constexpr uint32_t kRounds = 12;
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    v1::Job job;
    job.set_id(job_id);
    *job.mutable_spec() = LonelyJob();
    job.mutable_spec()->set_rounds(kRounds);
    job.set_state(v1::JOB_RUNNING);
    ASSERT_TRUE((*store)->InsertJob(job).ok());
    const TensorSet model = {{"w", {2}, {1.0f, 2.0f}}};
    size_t bytes = 0;
    for (uint32_t r = 1; r <= kRounds; ++r) {
      v1::RoundRecord record;
      record.set_round(r);
      for (int w = 0; w < 1000; ++w) {
        auto* report = record.add_workers();
        report->set_worker_id("worker-" + std::to_string(w) + "-" + std::string(600, 'x'));
      }
      bytes += record.ByteSizeLong();
      job.set_rounds_committed(r);
      *job.mutable_last_round() = record;  // as the runner commits it
      if (r == kRounds) job.set_state(v1::JOB_SUCCEEDED);
      ASSERT_TRUE((*store)->CommitRound(job, record, model).ok());
    }
    ASSERT_GT(bytes, size_t{6} << 20);
  }
  StartCoordinator();

  for (uint32_t from : {0u, 5u}) {
    StreamReader<v1::JobEvent> watch;
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_from_round(from);
    jobs_->async()->WatchJob(watch.context(), &request, &watch);
    watch.Begin();
    ASSERT_TRUE(watch.WaitDone(kWait));
    ASSERT_TRUE(watch.status().ok()) << watch.status().error_message();
    auto events = watch.received();
    const uint32_t first = from == 0 ? 1 : from;
    ASSERT_EQ(events.size(), kRounds - first + 2) << "from round " << from;
    for (uint32_t r = first; r <= kRounds; ++r) {
      const auto& event = events[r - first];
      ASSERT_TRUE(event.has_round());
      EXPECT_EQ(event.round().round(), r);
      EXPECT_EQ(event.round().workers_size(), 1000);
      EXPECT_EQ(event.job().id(), job_id);
      EXPECT_FALSE(event.job().has_last_round()) << "round " << r << " carries its record twice";
    }
    EXPECT_FALSE(events.back().has_round());
    EXPECT_NE(events.back().message().find("job " + job_id + " succeeded"), std::string::npos)
        << events.back().message();
  }
}

TEST_F(StreamScaleTest, WatchingAnUnknownJobIsNotFound) {
  StreamReader<v1::JobEvent> watch;
  v1::WatchJobRequest request;
  request.set_job_id("job-404-none");
  jobs_->async()->WatchJob(watch.context(), &request, &watch);
  watch.Begin();
  ASSERT_TRUE(watch.WaitDone(kWait));
  EXPECT_EQ(watch.status().error_code(), grpc::StatusCode::NOT_FOUND) << watch.status().error_message();
}

}  // namespace
}  // namespace tessera::server
