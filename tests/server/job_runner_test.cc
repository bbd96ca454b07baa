// The round driver's job lifecycle (JobRunnerFixture: FakeWorkers, a MemoryStateStore, time
// on a ManualClock): what a round records of each worker, refused updates, the job's end
// and its release of memory, watchers' progress, resuming from a damaged checkpoint.
// Retries, selection, deadlines, stopping and store failures have files of their own
// (round_retry_test.cc, selection_test.cc, round_deadline_test.cc, runner_shutdown_test.cc,
// runner_state_failure_test.cc).
#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <memory>
#include <stdexcept>

#include "core/model/model.h"
#include "device/cpu/factory.h"
#include "job_runner_fixture.h"
#include "proto/job_mapping.h"
#include "server/strategy/strategy.h"

namespace tessera::server {
namespace {

using std::chrono::milliseconds;

class JobRunnerTest : public JobRunnerFixture {};

TEST_F(JobRunnerTest, TheCommittedModelIsTheSampleWeightedMeanOfTheAcceptedUpdates) {
  AddWorker("w1", Always(FakeAction::Upload(0.1f).WithSamples(100)));
  AddWorker("w2", Always(FakeAction::Upload(0.3f).WithSamples(300)));
  v1::Job job = Run(SmallSpec(2, 2));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto initial = store_.LoadCheckpoint(kJobId, 0);
  auto model = store_.LoadCheckpoint(kJobId, 1);
  ASSERT_TRUE(initial.ok() && model.ok());
  ASSERT_EQ(model->size(), initial->size());
  for (size_t i = 0; i < model->size(); ++i) {
    for (size_t j = 0; j < (*model)[i].values.size(); ++j) {
      // (0.1 * 100 + 0.3 * 300) / 400
      ASSERT_NEAR((*model)[i].values[j], (*initial)[i].values[j] + 0.25f, 1e-6) << (*model)[i].name;
    }
  }
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].clients_reported(), 2u);
  EXPECT_EQ(ReportOf(rounds[0], "w1").outcome(), "accepted");
  EXPECT_EQ(ReportOf(rounds[0], "w2").samples(), 300u);
}

// Thrown after an update was folded, as the round counts it (here by the test's hook): the
// update stays accepted, its worker is told so, and the round's record keeps its report and
// counts it.
TEST_F(JobRunnerTest, AnExceptionAfterAnUpdateIsFoldedKeepsItsReportInTheRoundsRecord) {
  auto thrown = std::make_shared<std::atomic<bool>>(false);
  options_.round_folded_hook = [thrown] {
    if (!thrown->exchange(true)) throw std::runtime_error("no memory left (test)");
  };
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Upload(0.1f).WithSamples(100)));
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::Upload(0.1f).WithSamples(300)));
  v1::Job job = Run(SmallSpec(2, 2));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  EXPECT_TRUE(thrown->load());
  for (FakeWorker* w : {&w1, &w2}) {
    ASSERT_EQ(w->turns().size(), 1u) << w->name();
    ASSERT_TRUE(w->turns()[0].verdict.has_value()) << w->name();
    EXPECT_TRUE(w->turns()[0].verdict->ok()) << w->name() << ": " << w->turns()[0].verdict->ToString();
  }
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].clients_reported(), 2u);
  EXPECT_EQ(ReportOf(rounds[0], "w1").outcome(), "accepted");
  EXPECT_EQ(ReportOf(rounds[0], "w2").outcome(), "accepted");
  EXPECT_EQ(ReportOf(rounds[0], "w1").samples(), 100u);
  EXPECT_EQ(ReportOf(rounds[0], "w2").samples(), 300u);
}

// A synchronous round's tasks offer to take trained models (TrainTask.takes_trained_weights);
// one sent so is folded as its delta from the round's model.
TEST_F(JobRunnerTest, ATrainedModelIsFoldedAsItsDelta) {
  AddWorker("w1", Always(FakeAction::Upload(0.1f).WithSamples(100)));
  FakeAction trained;
  trained.delta = [](const TensorSet& global) {
    TensorSet model = global;
    for (NamedTensor& t : model) {
      for (float& v : t.values) v += 0.3f;
    }
    return model;
  };
  trained.samples = 300;
  trained.WithTamper([](v1::UpdateHeader* h, TensorSet*) { h->set_trained_weights(true); });
  FakeWorker& w2 = AddWorker("w2", Always(trained));
  v1::Job job = Run(SmallSpec(2, 2));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  ASSERT_FALSE(w2.received().empty());
  EXPECT_TRUE(w2.received().front().train().takes_trained_weights());
  auto initial = store_.LoadCheckpoint(kJobId, 0);
  auto model = store_.LoadCheckpoint(kJobId, 1);
  ASSERT_TRUE(initial.ok() && model.ok());
  for (size_t i = 0; i < model->size(); ++i) {
    for (size_t j = 0; j < (*model)[i].values.size(); ++j) {
      // (0.1 * 100 + ((x + 0.3) - x) * 300) / 400
      ASSERT_NEAR((*model)[i].values[j], (*initial)[i].values[j] + 0.25f, 1e-6) << (*model)[i].name;
    }
  }
  EXPECT_EQ(ReportOf(Rounds()[0], "w2").outcome(), "accepted");
}

// A job whose model travels compressed takes deltas only: its workers train from the model as
// they decoded it, which the coordinator does not hold, so it cannot subtract it from a trained
// model. Its tasks do not offer to take one, and one sent anyway is refused.
TEST_F(JobRunnerTest, AJobWhoseModelTravelsCompressedTakesDeltasOnly) {
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Upload(0.1f)));
  FakeAction trained;
  trained.delta = [](const TensorSet& global) { return global; };
  trained.WithTamper([](v1::UpdateHeader* h, TensorSet*) { h->set_trained_weights(true); });
  FakeWorker& w2 = AddWorker("w2", Always(trained));
  v1::JobSpec spec = SmallSpec(2, 1);
  spec.mutable_compression()->set_download(v1::ENCODING_FLOAT16);
  v1::Job job = Run(spec);
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  ASSERT_FALSE(w1.received().empty());
  EXPECT_FALSE(w1.received().front().train().takes_trained_weights());
  ASSERT_EQ(w2.turns().size(), 1u);
  EXPECT_EQ(w2.turns()[0].admitted->code(), StatusCode::kInvalidArgument);
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].clients_reported(), 1u);
  const std::string outcome = ReportOf(rounds[0], "w2").outcome();
  EXPECT_NE(outcome.find("field 'trained_weights': this job's model travels in float16"), std::string::npos) << outcome;
}

TEST_F(JobRunnerTest, AFinishedJobReleasesItsModel) {
  // The model the job served while it ran, watched without being held.
  std::mutex held_mu;
  std::weak_ptr<const ModelVersion> held;
  bool seen = false;
  FakeWorker& w1 = AddWorker("w1", [&](const v1::TrainTask& t) {
    if (auto model = runner()->Model(t.model_version()); model.ok()) {
      std::lock_guard<std::mutex> lock(held_mu);
      held = *model;
      seen = true;
    }
    return FakeAction::Upload();
  });
  v1::Job job = Run(SmallSpec(1, 1));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  // The fake worker's thread holds the model it uploaded against until its turn returns,
  // which can be after the job has ended: it is joined first.
  w1.Stop();
  std::lock_guard<std::mutex> lock(held_mu);
  ASSERT_TRUE(seen) << "the worker never saw the job's model";
  EXPECT_TRUE(held.expired()) << "the finished job still holds the model it served";
  EXPECT_EQ(runner()->Model(1).status().code(), StatusCode::kFailedPrecondition);
}

// The workers that trained for a job are told when it ends, by a cancel of round 0 (no task
// has it), so that they let go of its data; a worker that never had a task of it is not.
TEST_F(JobRunnerTest, TheWorkersOfAnEndedJobAreToldItEnded) {
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Upload()));
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::Upload()));
  v1::Job job = Run(SmallSpec(1, 1));  // one client a round: one of the two trains
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto ended = [](const std::vector<v1::Task>& received) {
    bool trained = false, told = false;
    for (const auto& task : received) {
      trained |= task.has_train();
      if (task.has_cancel() && task.cancel().round() == 0) {
        told = task.cancel().job_id() == kJobId && task.cancel().attempt() == 0 &&
               task.cancel().reason() == "the job succeeded";
      }
    }
    return std::pair{trained, told};
  };
  for (FakeWorker* w : {&w1, &w2}) {
    if (!ended(w->received()).first) continue;
    EXPECT_TRUE(w->Await([&](const std::vector<v1::Task>& received, const std::vector<FakeTurn>&) {
      return ended(received).second;
    })) << w->name() << " trained for the job and was not told it ended";
  }
  for (FakeWorker* w : {&w1, &w2}) {
    const auto [trained, told] = ended(w->received());
    EXPECT_EQ(told, trained) << w->name();
  }
}

TEST_F(JobRunnerTest, WatchersAreToldWhoARoundIsWaitingFor) {
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::Upload()));
  AddWorker("w2", Always(FakeAction::Hang()));
  // min_clients 1: the round waits for w2 until its deadline, then commits without it.
  Submit(SmallSpec(2, 1, 60000));
  ASSERT_TRUE(w1.AwaitFinished(1, 1));
  // Progress is told once a worker has reported and a second has passed.
  ASSERT_TRUE(AwaitRunnerWaiting());
  clock_.Advance(milliseconds(1000));
  ASSERT_TRUE(AwaitEvent("progress: round 1 attempt 1: 1/2 reported, waiting on w2")) << Events();
  clock_.Advance(milliseconds(60000));
  v1::Job job = AwaitEnd();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
}

TEST_F(JobRunnerTest, AWorkerThatCannotTrainIsDroppedWithItsReason) {
  AddWorker("w1", Always(FakeAction::Upload()));
  AddWorker("w2", Always(FakeAction::Upload()));
  FakeWorker& w3 = AddWorker("w3", Always(FakeAction::Fail("scripted: the device is gone")));
  // The clock never moves: the round closes because everyone reported, not at its deadline.
  v1::Job job = Run(SmallSpec(3, 2));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].clients_reported(), 2u);
  EXPECT_EQ(ReportOf(rounds[0], "w3").outcome(), "failed: scripted: the device is gone");
  ASSERT_EQ(w3.turns().size(), 1u);
  EXPECT_TRUE(w3.turns()[0].verdict->ok());
  EXPECT_TRUE(w3.cancels().empty()) << "a worker that reported is not cancelled";
}

TEST_F(JobRunnerTest, AMalformedManifestIsRefusedBeforeItsTensorsAndTheRoundGoesOn) {
  AddWorker("w1", Always(FakeAction::Upload()));
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::MalformedManifest()));
  v1::Job job = Run(SmallSpec(2, 1));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  ASSERT_EQ(w2.turns().size(), 1u);
  EXPECT_EQ(w2.turns()[0].admitted->code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(w2.turns()[0].verdict.has_value()) << "nothing may be submitted after a refused header";
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].clients_reported(), 1u);
  const std::string outcome = ReportOf(rounds[0], "w2").outcome();
  EXPECT_EQ(outcome.rfind("rejected: update from worker 'w2' for job job-1-test round 1: tensor", 0), 0u) << outcome;
  EXPECT_NE(outcome.find("expected shape"), std::string::npos) << outcome;
}

TEST_F(JobRunnerTest, ASampleCountLargerThanThePartyIsRefusedAndTheModelIsNotSkewed) {
  AddWorker("w1", Always(FakeAction::Upload()));
  // 2^64-1 samples: once this wrapped the round's weight sum and skewed the mean.
  AddWorker("w2", Always(FakeAction::Upload().WithSamples(std::numeric_limits<uint64_t>::max())));
  v1::JobSpec spec = SmallSpec(2, 1);
  spec.mutable_data()->set_max_train_samples(600);  // two IID parties of 300
  v1::Job job = Run(spec);
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].clients_reported(), 1u);
  const std::string outcome = ReportOf(rounds[0], "w2").outcome();
  EXPECT_NE(outcome.find("field 'samples': expected at most 300 (the size of party"), std::string::npos) << outcome;
  EXPECT_NE(outcome.find("got 18446744073709551615"), std::string::npos) << outcome;
  EXPECT_NE(Events().find("refused update from worker 'w2'"), std::string::npos) << Events();
}

TEST_F(JobRunnerTest, AnUpdateBeyondTheNormBoundIsRefusedAndTheJobGoesOn) {
  AddWorker("w1", Always(FakeAction::Upload()));
  // Finite values of 1e38: one participant could overflow the aggregate and end the job.
  AddWorker("w2", Always(FakeAction::Upload(1e38f)));
  v1::Job job = Run(SmallSpec(2, 1));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].clients_reported(), 1u);
  EXPECT_NE(ReportOf(rounds[0], "w2").outcome().find("exceeds the job's max_update_norm 1000"), std::string::npos)
      << ReportOf(rounds[0], "w2").outcome();
  EXPECT_EQ(ReportOf(rounds[0], "w1").outcome(), "accepted");
  EXPECT_GT(ReportOf(rounds[0], "w1").update_norm(), 0);
}

// A resumed job's deadline-aware selection learns from every committed round (within its byte
// budget), not only the newest hundred: a client measured too slow in round 5 of 150 is not
// taken for a client never timed (which would be tried first) after a restart.
TEST_F(JobRunnerTest, AResumedJobsSelectionRemembersAClientLastTimedLongAgo) {
  v1::JobSpec spec = SmallSpec(1, 1);
  spec.mutable_data()->mutable_partition()->set_parties(2);
  spec.mutable_selection()->set_policy("deadline");
  spec.mutable_selection()->set_over_selection(0);  // one client a round, no spare
  spec.set_rounds(151);
  v1::Job job;
  job.set_id(kJobId);
  *job.mutable_spec() = spec;
  job.set_state(v1::JOB_RUNNING);
  ASSERT_TRUE(store_.InsertJob(job).ok());
  auto device = CreateCpuDevice();
  auto model = CreateModel(wire::ToModelConfig(spec), device.get());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const TensorSet weights = (*model)->GetState().value();
  ASSERT_TRUE(store_.SaveInitialModel(kJobId, weights).ok());
  auto accepted = [](const std::string& worker, double ms) {
    v1::WorkerRoundReport w;
    w.set_worker_id(worker);
    w.set_outcome("accepted");
    w.set_reported_ms(ms);
    w.set_samples(10);
    return w;
  };
  for (uint32_t round = 1; round <= 150; ++round) {
    v1::RoundRecord record;
    record.set_job_id(kJobId);
    record.set_round(round);
    // "slow" took 90 s against the 60 s deadline once, in round 5; "fast" 1 s every round.
    if (round == 5) *record.add_workers() = accepted("slow", 90000);
    *record.add_workers() = accepted("fast", 1000);
    job.set_rounds_committed(round);
    *job.mutable_last_round() = record;
    ASSERT_TRUE(store_.CommitRound(job, record, weights).ok());
  }
  FakeWorker& fast = AddWorker("fast", Always(FakeAction::Upload(0.1f)));
  FakeWorker& slow = AddWorker("slow", Always(FakeAction::Upload(0.1f)));
  StartRunner(job);
  v1::Job ended = AwaitEnd();
  EXPECT_EQ(ended.state(), v1::JOB_SUCCEEDED) << ended.error();
  EXPECT_EQ(ended.rounds_committed(), 151u);
  EXPECT_EQ(fast.turns().size(), 1u);
  EXPECT_TRUE(slow.turns().empty()) << "the slow client was taken for one never timed";
}

// A committed round of a strategy that keeps state wrote it beside the model. A checkpoint
// without it (its tensors cut out, with the manifest: the file still loads) is refused,
// naming the job, the round and the state expected, instead of restarting the momentum.
TEST_F(JobRunnerTest, AResumedCheckpointWithoutItsStrategysStateIsRefusedNamingIt) {
  AddWorker("w1", Always(FakeAction::Upload(0.1f)));
  v1::JobSpec spec = SmallSpec(1, 1);
  spec.set_strategy("fedavgm");
  spec.mutable_server()->set_learning_rate(1.0);
  spec.mutable_server()->set_momentum(0.9);
  ASSERT_EQ(Run(spec).state(), v1::JOB_SUCCEEDED);
  auto tensors = store_.LoadCheckpoint(kJobId, 1);
  ASSERT_TRUE(tensors.ok()) << tensors.status().ToString();
  TensorSet state;
  const TensorSet model = SplitModelAndState(std::move(tensors).value(), &state);
  ASSERT_FALSE(state.empty()) << "fedavgm keeps its momentum in the checkpoint";
  v1::Job stored = Stored();
  ASSERT_TRUE(store_.CommitRound(stored, Rounds().back(), model).ok());
  stored.set_state(v1::JOB_RUNNING);
  stored.mutable_spec()->set_rounds(2);
  ASSERT_TRUE(store_.UpdateJob(stored).ok());
  StartRunner(stored);
  const v1::Job ended = AwaitEnd();
  EXPECT_EQ(ended.state(), v1::JOB_FAILED);
  EXPECT_NE(ended.error().find("job job-1-test checkpoint of round 1: it holds no fedavgm state"), std::string::npos)
      << ended.error();
  EXPECT_EQ(ended.rounds_committed(), 1u);
}

// A checkpoint file checks its tensors against its own manifest only: round 1's model put in
// place of round 2's loads. The round's record names its model by its hash, and the resume
// is refused, naming the job, the round and both hashes.
TEST_F(JobRunnerTest, AResumedCheckpointHoldingAnotherRoundsModelIsRefusedNamingIt) {
  AddWorker("w1", Always(FakeAction::Upload(0.1f)));
  v1::JobSpec spec = SmallSpec(1, 1);
  spec.set_rounds(2);
  ASSERT_EQ(Run(spec).state(), v1::JOB_SUCCEEDED);
  auto first = store_.LoadCheckpoint(kJobId, 1);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  v1::Job stored = Stored();
  const v1::RoundRecord second = Rounds().back();
  ASSERT_EQ(second.round(), 2u);
  ASSERT_FALSE(second.model_sha256().empty());
  ASSERT_TRUE(store_.CommitRound(stored, second, *first).ok());
  stored.set_state(v1::JOB_RUNNING);
  stored.mutable_spec()->set_rounds(3);
  ASSERT_TRUE(store_.UpdateJob(stored).ok());
  StartRunner(stored);
  const v1::Job ended = AwaitEnd();
  EXPECT_EQ(ended.state(), v1::JOB_FAILED);
  EXPECT_NE(ended.error().find("job job-1-test checkpoint of round 2: its model's SHA-256 is "), std::string::npos)
      << ended.error();
  EXPECT_NE(ended.error().find("expected '" + second.model_sha256() + "', the round record's field 'model_sha256'"),
            std::string::npos)
      << ended.error();
  EXPECT_EQ(ended.rounds_committed(), 2u);
}

TEST_F(JobRunnerTest, AnExceptionInTheJobsThreadEndsTheJobFailedDurably) {
  options_.strategy_factory = [](const v1::JobSpec&, const TensorSet&) -> Result<std::unique_ptr<Strategy>> {
    throw std::runtime_error("scripted: the strategy cannot be made");
  };
  v1::Job job = Run(SmallSpec(1, 1));
  EXPECT_EQ(job.state(), v1::JOB_FAILED);
  EXPECT_NE(job.error().find("scripted: the strategy cannot be made"), std::string::npos) << job.error();
  // Stored as failed: a restart does not resume it into the same exception.
  EXPECT_EQ(Stored().state(), v1::JOB_FAILED);
  EXPECT_NE(Stored().error().find("internal error in the job's thread"), std::string::npos) << Stored().error();
}

TEST_F(JobRunnerTest, ASpecStoredBeforeTodaysLimitsEndsFailedWhenResumed) {
  v1::Job job;
  job.set_id(kJobId);
  *job.mutable_spec() = SmallSpec(1, 1);
  job.mutable_spec()->mutable_model()->set_hidden(0, 600000);  // once an uncaught std::bad_alloc
  job.set_state(v1::JOB_RUNNING);
  ASSERT_TRUE(store_.InsertJob(job).ok());
  StartRunner(job);
  v1::Job ended = AwaitEnd();
  EXPECT_EQ(ended.state(), v1::JOB_FAILED);
  EXPECT_NE(ended.error().find("spec.model.hidden[0]: expected an integer in [1, 65536], got 600000"),
            std::string::npos)
      << ended.error();
  EXPECT_EQ(Stored().state(), v1::JOB_FAILED);
}

TEST_F(JobRunnerTest, ADamagedNewestCheckpointFallsBackToTheOneBeforeAndItsRoundsRunAgain) {
  AddWorker("w1", Always(FakeAction::UploadRandom(/*seed=*/1)));
  v1::JobSpec spec = SmallSpec(1, 1);
  spec.set_rounds(2);
  ASSERT_EQ(Run(spec).state(), v1::JOB_SUCCEEDED);
  // As if the coordinator had stopped after round 2 of 3, and round 2's checkpoint were damaged.
  v1::Job stored = Stored();
  stored.set_state(v1::JOB_RUNNING);
  stored.mutable_spec()->set_rounds(3);
  ASSERT_TRUE(store_.UpdateJob(stored).ok());
  ASSERT_TRUE(store_.DamageCheckpoint(kJobId, 2));
  StartRunner(stored);
  v1::Job resumed = AwaitEnd();
  ASSERT_EQ(resumed.state(), v1::JOB_SUCCEEDED) << resumed.error();
  EXPECT_EQ(resumed.rounds_committed(), 3u);
  const std::string events = Events();
  EXPECT_NE(events.find("checkpoint not usable: memory checkpoint of job job-1-test round 2"), std::string::npos)
      << events;
  EXPECT_NE(events.find("falling back to the checkpoint of round 1; rounds 2 to 2 will be run again"), std::string::npos)
      << events;
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 3u);
  for (uint32_t r = 1; r <= 3; ++r) EXPECT_EQ(rounds[r - 1].round(), r);
}


// The older checkpoint a resume falls back to is checked (its model against its round's
// record) before the job is moved back: one refused ends the job FAILED with the rounds after
// it still recorded, as they were, not deleted for a fallback that did not happen.
TEST_F(JobRunnerTest, AFallbackRefusedKeepsTheRoundsItWouldHaveRunAgain) {
  AddWorker("w1", Always(FakeAction::UploadRandom(/*seed=*/1)));
  v1::JobSpec spec = SmallSpec(1, 1);
  spec.set_rounds(2);
  ASSERT_EQ(Run(spec).state(), v1::JOB_SUCCEEDED);
  // As if the coordinator had stopped after round 2 of 3, round 2's checkpoint damaged and
  // round 1's holding another model (the initial one) than its record names.
  auto initial = store_.LoadCheckpoint(kJobId, 0);
  ASSERT_TRUE(initial.ok()) << initial.status().ToString();
  const std::vector<v1::RoundRecord> before = Rounds();
  ASSERT_EQ(before.size(), 2u);
  v1::Job stored = Stored();
  stored.set_state(v1::JOB_RUNNING);
  stored.mutable_spec()->set_rounds(3);
  ASSERT_TRUE(store_.CommitRound(stored, before[0], *initial).ok());  // the row still at round 2
  ASSERT_TRUE(store_.DamageCheckpoint(kJobId, 2));
  StartRunner(stored);
  const v1::Job ended = AwaitEnd();
  EXPECT_EQ(ended.state(), v1::JOB_FAILED);
  EXPECT_NE(ended.error().find("job job-1-test checkpoint of round 1: its model's SHA-256 is "), std::string::npos)
      << ended.error();
  EXPECT_EQ(ended.rounds_committed(), 2u);
  EXPECT_EQ(Stored().rounds_committed(), 2u);
  EXPECT_EQ(Stored().last_round().round(), 2u);
  const std::vector<v1::RoundRecord> after = Rounds();
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[1].model_sha256(), before[1].model_sha256());
}

// A resume that falls back to an older checkpoint runs the rounds after it again from that
// round's model and strategy state (FedAvgM's momentum), all from the same file: with the same
// updates, each round's model is the one an uninterrupted run committed.
TEST_F(JobRunnerTest, RoundsRunAgainAfterAFallbackGiveTheModelsOfAnUninterruptedRun) {
  AddWorker("w1", [](const v1::TrainTask& task) { return FakeAction::UploadRandom(/*seed=*/task.round()); });
  v1::JobSpec spec = SmallSpec(1, 1);
  spec.set_strategy("fedavgm");
  spec.mutable_server()->set_learning_rate(1.0);
  spec.mutable_server()->set_momentum(0.9);
  spec.set_rounds(4);
  ASSERT_EQ(Run(spec).state(), v1::JOB_SUCCEEDED);
  std::vector<std::string> uninterrupted;
  for (const v1::RoundRecord& r : Rounds()) uninterrupted.push_back(r.model_sha256());
  ASSERT_EQ(uninterrupted.size(), 4u);
  ASSERT_TRUE(store_.DeleteJob(kJobId).ok());

  // As if the coordinator had stopped after round 3 of 4, rounds 2 and 3's checkpoints damaged.
  spec.set_rounds(3);
  ASSERT_EQ(Run(spec).state(), v1::JOB_SUCCEEDED);
  v1::Job stored = Stored();
  stored.set_state(v1::JOB_RUNNING);
  stored.mutable_spec()->set_rounds(4);
  ASSERT_TRUE(store_.UpdateJob(stored).ok());
  ASSERT_TRUE(store_.DamageCheckpoint(kJobId, 3));
  ASSERT_TRUE(store_.DamageCheckpoint(kJobId, 2));
  StartRunner(stored);
  const v1::Job resumed = AwaitEnd();
  ASSERT_EQ(resumed.state(), v1::JOB_SUCCEEDED) << resumed.error();
  EXPECT_NE(Events().find("falling back to the checkpoint of round 1; rounds 2 to 3 will be run again"),
            std::string::npos)
      << Events();
  const std::vector<v1::RoundRecord> rounds = Rounds();
  ASSERT_EQ(rounds.size(), 4u);
  for (uint32_t r = 1; r <= 4; ++r) {
    EXPECT_EQ(rounds[r - 1].round(), r);
    EXPECT_EQ(rounds[r - 1].model_sha256(), uninterrupted[r - 1]) << "round " << r;
  }
}

}  // namespace
}  // namespace tessera::server
