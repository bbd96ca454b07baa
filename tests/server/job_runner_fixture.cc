#include "job_runner_fixture.h"

namespace tessera::server {
namespace {

WorkerRegistryOptions RegistryOptions(const Clock* clock) {
  WorkerRegistryOptions options;
  options.clock = clock;
  return options;
}

}  // namespace

JobRunnerFixture::JobRunnerFixture() : registry_(RegistryOptions(&registry_clock_)) { options_.clock = &clock_; }

void JobRunnerFixture::TearDown() {
  for (auto& worker : workers_) worker->Stop();
  std::shared_ptr<JobRunner> runner = this->runner();
  if (runner) runner->Stop();
  registry_.Shutdown();
  std::lock_guard<std::mutex> lock(mu_);
  runner_.reset();
}

v1::JobSpec JobRunnerFixture::SmallSpec(uint32_t clients, uint32_t min_clients, uint32_t deadline_ms) {
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

FakeWorker& JobRunnerFixture::AddWorker(const std::string& name, FakeWorker::Script script) {
  auto worker = std::make_shared<FakeWorker>(&registry_, name, std::move(script), [this] { return runner(); });
  Status started = worker->Start();
  EXPECT_TRUE(started.ok()) << started.ToString();
  workers_.push_back(worker);
  return *worker;
}

FakeWorker::Script JobRunnerFixture::Always(FakeAction action) {
  return [action](const v1::TrainTask&) { return action; };
}

void JobRunnerFixture::Submit(const v1::JobSpec& spec) {
  v1::Job job;
  job.set_id(kJobId);
  *job.mutable_spec() = spec;
  job.set_state(v1::JOB_PENDING);
  ASSERT_TRUE(store_.InsertJob(job).ok());
  StartRunner(job);
}

void JobRunnerFixture::StartRunner(const v1::Job& job) {
  auto runner = std::make_shared<JobRunner>(job, &store_, &registry_, &rendezvous_, options_);
  {
    std::lock_guard<std::mutex> lock(events_mu_);
    events_.clear();
    ended_ = false;
  }
  auto seen = std::make_shared<size_t>(0);
  runner->events().Subscribe([this, seen, events = &runner->events()] {
    bool ended = false;
    std::lock_guard<std::mutex> lock(events_mu_);
    for (const auto& event : events->Since(*seen, &ended)) {
      ++*seen;
      if (event.has_progress()) {
        const auto& p = event.progress();
        std::string waiting;
        for (const auto& w : p.waiting_on()) waiting += " " + w;
        events_.push_back("progress: round " + std::to_string(p.round()) + " attempt " + std::to_string(p.attempt()) +
                          ": " + std::to_string(p.reported()) + "/" + std::to_string(p.selected()) +
                          " reported, waiting on" + waiting);
      } else if (event.has_round()) {
        events_.push_back("committed round " + std::to_string(event.round().round()) + ";");
      } else if (!event.message().empty()) {
        events_.push_back(event.message());
      }
    }
    ended_ = ended_ || ended;
    events_cv_.notify_all();
  });
  {
    std::lock_guard<std::mutex> lock(mu_);
    runner_ = runner;
  }
  runner->Start();
}

v1::Job JobRunnerFixture::AwaitEnd() {
  {
    std::unique_lock<std::mutex> lock(events_mu_);
    EXPECT_TRUE(events_cv_.wait_for(lock, kWaitLimit, [&] { return ended_; })) << "the job did not end";
  }
  std::shared_ptr<JobRunner> runner = this->runner();
  runner->Stop();  // joins the thread, which has finished the job
  EXPECT_TRUE(runner->finished());
  return runner->Snapshot();
}

v1::Job JobRunnerFixture::Run(const v1::JobSpec& spec) {
  Submit(spec);
  return AwaitEnd();
}

void JobRunnerFixture::StopRunner() { runner()->Stop(); }

std::shared_ptr<JobRunner> JobRunnerFixture::runner() {
  std::lock_guard<std::mutex> lock(mu_);
  return runner_;
}

bool JobRunnerFixture::AwaitRunnerWaiting() { return clock_.AwaitWaiters(1, kWaitLimit); }

bool JobRunnerFixture::AdvanceUntilEnded(std::chrono::milliseconds step) {
  const auto look = std::chrono::milliseconds(100);
  for (auto waited = std::chrono::milliseconds(0); waited < kWaitLimit; waited += look) {
    {
      std::unique_lock<std::mutex> lock(events_mu_);
      if (events_cv_.wait_for(lock, look, [&] { return ended_; })) return true;
    }
    if (clock_.AwaitWaiters(1, std::chrono::milliseconds(0))) clock_.Advance(step);
  }
  return false;
}

bool JobRunnerFixture::AwaitEvent(const std::string& text) {
  std::unique_lock<std::mutex> lock(events_mu_);
  return events_cv_.wait_for(lock, kWaitLimit, [&] {
    for (const auto& event : events_) {
      if (event.find(text) != std::string::npos) return true;
    }
    return false;
  });
}

std::string JobRunnerFixture::Events() {
  std::lock_guard<std::mutex> lock(events_mu_);
  std::string all;
  for (const auto& event : events_) all += event + "\n";
  return all;
}

v1::Job JobRunnerFixture::Stored() {
  auto job = store_.GetJob(kJobId);
  EXPECT_TRUE(job.ok()) << job.status().ToString();
  return job.ok() ? *job : v1::Job();
}

std::vector<v1::RoundRecord> JobRunnerFixture::Rounds() {
  auto rounds = store_.ListRounds(kJobId);
  EXPECT_TRUE(rounds.ok()) << rounds.status().ToString();
  return rounds.ok() ? *rounds : std::vector<v1::RoundRecord>();
}

v1::WorkerRoundReport JobRunnerFixture::ReportOf(const v1::RoundRecord& record, const std::string& worker) {
  for (const auto& report : record.workers()) {
    if (report.worker_id() == worker) return report;
  }
  v1::WorkerRoundReport absent;
  absent.set_outcome("absent");
  return absent;
}

}  // namespace tessera::server
