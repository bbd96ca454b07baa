// Robust aggregation under attack, measured: real federated jobs on Fashion-MNIST, run by a
// JobRunner with in-process workers that really train (TrainLocal) on their party's share.
// Two of the ten clients are Byzantine: they train like the others, then send their update
// multiplied by -10. With the sample-weighted mean the global model is pushed uphill and its
// test accuracy collapses; with the coordinate-wise median, the trimmed mean and Krum it
// stays where honest training takes it, and so it does when FedAdam applies the median.
//
// The attack lives here, in the test's workers: the shipped worker has no such switch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <functional>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>

#include "core/data/idx.h"
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "device/registry.h"
#include "proto/job_mapping.h"
#include "proto/tensor_transfer.h"
#include "server/jobs/job_runner.h"
#include "server/state/sqlite_state_store.h"
#include "tests/server/test_directory.h"

namespace tessera::server {
namespace {

// What a Byzantine client does to the update it trained honestly.
using Attack = std::function<void(TensorSet* delta)>;

void SignFlipTimesTen(TensorSet* delta) {
  for (auto& t : *delta) {
    for (auto& v : t.values) v *= -10.0f;
  }
}

// The training split, loaded once for every worker of every test.
const Dataset* TrainingSet() {
  static const Dataset* data = [] {
    auto loaded = LoadFashionMnist(kDefaultFashionMnistDir, /*train=*/true);
    return loaded.ok() ? new Dataset(std::move(loaded).value()) : nullptr;
  }();
  return data;
}

// An in-process worker that trains each task on its party's share, as tessera-worker does,
// and uploads the change to the global model (transformed by `attack` when it has one).
// Trainings take turns on one lock: the test measures accuracy, not speed, and two cores
// are shared with other work.
class TrainingWorker final : public TaskChannelSink, public std::enable_shared_from_this<TrainingWorker> {
 public:
  TrainingWorker(WorkerRegistry* registry, std::string name, Attack attack, std::mutex* training)
      : registry_(registry), name_(std::move(name)), attack_(std::move(attack)), training_(training) {}
  ~TrainingWorker() override { Stop(); }

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
      if (!task->has_train()) continue;
      lock.unlock();
      Status done = Train(task->train());
      EXPECT_TRUE(done.ok()) << name_ << ": " << done.ToString();
      lock.lock();
    }
  }

  Status Train(const v1::TrainTask& task) {
    std::shared_ptr<JobRunner> runner = runner_();
    ASSIGN_OR_RETURN(auto model_version, runner->Model(task.model_version()));
    const TensorSet& global = model_version->tensors();
    const Dataset& data = *TrainingSet();
    ASSIGN_OR_RETURN(auto parties, wire::PartitionTrainingSet(task.spec(), data.labels));
    if (task.party_index() >= parties.size()) return InternalError("no party " + std::to_string(task.party_index()));
    const std::vector<int64_t>& indices = parties[task.party_index()];
    TensorSet delta;
    TrainReport report;
    {
      std::lock_guard<std::mutex> lock(*training_);
      ASSIGN_OR_RETURN(auto device, CreateDevice("cpu"));
      ASSIGN_OR_RETURN(auto model, CreateModel(wire::ToModelConfig(task.spec()), device.get()));
      RETURN_IF_ERROR(model->SetState(global));
      ASSIGN_OR_RETURN(report, TrainLocal(*model, data, indices,
                                          wire::ToTrainOptions(task.spec(), task.round(), task.party_index())));
      delta = model->GetState().value();
    }
    delta = DeltaFrom(std::move(delta), global);
    if (attack_) attack_(&delta);
    v1::UpdateHeader header;
    header.set_worker_id(name_);
    header.set_job_id(task.job_id());
    header.set_round(task.round());
    header.set_attempt(task.attempt());
    header.set_base_model_version(task.model_version());
    header.set_samples(indices.size());
    header.set_compute_ms(report.compute_ms);
    header.set_train_loss(report.mean_loss);
    *header.mutable_manifest() = wire::BuildManifest(delta);
    RETURN_IF_ERROR(runner->AdmitUpload(header));
    return runner->SubmitUpdate(header, delta, 1);
  }

  WorkerRegistry* registry_;
  const std::string name_;
  const Attack attack_;
  std::mutex* training_;
  std::function<std::shared_ptr<JobRunner>()> runner_;
  uint64_t generation_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
  std::thread heartbeat_;
};

// Ten IID parties of 600 images, an MLP with one hidden layer of 64, one local epoch a round,
// every client in every round.
v1::JobSpec AttackedJobSpec(const std::string& strategy, const std::string& rule) {
  v1::JobSpec spec;
  spec.set_name("byzantine");
  spec.mutable_model()->set_name("mlp");
  spec.mutable_model()->add_hidden(64);
  spec.mutable_data()->set_dataset("fashion-mnist");
  spec.mutable_data()->set_max_train_samples(6000);
  spec.mutable_data()->set_max_test_samples(2000);
  spec.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_IID);
  spec.mutable_data()->mutable_partition()->set_parties(10);
  spec.mutable_data()->mutable_partition()->set_seed(5);
  spec.set_strategy(strategy);
  spec.mutable_aggregation()->set_rule(rule);
  spec.set_rounds(5);
  spec.set_clients_per_round(10);
  spec.set_min_clients(10);
  spec.set_round_deadline_ms(600000);
  spec.set_local_epochs(1);
  spec.set_batch_size(32);
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_learning_rate(0.05);
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.set_seed(3);
  spec.set_max_round_attempts(1);
  // The norm bound is not what this test is about: as the mean diverges, the attackers'
  // updates grow past the default bound of 1000 and would be refused by it.
  spec.set_max_update_norm(wire::kMaxUpdateNormLimit);
  return spec;
}

class ByzantineJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (TrainingSet() == nullptr) GTEST_SKIP() << "Fashion-MNIST is not in " << kDefaultFashionMnistDir;
    dir_ = FreshTestDirectory("tessera-byzantine");
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

  // Runs `spec` with eight honest workers and `attackers` (w9, w10) applying `attack`;
  // returns the test accuracy after each committed round.
  std::vector<double> Run(const v1::JobSpec& spec, int attackers, const Attack& attack) {
    for (int i = 1; i <= 10; ++i) {
      const bool byzantine = i > 10 - attackers;
      workers_.push_back(std::make_shared<TrainingWorker>(&registry_, "w" + std::to_string(i),
                                                          byzantine ? attack : Attack(), &training_));
      workers_.back()->Start([this] {
        std::lock_guard<std::mutex> lock(mu_);
        return runner_;
      });
    }
    v1::Job job;
    job.set_id("byzantine-job");
    *job.mutable_spec() = spec;
    job.set_state(v1::JOB_PENDING);
    EXPECT_TRUE(store_->InsertJob(job).ok());
    JobRunnerOptions options;
    options.worker_wait_timeout = std::chrono::seconds(30);
    {
      std::lock_guard<std::mutex> lock(mu_);
      runner_ = std::make_shared<JobRunner>(job, store_.get(), &registry_, &rendezvous_, options);
    }
    runner_->Start();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    while (!runner_->finished() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(runner_->finished()) << "the job did not end";
    const v1::Job ended = runner_->Snapshot();
    EXPECT_EQ(ended.state(), v1::JOB_SUCCEEDED) << ended.error();
    std::vector<double> accuracy;
    auto rounds = store_->ListRounds(job.id());
    EXPECT_TRUE(rounds.ok());
    if (!rounds.ok()) return accuracy;
    for (const auto& r : *rounds) {
      accuracy.push_back(r.test_accuracy());
      EXPECT_EQ(r.clients_reported(), 10u) << "round " << r.round() << ": every update, the attackers' too, is accepted";
    }
    EXPECT_EQ(accuracy.size(), spec.rounds());
    std::string rule = spec.aggregation().rule();
    if (rule == "krum") {
      rule += " (f " + std::to_string(spec.aggregation().byzantine_clients()) + ", m " +
              std::to_string(spec.aggregation().selected()) + ")";
    }
    std::cout << "  " << spec.strategy() << " + " << rule << ", " << attackers
              << " of 10 clients sending -10 x their update: test accuracy by round";
    for (double a : accuracy) std::cout << " " << a;
    std::cout << "\n";
    return accuracy;
  }

  std::filesystem::path dir_;
  std::unique_ptr<StateStore> store_;
  WorkerRegistry registry_{WorkerRegistryOptions{}};
  RendezvousStore rendezvous_;
  std::mutex training_;
  std::mutex mu_;
  std::shared_ptr<JobRunner> runner_;
  std::vector<std::shared_ptr<TrainingWorker>> workers_;
};

// The controls: honest clients alone learn, and the attack breaks the plain mean.
TEST_F(ByzantineJobTest, TheMeanLearnsFromHonestClients) {
  const std::vector<double> accuracy = Run(AttackedJobSpec("fedavg", "mean"), 0, nullptr);
  ASSERT_EQ(accuracy.size(), 5u);
  EXPECT_GE(accuracy.back(), 0.75);
}

TEST_F(ByzantineJobTest, TheMeanCollapsesUnderTheAttack) {
  const std::vector<double> accuracy = Run(AttackedJobSpec("fedavg", "mean"), 2, SignFlipTimesTen);
  ASSERT_EQ(accuracy.size(), 5u);
  EXPECT_LE(accuracy.back(), 0.3) << "two clients' -10 x updates did not break the mean: the test shows nothing";
}

struct RobustCase {
  std::string name;
  std::string strategy;
  std::string rule;
  uint32_t byzantine_clients = 0;
  uint32_t selected = 0;
  double trim_fraction = 0;
};

// How gtest (and so ctest) shows a case: its name, not its bytes.
void PrintTo(const RobustCase& c, std::ostream* out) { *out << c.name; }

class RobustRuleUnderAttackTest : public ByzantineJobTest, public ::testing::WithParamInterface<RobustCase> {};

TEST_P(RobustRuleUnderAttackTest, KeepsTheAccuracyOfHonestTraining) {
  const RobustCase& c = GetParam();
  v1::JobSpec spec = AttackedJobSpec(c.strategy, c.rule);
  spec.mutable_aggregation()->set_byzantine_clients(c.byzantine_clients);
  spec.mutable_aggregation()->set_selected(c.selected);
  spec.mutable_aggregation()->set_trim_fraction(c.trim_fraction);
  ASSERT_TRUE(wire::ValidateJobSpec(spec).ok()) << wire::ValidateJobSpec(spec).ToString();
  const std::vector<double> accuracy = Run(spec, 2, SignFlipTimesTen);
  ASSERT_EQ(accuracy.size(), 5u);
  // Honest training reaches about 0.80 after five rounds; the attacked mean about 0.10.
  EXPECT_GE(accuracy.back(), 0.70);
}

INSTANTIATE_TEST_SUITE_P(
    Rules, RobustRuleUnderAttackTest,
    ::testing::Values(RobustCase{"median", "fedavg", "median"},
                      RobustCase{"trimmed_mean", "fedavg", "trimmed-mean", 0, 0, 0.2},
                      RobustCase{"krum", "fedavg", "krum", 2, 1},
                      RobustCase{"multi_krum", "fedavg", "krum", 2, 6},
                      RobustCase{"fedadam_median", "fedadam", "median"}),
    [](const ::testing::TestParamInfo<RobustCase>& info) { return info.param.name; });

}  // namespace
}  // namespace tessera::server
