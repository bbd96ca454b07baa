// The round driver without gRPC: a JobRunner over a real state store and worker registry,
// with scripted in-process workers in place of the network. Each fake worker holds a task
// channel (a TaskChannelSink) and answers its tasks by its script: train and upload, stay
// silent, or report that it cannot train. Retries, deadline cancels with their attempt,
// failures and stopping mid-round are checked on what the runner records.
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <functional>
#include <mutex>
#include <thread>

#include "proto/tensor_transfer.h"
#include "server/job_runner.h"
#include "server/selection.h"
#include "server/sqlite_state_store.h"

namespace tessera::server {
namespace {

v1::JobSpec SmallSpec(uint32_t clients, uint32_t min_clients, uint32_t deadline_ms) {
  v1::JobSpec spec;
  spec.set_name("runner");
  spec.mutable_model()->set_name("mlp");
  spec.mutable_model()->add_hidden(8);
  spec.mutable_data()->set_dataset("fashion-mnist");
  spec.mutable_data()->set_max_test_samples(200);
  spec.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_IID);
  spec.mutable_data()->mutable_partition()->set_parties(clients);
  spec.set_strategy("fedavg");
  spec.set_rounds(1);
  spec.set_clients_per_round(clients);
  spec.set_min_clients(min_clients);
  spec.set_round_deadline_ms(deadline_ms);
  spec.set_local_epochs(1);
  spec.set_batch_size(16);
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_learning_rate(0.01);
  spec.set_seed(7);
  spec.set_max_round_attempts(3);
  return spec;
}

enum class Answer { kUpload, kSilent, kFail };

// An in-process worker: joined to the registry, its task channel a sink whose tasks a thread
// of its own answers, as a real worker's trainer would.
class FakeWorker final : public TaskChannelSink, public std::enable_shared_from_this<FakeWorker> {
 public:
  using Script = std::function<Answer(const v1::TrainTask&)>;
  // Changes what an uploading worker sends (a hostile one); its refusal is then expected.
  using Tamper = std::function<void(const v1::TrainTask&, v1::UpdateHeader*, TensorSet*)>;

  FakeWorker(WorkerRegistry* registry, std::string name, Script script, Tamper tamper = nullptr)
      : registry_(registry), name_(std::move(name)), script_(std::move(script)), tamper_(std::move(tamper)) {}
  ~FakeWorker() override { Stop(); }

  void Start(std::function<std::shared_ptr<JobRunner>()> runner) {
    runner_ = std::move(runner);
    v1::JoinRequest join;
    join.set_name(name_);
    auto joined = registry_->Join(join);
    ASSERT_TRUE(joined.ok()) << joined.status().ToString();
    generation_ = registry_->Generation(name_);
    ASSERT_TRUE(registry_->OpenChannel(name_, generation_, shared_from_this()).ok());
    thread_ = std::thread([this] { Loop(); });
    heartbeat_ = std::thread([this, session = joined->session()] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!stop_) {
        lock.unlock();
        registry_->Heartbeat(name_, session, "idle").ok();
        lock.lock();
        cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop_; });
      }
    });
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  void TasksQueued() override { cv_.notify_all(); }
  void Superseded() override {}

  std::vector<v1::Task> received() {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      bool closed = false;
      std::optional<v1::Task> task = registry_->TakeTask(name_, generation_, &closed);
      if (!task) {
        cv_.wait_for(lock, std::chrono::milliseconds(50));
        continue;
      }
      received_.push_back(*task);
      if (!task->has_train()) continue;
      lock.unlock();
      Respond(task->train());
      lock.lock();
    }
  }

  void Respond(const v1::TrainTask& task) {
    const auto answer = script_(task);
    if (answer == Answer::kSilent) return;
    auto runner = runner_();
    v1::UpdateHeader header;
    header.set_worker_id(name_);
    header.set_job_id(task.job_id());
    header.set_round(task.round());
    header.set_attempt(task.attempt());
    header.set_base_model_version(task.model_version());
    if (answer == Answer::kFail) {
      header.set_failure("scripted: the device is gone");
      EXPECT_TRUE(runner->ReportFailure(header).ok());
      return;
    }
    auto model = runner->Model(task.model_version());
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    TensorSet delta = (*model)->tensors();
    for (auto& t : delta) std::fill(t.values.begin(), t.values.end(), 0.001f);
    header.set_samples(100);
    header.set_compute_ms(1);
    if (tamper_) tamper_(task, &header, &delta);
    *header.mutable_manifest() = wire::BuildManifest(delta);
    Status admitted = runner->AdmitUpload(header);
    if (!admitted.ok()) {
      EXPECT_TRUE(tamper_) << admitted.ToString();
      runner->RejectUpload(header, admitted);
      return;
    }
    Status submitted = runner->SubmitUpdate(header, delta, 1);
    EXPECT_TRUE(submitted.ok() || tamper_) << submitted.ToString();
  }

  WorkerRegistry* registry_;
  const std::string name_;
  const Script script_;
  const Tamper tamper_;
  std::function<std::shared_ptr<JobRunner>()> runner_;
  uint64_t generation_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<v1::Task> received_;
  std::thread thread_;
  std::thread heartbeat_;
};

class JobRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tessera-runner-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    auto store = SqliteStateStore::Open(dir_.string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
  }
  void TearDown() override {
    for (auto& w : workers_) w->Stop();
    if (runner_) runner_->Stop();
    registry_.Shutdown();
    runner_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  void AddWorker(const std::string& name, FakeWorker::Script script, FakeWorker::Tamper tamper = nullptr) {
    workers_.push_back(std::make_shared<FakeWorker>(&registry_, name, std::move(script), std::move(tamper)));
    workers_.back()->Start([this] {
      std::lock_guard<std::mutex> lock(mu_);
      return runner_;
    });
  }

  // Submits the job and waits until it ends (or kWait).
  v1::Job Run(const v1::JobSpec& spec) {
    v1::Job job;
    job.set_id("job-1-test");
    *job.mutable_spec() = spec;
    job.set_state(v1::JOB_PENDING);
    EXPECT_TRUE(store_->InsertJob(job).ok());
    return RunStored(job);
  }

  // Runs `job` as stored (a new one, or one resumed) until it ends.
  v1::Job RunStored(const v1::Job& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      runner_ = std::make_shared<JobRunner>(job, store_.get(), &registry_, &rendezvous_, options_);
    }
    events_.clear();
    auto seen = std::make_shared<size_t>(0);
    runner_->events().Subscribe([this, seen, events = &runner_->events()] {
      bool ended = false;
      std::lock_guard<std::mutex> lock(events_mu_);
      for (const auto& event : events->Since(*seen, &ended)) {
        ++*seen;
        if (event.has_progress()) {
          const auto& p = event.progress();
          std::string waiting;
          for (const auto& w : p.waiting_on()) waiting += " " + w;
          events_.push_back("progress: round " + std::to_string(p.round()) + " attempt " +
                            std::to_string(p.attempt()) + ": " + std::to_string(p.reported()) + "/" +
                            std::to_string(p.selected()) + " reported, waiting on" + waiting);
        } else {
          events_.push_back(event.message());
        }
      }
    });
    runner_->Start();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!runner_->finished() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(runner_->finished()) << "the job did not end";
    return runner_->Snapshot();
  }

  // The notes the job published, in order, joined by newlines.
  std::string Events() {
    std::lock_guard<std::mutex> lock(events_mu_);
    std::string all;
    for (const auto& message : events_) all += message + "\n";
    return all;
  }

  std::vector<v1::RoundRecord> Rounds() {
    auto rounds = store_->ListRounds("job-1-test");
    EXPECT_TRUE(rounds.ok());
    return rounds.ok() ? *rounds : std::vector<v1::RoundRecord>();
  }

  std::filesystem::path dir_;
  std::unique_ptr<StateStore> store_;
  WorkerRegistry registry_{WorkerRegistryOptions{}};
  RendezvousStore rendezvous_;
  std::mutex mu_;
  std::shared_ptr<JobRunner> runner_;
  std::vector<std::shared_ptr<FakeWorker>> workers_;
  JobRunnerOptions options_ = [] {
    JobRunnerOptions options;
    options.worker_wait_timeout = std::chrono::seconds(30);
    return options;
  }();
  std::mutex events_mu_;
  std::vector<std::string> events_;
};

TEST_F(JobRunnerTest, ARoundShortOfClientsIsRetriedAndTheStragglerIsCancelledForThatAttemptOnly) {
  AddWorker("w1", [](const v1::TrainTask&) { return Answer::kUpload; });
  AddWorker("w2", [](const v1::TrainTask&) { return Answer::kUpload; });
  // w3 misses attempt 1's deadline and answers attempt 2.
  AddWorker("w3", [](const v1::TrainTask& t) { return t.attempt() == 1 ? Answer::kSilent : Answer::kUpload; });
  v1::Job job = Run(SmallSpec(3, 3, 400));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].attempt(), 2u);
  EXPECT_EQ(rounds[0].clients_reported(), 3u);
  bool cancelled_attempt_1 = false;
  for (const auto& task : workers_[2]->received()) {
    if (!task.has_cancel()) continue;
    EXPECT_EQ(task.cancel().round(), 1u);
    EXPECT_EQ(task.cancel().attempt(), 1u) << "a cancel must name the attempt it ends";
    cancelled_attempt_1 = true;
  }
  EXPECT_TRUE(cancelled_attempt_1);
  for (const auto& task : workers_[0]->received()) EXPECT_FALSE(task.has_cancel()) << "w1 reported in time";
}

TEST_F(JobRunnerTest, AFinishedJobReleasesItsModel) {
  // The model the job served while it ran, watched without being held.
  std::mutex held_mu;
  std::weak_ptr<const ModelVersion> held;
  bool seen = false;
  AddWorker("w1", [&](const v1::TrainTask& t) {
    std::shared_ptr<JobRunner> runner;
    {
      std::lock_guard<std::mutex> lock(mu_);
      runner = runner_;
    }
    if (auto model = runner->Model(t.model_version()); model.ok()) {
      std::lock_guard<std::mutex> lock(held_mu);
      held = *model;
      seen = true;
    }
    return Answer::kUpload;
  });
  v1::Job job = Run(SmallSpec(1, 1, 600000));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  std::lock_guard<std::mutex> lock(held_mu);
  ASSERT_TRUE(seen) << "the worker never saw the job's model";
  EXPECT_TRUE(held.expired()) << "the finished job still holds the model it served";
  EXPECT_EQ(runner_->Model(1).status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(JobRunnerTest, WatchersAreToldWhoARoundIsWaitingFor) {
  AddWorker("w1", [](const v1::TrainTask&) { return Answer::kUpload; });
  AddWorker("w2", [](const v1::TrainTask&) { return Answer::kSilent; });
  // min_clients 1: the round waits for w2 until its deadline, then commits without it.
  v1::Job job = Run(SmallSpec(2, 1, 4000));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  EXPECT_NE(Events().find("progress: round 1 attempt 1: 1/2 reported, waiting on w2\n"), std::string::npos)
      << Events();
}

TEST_F(JobRunnerTest, AWorkerThatCannotTrainIsDroppedWithItsReason) {
  AddWorker("w1", [](const v1::TrainTask&) { return Answer::kUpload; });
  AddWorker("w2", [](const v1::TrainTask&) { return Answer::kUpload; });
  AddWorker("w3", [](const v1::TrainTask&) { return Answer::kFail; });
  v1::Job job = Run(SmallSpec(3, 2, 600000));  // the round cannot have waited for its deadline
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].clients_reported(), 2u);
  bool failed = false;
  for (const auto& w : rounds[0].workers()) {
    if (w.worker_id() == "w3") failed = w.outcome().find("scripted: the device is gone") != std::string::npos;
  }
  EXPECT_TRUE(failed);
}

TEST_F(JobRunnerTest, TooFewClientsEveryAttemptFailsTheJobNamingTheRound) {
  AddWorker("w1", [](const v1::TrainTask&) { return Answer::kUpload; });
  AddWorker("w2", [](const v1::TrainTask&) { return Answer::kSilent; });
  v1::JobSpec spec = SmallSpec(2, 2, 200);
  spec.set_max_round_attempts(2);
  v1::Job job = Run(spec);
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_NE(job.error().find("round 1 failed after 2 attempt(s)"), std::string::npos) << job.error();
  EXPECT_NE(job.error().find("min_clients is 2"), std::string::npos) << job.error();
}

TEST_F(JobRunnerTest, StoppingMidRoundLeavesTheJobResumable) {
  AddWorker("w1", [](const v1::TrainTask&) { return Answer::kSilent; });
  v1::Job job;
  job.set_id("job-1-test");
  *job.mutable_spec() = SmallSpec(1, 1, 600000);
  job.set_state(v1::JOB_PENDING);
  ASSERT_TRUE(store_->InsertJob(job).ok());
  {
    std::lock_guard<std::mutex> lock(mu_);
    runner_ = std::make_shared<JobRunner>(job, store_.get(), &registry_, &rendezvous_, JobRunnerOptions{});
  }
  runner_->Start();
  // Wait until the task is out, then stop the coordinator's side mid-round.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (workers_[0]->received().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(workers_[0]->received().empty());
  runner_->Stop();
  auto stored = store_->GetJob("job-1-test");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->state(), v1::JOB_RUNNING) << "a stopped coordinator resumes the job; it must not end it";
  EXPECT_EQ(stored->rounds_committed(), 0u);
}

TEST_F(JobRunnerTest, ASampleCountLargerThanThePartyIsRefusedAndTheModelIsNotSkewed) {
  AddWorker("w1", [](const v1::TrainTask&) { return Answer::kUpload; });
  // 2^64-1 samples: once this wrapped the round's weight sum and skewed the mean.
  AddWorker("w2", [](const v1::TrainTask&) { return Answer::kUpload; },
            [](const v1::TrainTask&, v1::UpdateHeader* header, TensorSet*) {
              header->set_samples(std::numeric_limits<uint64_t>::max());
            });
  v1::JobSpec spec = SmallSpec(2, 1, 600000);
  spec.mutable_data()->set_max_train_samples(600);  // two IID parties of 300
  v1::Job job = Run(spec);
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].clients_reported(), 1u);
  for (const auto& w : rounds[0].workers()) {
    if (w.worker_id() != "w2") continue;
    EXPECT_NE(w.outcome().find("field 'samples': expected at most 300 (the size of party"), std::string::npos)
        << w.outcome();
    EXPECT_NE(w.outcome().find("got 18446744073709551615"), std::string::npos) << w.outcome();
  }
  EXPECT_NE(Events().find("refused update from worker 'w2'"), std::string::npos) << Events();
}

TEST_F(JobRunnerTest, AnUpdateBeyondTheNormBoundIsRefusedAndTheJobGoesOn) {
  AddWorker("w1", [](const v1::TrainTask&) { return Answer::kUpload; });
  // Finite values of 1e38: one participant could overflow the aggregate and end the job.
  AddWorker("w2", [](const v1::TrainTask&) { return Answer::kUpload; },
            [](const v1::TrainTask&, v1::UpdateHeader*, TensorSet* delta) {
              for (auto& t : *delta) std::fill(t.values.begin(), t.values.end(), 1e38f);
            });
  v1::Job job = Run(SmallSpec(2, 1, 600000));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].clients_reported(), 1u);
  for (const auto& w : rounds[0].workers()) {
    if (w.worker_id() == "w2") {
      EXPECT_NE(w.outcome().find("exceeds the job's max_update_norm 1000"), std::string::npos) << w.outcome();
    } else {
      EXPECT_EQ(w.outcome(), "accepted");
      EXPECT_GT(w.update_norm(), 0);
    }
  }
}

// FedAvg whose step is amplified 1e38-fold: what an honest
// client sends stays finite; a large update overflows the model.
class AmplifiedFedAvg final : public Strategy {
 public:
  explicit AmplifiedFedAvg(std::unique_ptr<Strategy> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return "amplified-fedavg"; }
  Status Restore(TensorSet state) override { return inner_->Restore(std::move(state)); }
  const TensorSet& state() const override { return inner_->state(); }
  std::unique_ptr<RoundAggregate> BeginRound(const TensorSet& global) const override {
    return inner_->BeginRound(global);
  }
  Result<StrategyStep> Finish(const TensorSet& global, const RoundAggregate& aggregate) const override {
    ASSIGN_OR_RETURN(StrategyStep step, inner_->Finish(global, aggregate));
    for (size_t i = 0; i < step.model.size(); ++i) {
      for (size_t j = 0; j < step.model[i].values.size(); ++j) {
        const float g = global[i].values[j];
        step.model[i].values[j] = g + (step.model[i].values[j] - g) * 1e38f;
      }
    }
    return step;
  }
  void Adopt(TensorSet state) override { inner_->Adopt(std::move(state)); }

 private:
  std::unique_ptr<Strategy> inner_;
};

TEST_F(JobRunnerTest, AModelThatIsNotFiniteIsNeverCommittedAndTheRoundIsRetriedWithoutItsCause) {
  options_.strategy_factory = [](const v1::JobSpec& spec, const TensorSet& layout) -> Result<std::unique_ptr<Strategy>> {
    ASSIGN_OR_RETURN(auto inner, CreateStrategy(spec, layout));
    return std::unique_ptr<Strategy>(new AmplifiedFedAvg(std::move(inner)));
  };
  AddWorker("w1", [](const v1::TrainTask&) { return Answer::kUpload; },
            [](const v1::TrainTask&, v1::UpdateHeader*, TensorSet* delta) {
              for (auto& t : *delta) std::fill(t.values.begin(), t.values.end(), 1e-6f);
            });
  // Within the norm bound (6,370 values of 10: norm about 800), but amplified past float.
  AddWorker("w2", [](const v1::TrainTask&) { return Answer::kUpload; },
            [](const v1::TrainTask&, v1::UpdateHeader*, TensorSet* delta) {
              for (auto& t : *delta) std::fill(t.values.begin(), t.values.end(), 10.0f);
            });
  v1::Job job = Run(SmallSpec(2, 1, 600000));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].attempt(), 2u);
  ASSERT_EQ(rounds[0].workers_size(), 1);
  EXPECT_EQ(rounds[0].workers(0).worker_id(), "w1");
  const std::string events = Events();
  EXPECT_NE(events.find("round 1 attempt 1: the aggregated model"), std::string::npos) << events;
  EXPECT_NE(events.find("not committed; left out of the round's next attempts: worker 'w2' (the largest update"),
            std::string::npos)
      << events;
  auto model = store_->LoadCheckpoint("job-1-test", 1);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_TRUE(CheckFinite(*model, "committed model").ok());
}

TEST_F(JobRunnerTest, AnExceptionInTheJobsThreadEndsTheJobFailedDurably) {
  options_.strategy_factory = [](const v1::JobSpec&, const TensorSet&) -> Result<std::unique_ptr<Strategy>> {
    throw std::runtime_error("scripted: the strategy cannot be made");
  };
  v1::Job job = Run(SmallSpec(1, 1, 600000));
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_NE(job.error().find("scripted: the strategy cannot be made"), std::string::npos) << job.error();
  // Stored as failed: a restart does not resume it into the same exception.
  auto stored = store_->GetJob("job-1-test");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->state(), v1::JOB_FAILED);
  EXPECT_NE(stored->error().find("internal error in the job's thread"), std::string::npos) << stored->error();
}

TEST_F(JobRunnerTest, ASpecStoredBeforeTodaysLimitsEndsFailedWhenResumed) {
  v1::Job job;
  job.set_id("job-1-test");
  *job.mutable_spec() = SmallSpec(1, 1, 600000);
  job.mutable_spec()->mutable_model()->set_hidden(0, 600000);  // once an uncaught std::bad_alloc
  job.set_state(v1::JOB_RUNNING);
  ASSERT_TRUE(store_->InsertJob(job).ok());
  v1::Job ended = RunStored(job);
  EXPECT_EQ(ended.state(), v1::JOB_FAILED);
  EXPECT_NE(ended.error().find("spec.model.hidden[0]: expected an integer in [1, 65536], got 600000"),
            std::string::npos)
      << ended.error();
  EXPECT_EQ(store_->GetJob("job-1-test")->state(), v1::JOB_FAILED);
}

TEST_F(JobRunnerTest, ADamagedNewestCheckpointFallsBackToTheOneBeforeAndItsRoundsRunAgain) {
  AddWorker("w1", [](const v1::TrainTask&) { return Answer::kUpload; });
  v1::JobSpec spec = SmallSpec(1, 1, 600000);
  spec.set_rounds(2);
  ASSERT_EQ(Run(spec).state(), v1::JOB_SUCCEEDED);
  runner_->Stop();
  // As if the coordinator had stopped after round 2 of 3, and round 2's file were damaged.
  auto stored = store_->GetJob("job-1-test");
  ASSERT_TRUE(stored.ok());
  stored->set_state(v1::JOB_RUNNING);
  stored->mutable_spec()->set_rounds(3);
  ASSERT_TRUE(store_->UpdateJob(*stored).ok());
  const auto damaged = dir_ / "checkpoints" / "job-1-test-round-2.ckpt";
  std::ofstream(damaged, std::ios::trunc) << "not a checkpoint";
  v1::Job resumed = RunStored(*stored);
  ASSERT_EQ(resumed.state(), v1::JOB_SUCCEEDED) << resumed.error();
  EXPECT_EQ(resumed.rounds_committed(), 3u);
  const std::string events = Events();
  EXPECT_NE(events.find("checkpoint not usable: " + damaged.string()), std::string::npos) << events;
  EXPECT_NE(events.find("falling back to the checkpoint of round 1; rounds 2 to 2 will be run again"), std::string::npos)
      << events;
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 3u);
  for (uint32_t r = 1; r <= 3; ++r) EXPECT_EQ(rounds[r - 1].round(), r);
}

TEST(SelectionTest, RandomSelectionIsReproducibleAndSeatsAreStable) {
  std::vector<Client> candidates;
  for (int i = 0; i < 10; ++i) candidates.push_back({"w" + std::to_string(i), "", static_cast<uint32_t>(i), {}});
  v1::JobSpec spec;
  spec.set_seed(3);
  spec.set_clients_per_round(4);
  RandomSelection policy;
  auto a = policy.Choose(candidates, spec, 5, 1);
  auto b = policy.Choose(candidates, spec, 5, 1);
  ASSERT_EQ(a.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].seat, b[i].seat);
  for (size_t i = 1; i < a.size(); ++i) EXPECT_LT(a[i - 1].seat, a[i].seat);  // sorted by seat
}

}  // namespace
}  // namespace tessera::server
