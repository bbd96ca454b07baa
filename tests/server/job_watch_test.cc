// WatchJob against a coordinator on a free loopback port: a round committed while a watch
// starts (between its read of the committed rounds and its first look at the live log) is
// sent, once; a from_round no round of the job can reach is refused, while the round after
// the last is where a watcher goes on; and the rounds of a job moved back to an older
// checkpoint are sent again as they are run again, after the rewind, whether the watch began
// before the job moved back or after.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "proto/record_bounds.h"
#include "proto/transport_security.h"
#include "server/coordinator.h"
#include "server/state/sqlite_state_store.h"
#include "server/strategy/strategy.h"
#include "tessera/v1/job_service.grpc.pb.h"
#include "tests/server/fake_worker.h"
#include "tests/server/job_runner_fixture.h"
#include "tests/server/stream_reader.h"
#include "tests/server/test_directory.h"

namespace tessera::server {
namespace {

constexpr auto kWait = std::chrono::seconds(60);

class JobWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDirectory("tessera-job-watch");
    options_ = LoopbackCoordinatorOptions(dir_, "job-watch");
  }
  void TearDown() override {
    for (auto& worker : workers_) worker->Stop();
    if (coordinator_) coordinator_->Shutdown();
    coordinator_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Start() {
    auto started = Coordinator::Start(options_);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    coordinator_ = std::move(started).value();
    jobs_ = v1::JobService::NewStub(*LoopbackAdminChannel(coordinator_->port(), options_.admin_token));
  }

  std::string Submit(const v1::JobSpec& spec) {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::SubmitJobResponse response;
    grpc::Status s = jobs_->SubmitJob(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.job().id();
  }

  // A watch of `job_id` from `from_round`, begun.
  std::unique_ptr<StreamReader<v1::JobEvent>> Watch(const std::string& job_id, uint32_t from_round) {
    auto watch = std::make_unique<StreamReader<v1::JobEvent>>();
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_from_round(from_round);
    jobs_->async()->WatchJob(watch->context(), &request, watch.get());
    watch->Begin();
    return watch;
  }

  // A worker that uploads for every task, joined to the coordinator.
  void AddWorker(const std::string& name, const std::string& job_id) {
    workers_.push_back(std::make_shared<FakeWorker>(
        &coordinator_->registry(), name, [](const v1::TrainTask&) { return FakeAction::Upload(); },
        [this, job_id] { return coordinator_->Runner(job_id); }));
    ASSERT_TRUE(workers_.back()->Start().ok());
  }

  // A job of 3 rounds stopped after its round 2 (run here to its end as a job of 2 rounds, its
  // row then edited as if the coordinator had stopped), round 2's checkpoint damaged: the
  // coordinator started next moves it back to round 1, and runs rounds 2 and 3 again.
  std::string StoppedWithItsNewestCheckpointDamaged() {
    Start();
    v1::JobSpec spec = JobRunnerFixture::SmallSpec(1, 1);
    spec.set_rounds(2);
    const std::string id = Submit(spec);
    EXPECT_FALSE(id.empty());
    AddWorker("w1", id);
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    auto runner = coordinator_->Runner(id);
    while (runner && !runner->finished() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(runner && runner->finished()) << "the job did not end";
    for (auto& worker : workers_) worker->Stop();
    workers_.clear();
    coordinator_->Shutdown();
    coordinator_.reset();
    auto store = SqliteStateStore::Open(dir_.string());
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    if (!store.ok()) return id;
    auto job = (*store)->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status().ToString();
    if (!job.ok()) return id;
    EXPECT_EQ(job->state(), v1::JOB_SUCCEEDED) << job->error();
    EXPECT_EQ(job->rounds_committed(), 2u);
    job->set_state(v1::JOB_RUNNING);
    job->mutable_spec()->set_rounds(3);
    EXPECT_TRUE((*store)->UpdateJob(*job).ok());
    std::ofstream(dir_ / "checkpoints" / (id + "-round-2.ckpt"), std::ios::trunc) << "TSRCKPT1 but nothing after";
    return id;
  }

  // What a watch sent of rounds and rewinds, in order: "round N", "back to K from N".
  static std::vector<std::string> RoundsAndRewinds(StreamReader<v1::JobEvent>& watch) {
    std::vector<std::string> sent;
    for (const auto& event : watch.received()) {
      if (event.has_round()) sent.push_back("round " + std::to_string(event.round().round()));
      if (event.has_rewind()) {
        sent.push_back("back to " + std::to_string(event.rewind().to_round()) + " from " +
                       std::to_string(event.rewind().from_round()));
        EXPECT_GT(event.rewind().at_unix_ms(), 0);
        EXPECT_NE(event.message().find("falling back to the checkpoint of round 1; rounds 2 to 2 will be run again"),
                  std::string::npos)
            << event.message();
      }
    }
    return sent;
  }

  std::filesystem::path dir_;
  CoordinatorOptions options_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::vector<std::shared_ptr<FakeWorker>> workers_;
};

// The job runs its only round and ends while the watch's first read of the store (it had no
// rounds yet) has returned and the watch has not yet looked at the live log; then the log is
// filled past its capacity, so that the round's event is no longer kept in it. A watch that
// took its place in the log only after the read would start past the round's event and never
// send the round; one placed before the read learns that the log dropped events it had not
// read, and reads the round from the store.
TEST_F(JobWatchTest, ARoundCommittedBetweenTheWatchsReadAndItsPlaceInTheLogIsSentOnce) {
  std::atomic<bool> ran{false};
  std::string job_id;
  // The job's own events, all dropped by the fillers: the watch started before any of them.
  size_t missed_events = 0, missed_notes = 0;
  options_.watch_page_read_hook = [this, &ran, &job_id, &missed_events, &missed_notes](const std::string& id) {
    if (id != job_id || ran.exchange(true)) return;
    AddWorker("w1", id);
    auto runner = coordinator_->Runner(id);
    ASSERT_NE(runner, nullptr);
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (!runner->finished() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(runner->finished()) << "the job did not end";
    for (size_t i = 0; i < runner->events().capacity(); ++i) {
      v1::JobEvent filler;
      filler.set_message("filler " + std::to_string(i));
      runner->events().Publish(std::move(filler));
    }
    missed_events = runner->events().OldestWithNotesDropped(&missed_notes);
  };
  Start();
  job_id = Submit(JobRunnerFixture::SmallSpec(1, 1));  // one round; no worker yet
  ASSERT_FALSE(job_id.empty());
  auto watch = Watch(job_id, 0);
  ASSERT_TRUE(watch->WaitDone(kWait));
  ASSERT_TRUE(ran.load()) << "the watch never read the store";
  EXPECT_TRUE(watch->status().ok()) << watch->status().error_message();
  auto job = coordinator_->GetJob(job_id);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_EQ(job->state(), v1::JOB_SUCCEEDED) << job->error();
  std::vector<uint32_t> rounds;
  for (const auto& event : watch->received()) {
    if (event.has_round()) rounds.push_back(event.round().round());
  }
  EXPECT_EQ(rounds, std::vector<uint32_t>{1}) << "the round committed as the watch started";
  // The watcher is told what it skipped: how many events, and how many notes among them (the
  // job's end among them).
  ASSERT_GE(missed_notes, 1u);
  const std::string told = "this watch fell " + std::to_string(missed_events) + " events behind";
  const std::string notes = "; " + std::to_string(missed_notes) + (missed_notes == 1 ? " note" : " notes") +
                            " and the progress among them are skipped";
  bool said = false;
  for (const auto& event : watch->received()) {
    if (event.message().rfind(told, 0) == 0) {
      said = true;
      EXPECT_NE(event.message().find(notes), std::string::npos) << event.message();
    }
  }
  EXPECT_TRUE(said) << "no note of the events skipped";
}

// A from_round past the round after the job's last is refused, naming the field, the value
// and the bound; the round after the last is where a watcher that saw every round goes on:
// the job's end (ended), or its next round (pending).
TEST_F(JobWatchTest, AFromRoundNoRoundOfTheJobReachesIsRefusedAndTheNextRoundIsWatched) {
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    v1::Job job;
    job.set_id("job-1-ended");
    *job.mutable_spec() = JobRunnerFixture::SmallSpec(1, 1);
    job.mutable_spec()->set_rounds(2);
    job.set_state(v1::JOB_RUNNING);
    ASSERT_TRUE((*store)->InsertJob(job).ok());
    const TensorSet model = {{"w", {2}, {1.0f, 2.0f}}};
    for (uint32_t r = 1; r <= 2; ++r) {
      v1::RoundRecord record;
      record.set_round(r);
      job.set_rounds_committed(r);
      *job.mutable_last_round() = record;
      if (r == 2) job.set_state(v1::JOB_SUCCEEDED);
      ASSERT_TRUE((*store)->CommitRound(job, record, model).ok());
    }
  }
  Start();
  for (const uint32_t from : {4u, 1000u, UINT32_MAX}) {
    auto refused = Watch("job-1-ended", from);
    ASSERT_TRUE(refused->WaitDone(kWait));
    EXPECT_EQ(refused->status().error_code(), grpc::StatusCode::INVALID_ARGUMENT) << from;
    EXPECT_EQ(refused->status().error_message(),
              "watch of job job-1-ended: field 'from_round': " + std::to_string(from) +
                  "; expected at most 3 (the job has 2 rounds; 0: from the first)");
    EXPECT_TRUE(refused->received().empty());
  }
  auto after_last = Watch("job-1-ended", 3);
  ASSERT_TRUE(after_last->WaitDone(kWait));
  EXPECT_TRUE(after_last->status().ok()) << after_last->status().error_message();
  ASSERT_EQ(after_last->received().size(), 1u);
  EXPECT_FALSE(after_last->received()[0].has_round());
  EXPECT_NE(after_last->received()[0].message().find("job job-1-ended succeeded"), std::string::npos)
      << after_last->received()[0].message();

  // A pending job of one round (no worker: it waits): its next round, and the one after it,
  // are watched live until it ends; two past its last is refused.
  const std::string pending = Submit(JobRunnerFixture::SmallSpec(1, 1));
  ASSERT_FALSE(pending.empty());
  auto too_far = Watch(pending, 3);
  ASSERT_TRUE(too_far->WaitDone(kWait));
  EXPECT_EQ(too_far->status().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto next = Watch(pending, 1);
  auto after = Watch(pending, 2);
  grpc::ClientContext ctx;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(pending);
  v1::CancelJobResponse cancelled;
  grpc::Status s = jobs_->CancelJob(&ctx, cancel, &cancelled);
  ASSERT_TRUE(s.ok()) << s.error_message();
  for (auto* watch : {next.get(), after.get()}) {
    ASSERT_TRUE(watch->WaitDone(kWait));
    EXPECT_TRUE(watch->status().ok()) << watch->status().error_message();
    ASSERT_FALSE(watch->received().empty());
    EXPECT_NE(watch->received().back().message().find("job " + pending + " cancelled"), std::string::npos)
        << watch->received().back().message();
  }
}

// A job whose stored row holds an error of a megabyte (written before the bound held, or by
// another build) is served within the bound by every door: GetJob (with and without its
// rounds), ListJobs, and the note a watch ends with; cut between characters, with "…".
TEST_F(JobWatchTest, AStoredJobsLongErrorIsServedCutEverywhere) {
  std::string error = "round 1 failed: worker said ";
  while (error.size() < (size_t{1} << 20)) error += "\xC3\xA9";  // é
  {
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    v1::Job job;
    job.set_id("job-1-failed");
    *job.mutable_spec() = JobRunnerFixture::SmallSpec(1, 1);
    job.set_state(v1::JOB_FAILED);
    job.set_error(error);
    ASSERT_TRUE((*store)->InsertJob(job).ok());
  }
  Start();
  const std::string ellipsis = "\xE2\x80\xA6";
  auto check = [&](const std::string& text, size_t bound, const std::string& what) {
    EXPECT_LE(text.size(), bound) << what;
    EXPECT_NE(text.find("round 1 failed: worker said \xC3\xA9"), std::string::npos) << what;
    ASSERT_GE(text.size(), ellipsis.size()) << what;
    EXPECT_EQ(text.substr(text.size() - ellipsis.size()), ellipsis) << what;
  };
  for (const bool rounds : {false, true}) {
    grpc::ClientContext ctx;
    v1::GetJobRequest request;
    request.set_job_id("job-1-failed");
    request.set_include_rounds(rounds);
    v1::GetJobResponse got;
    grpc::Status s = jobs_->GetJob(&ctx, request, &got);
    ASSERT_TRUE(s.ok()) << s.error_message();
    check(got.job().error(), wire::kMaxJobErrorBytes, rounds ? "GetJob with rounds" : "GetJob");
  }
  {
    grpc::ClientContext ctx;
    v1::ListJobsResponse listed;
    grpc::Status s = jobs_->ListJobs(&ctx, v1::ListJobsRequest(), &listed);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(listed.jobs_size(), 1);
    check(listed.jobs(0).error(), wire::kMaxJobErrorBytes, "ListJobs");
  }
  auto watch = Watch("job-1-failed", 0);
  ASSERT_TRUE(watch->WaitDone(kWait));
  EXPECT_TRUE(watch->status().ok()) << watch->status().error_message();
  ASSERT_FALSE(watch->received().empty());
  const v1::JobEvent end = watch->received().back();  // received() is a copy
  check(end.job().error(), wire::kMaxJobErrorBytes, "the watch's job");
  check(end.message(), wire::kMaxNoteBytes, "the watch's end");
}

// A watch that began before the job moved back (here from the first round, as its resume
// waits for the watch to have read the committed rounds) has sent rounds 1 and 2 as they were:
// it sends the rewind, then rounds 2 and 3 as they are run again, where it used to send only
// round 3 (round 2 taken for the one sent).
TEST_F(JobWatchTest, AWatchBegunBeforeTheJobMovedBackSendsTheRewindThenTheRoundsRunAgain) {
  const std::string id = StoppedWithItsNewestCheckpointDamaged();
  ASSERT_FALSE(HasFailure());
  std::mutex mu;
  std::condition_variable cv;
  bool read = false;
  options_.watch_page_read_hook = [&](const std::string&) {
    std::lock_guard<std::mutex> lock(mu);
    read = true;
    cv.notify_all();
  };
  options_.runner.strategy_factory = [&](const v1::JobSpec& spec, const TensorSet& global) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, kWait, [&] { return read; });
    return CreateStrategy(spec, global);
  };
  Start();
  auto watch = Watch(id, 0);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kWait, [&] { return read; })) << "the watch never read the store";
  }
  // Rounds 1 and 2, the damaged checkpoint's note and the rewind, before any round runs again.
  ASSERT_TRUE(watch->WaitForMessages(4, kWait));
  AddWorker("w1", id);
  ASSERT_TRUE(watch->WaitDone(kWait));
  EXPECT_TRUE(watch->status().ok()) << watch->status().error_message();
  EXPECT_EQ(RoundsAndRewinds(*watch),
            (std::vector<std::string>{"round 1", "round 2", "back to 1 from 2", "round 2", "round 3"}));
  auto job = coordinator_->GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->state(), v1::JOB_SUCCEEDED) << job->error();
}

// A watch that begins once the job has moved back and run its rounds again, from the round
// after the last its watcher showed before the restart (3): the rewind first, then every round
// after it, 2 and 3, each once, where it used to send only round 3; also once the live log has
// dropped the rewind.
TEST_F(JobWatchTest, AWatchBegunAfterTheJobMovedBackSendsTheRewindFirstThenTheRoundsRunAgain) {
  const std::string id = StoppedWithItsNewestCheckpointDamaged();
  ASSERT_FALSE(HasFailure());
  Start();
  AddWorker("w1", id);
  auto runner = coordinator_->Runner(id);
  ASSERT_NE(runner, nullptr);
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (!runner->finished() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(runner->finished()) << "the job did not end";
  auto watch = Watch(id, 3);
  ASSERT_TRUE(watch->WaitDone(kWait));
  EXPECT_TRUE(watch->status().ok()) << watch->status().error_message();
  EXPECT_EQ(RoundsAndRewinds(*watch), (std::vector<std::string>{"back to 1 from 2", "round 2", "round 3"}));
  ASSERT_FALSE(watch->received().empty());
  EXPECT_NE(watch->received().back().message().find("job " + id + " succeeded"), std::string::npos)
      << watch->received().back().message();

  // The same once the live log has dropped the rewind (it keeps its last 1,000 events): the log
  // keeps the rewinds it drops, and the watch sends it with its own job.
  for (size_t i = 0; i < runner->events().capacity(); ++i) {
    v1::JobEvent filler;
    filler.set_message("filler " + std::to_string(i));
    runner->events().Publish(std::move(filler));
  }
  auto late = Watch(id, 3);
  ASSERT_TRUE(late->WaitDone(kWait));
  EXPECT_TRUE(late->status().ok()) << late->status().error_message();
  EXPECT_EQ(RoundsAndRewinds(*late), (std::vector<std::string>{"back to 1 from 2", "round 2", "round 3"}));
  for (const auto& event : late->received()) {
    if (event.has_rewind()) EXPECT_EQ(event.job().id(), id);
  }
}

}  // namespace
}  // namespace tessera::server
