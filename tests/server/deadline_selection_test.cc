// Deadline-aware and utility-guided selection with over-selection.
//  - The deadline policy alone, on hand-made round records: fast clients before one whose times exceed
//    the deadline, never-timed clients tried first, the over-selected count, lower bounds for
//    clients dropped unreported, outcomes that say nothing about speed ignored, a slow hiccup
//    outvoted by the median, ties drawn from (seed, round, attempt).
//  - The utility policy: loss x samples preferred, a client slower than the deadline
//    penalised by alpha, a client left out for long brought back by its staleness.
//  - RandomSelection: the same clients as the draw before over-selection existed.
//  - A Round told to complete at its accepted target: complete with clients still pending, and
//    an update that comes after the close refused without touching the aggregate.
//  - The round driver on a ManualClock with fake workers: an over-selected round closes when
//    clients_per_round updates are in, without waiting for the deadline, cancels the others
//    and records them as over-selected; the policy learns from committed rounds, and again from
//    the store after a restart.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "job_runner_fixture.h"
#include "proto/job_mapping.h"
#include "server/jobs/round.h"
#include "server/selection/deadline_selection.h"
#include "server/selection/selection.h"
#include "server/selection/utility_selection.h"
#include "server/strategy/strategy.h"
#include "small_tensors.h"

namespace tessera::server {
namespace {

using testing::HeaderFor;
using testing::Layout;
using testing::Values;

std::vector<Client> Candidates(const std::vector<std::string>& seats) {
  std::vector<Client> clients;
  for (size_t i = 0; i < seats.size(); ++i) clients.push_back(Client{seats[i], "", static_cast<uint32_t>(i), {seats[i]}});
  return clients;
}

std::set<std::string> Seats(const std::vector<Client>& clients) {
  std::set<std::string> seats;
  for (const auto& c : clients) seats.insert(c.seat);
  return seats;
}

v1::JobSpec DeadlineSpec(uint32_t clients_per_round, double over_selection, uint32_t deadline_ms = 60000) {
  v1::JobSpec spec;
  spec.set_seed(11);
  spec.set_clients_per_round(clients_per_round);
  spec.set_round_deadline_ms(deadline_ms);
  spec.mutable_selection()->set_policy("deadline");
  spec.mutable_selection()->set_over_selection(over_selection);
  return spec;
}

v1::WorkerRoundReport Accepted(const std::string& worker, double reported_ms, double compute_ms = 0) {
  v1::WorkerRoundReport w;
  w.set_worker_id(worker);
  w.set_outcome("accepted");
  w.set_reported_ms(reported_ms);
  w.set_compute_ms(compute_ms);
  return w;
}

v1::WorkerRoundReport Dropped(const std::string& worker, const std::string& outcome, double dropped_ms) {
  v1::WorkerRoundReport w;
  w.set_worker_id(worker);
  w.set_outcome(outcome);
  w.set_dropped_ms(dropped_ms);
  return w;
}

v1::RoundRecord Record(std::vector<v1::WorkerRoundReport> workers) {
  v1::RoundRecord record;
  for (auto& w : workers) *record.add_workers() = std::move(w);
  return record;
}

TEST(DeadlineSelectionTest, FastClientsAreChosenOverOneWhoseTimesExceedTheDeadline) {
  const v1::JobSpec spec = DeadlineSpec(3, 0);
  DeadlineSelection policy;
  // w3 took 90 s against a 60 s deadline; the others 1 to 20 s.
  policy.Observe(Record({Accepted("w1", 1000), Accepted("w2", 20000), Accepted("w3", 90000), Accepted("w4", 5000)}),
                 spec);
  for (uint32_t round = 2; round < 12; ++round) {
    EXPECT_EQ(Seats(policy.Choose(Candidates({"w1", "w2", "w3", "w4"}), spec, round, 1)),
              (std::set<std::string>{"w1", "w2", "w4"}))
        << "round " << round;
  }
  // With room for all four, the slow one is taken too: last.
  EXPECT_EQ(policy.Choose(Candidates({"w1", "w2", "w3", "w4"}), DeadlineSpec(4, 0), 2, 1).size(), 4u);
  // The worker's own phases count when they add up to more than the coordinator saw.
  policy.Observe(Record({Accepted("w5", 10, /*compute_ms=*/70000)}), spec);
  EXPECT_EQ(policy.history().ExpectedTime("w5")->ms, 70000);
  EXPECT_EQ(Seats(policy.Choose(Candidates({"w1", "w5"}), DeadlineSpec(1, 0), 2, 1)), std::set<std::string>{"w1"});
}

TEST(DeadlineSelectionTest, NeverTimedClientsAreTriedFirstThenRankedByTheirTimes) {
  const v1::JobSpec spec = DeadlineSpec(1, 0);
  DeadlineSelection policy;
  policy.Observe(Record({Accepted("w1", 1000), Accepted("w2", 2000)}), spec);
  EXPECT_FALSE(policy.history().ExpectedTime("w3").has_value());
  EXPECT_EQ(Seats(policy.Choose(Candidates({"w1", "w2", "w3"}), spec, 2, 1)), std::set<std::string>{"w3"});
  policy.Observe(Record({Accepted("w3", 90000)}), spec);
  EXPECT_EQ(Seats(policy.Choose(Candidates({"w1", "w2", "w3"}), spec, 3, 1)), std::set<std::string>{"w1"});
  // Outcomes that say nothing about speed leave a client never timed: tried first.
  policy.Observe(Record({Dropped("w4", "failed: no device", 0), Dropped("w5", "dropped: worker 'w5' lost", 0),
                         Dropped("w6", "rejected: its delta's L2 norm 5000 exceeds", 0)}),
                 spec);
  for (const char* seat : {"w4", "w5", "w6"}) EXPECT_FALSE(policy.history().ExpectedTime(seat).has_value()) << seat;
  EXPECT_EQ(Seats(policy.Choose(Candidates({"w1", "w4"}), spec, 4, 1)), std::set<std::string>{"w4"});
}

TEST(DeadlineSelectionTest, OverSelectionTakesTheCeilingOfTheTargetTimesOnePlusTheFraction) {
  DeadlineSelection policy;
  std::vector<std::string> seats;
  for (int i = 0; i < 20; ++i) seats.push_back("w" + std::to_string(i));
  EXPECT_EQ(policy.Choose(Candidates(seats), DeadlineSpec(10, 0.3), 1, 1).size(), 13u);
  EXPECT_EQ(policy.Choose(Candidates(seats), DeadlineSpec(7, 0.3), 1, 1).size(), 10u);
  EXPECT_EQ(policy.Choose(Candidates(seats), DeadlineSpec(4, 0.5), 1, 1).size(), 6u);
  EXPECT_EQ(policy.Choose(Candidates(seats), DeadlineSpec(4, 0), 1, 1).size(), 4u);
  EXPECT_EQ(policy.Choose(Candidates(seats), DeadlineSpec(16, 0.5), 1, 1).size(), 20u) << "at most the candidates";
  v1::JobSpec defaulted = DeadlineSpec(10, 0);
  defaulted.mutable_selection()->clear_over_selection();
  EXPECT_EQ(policy.Choose(Candidates(seats), defaulted, 1, 1).size(), 13u) << "deadline's default is 0.3";
  // Sorted by seat, as RandomSelection's.
  auto chosen = policy.Choose(Candidates(seats), DeadlineSpec(10, 0.3), 1, 1);
  EXPECT_TRUE(std::is_sorted(chosen.begin(), chosen.end(), [](const Client& a, const Client& b) { return a.seat < b.seat; }));
}

TEST(DeadlineSelectionTest, AClientDroppedUnreportedTookAtLeastUntilTheCloseAndRanksAfterAnEqualMeasuredTime) {
  const v1::JobSpec spec = DeadlineSpec(1, 0);
  DeadlineSelection policy;
  // Over-selected: dropped when the round closed at 3 s, right at w1's report.
  policy.Observe(Record({Accepted("w1", 3000), Dropped("w2", "dropped: over-selected, the round had its 1 updates", 3000)}),
                 spec);
  EXPECT_EQ(policy.history().ExpectedTime("w2")->ms, 3000);
  EXPECT_TRUE(policy.history().ExpectedTime("w2")->at_least);
  for (uint32_t round = 2; round < 8; ++round) {
    EXPECT_EQ(Seats(policy.Choose(Candidates({"w1", "w2"}), spec, round, 1)), std::set<std::string>{"w1"});
  }
  // A clock that stood still (dropped_ms 0): still at least as slow as the round's accepted ones.
  policy.Observe(Record({Accepted("w3", 0, /*compute_ms=*/5), Dropped("w4", "dropped: over-selected, x", 0)}), spec);
  EXPECT_EQ(policy.history().ExpectedTime("w4")->ms, 5);
  EXPECT_EQ(Seats(policy.Choose(Candidates({"w3", "w4"}), spec, 2, 1)), std::set<std::string>{"w3"});
  // Dropped at the deadline: it does not fit, even against a client just under it. A record
  // from before dropped_ms counts as the deadline.
  policy.Observe(Record({Accepted("w5", 59999), Dropped("w6", "dropped: deadline passed", 0)}), spec);
  EXPECT_EQ(policy.history().ExpectedTime("w6")->ms, 60000);
  EXPECT_EQ(Seats(policy.Choose(Candidates({"w5", "w6"}), spec, 2, 1)), std::set<std::string>{"w5"});
}

TEST(DeadlineSelectionTest, TheExpectedTimeIsTheUpperMedianOfTheLastFive) {
  const v1::JobSpec spec = DeadlineSpec(1, 0);
  DeadlineSelection policy;
  // w1: fast with one slow hiccup; w2: slow with one fast round.
  for (double ms : {1000.0, 1000.0, 90000.0}) policy.Observe(Record({Accepted("w1", ms)}), spec);
  for (double ms : {90000.0, 90000.0, 1000.0}) policy.Observe(Record({Accepted("w2", ms)}), spec);
  EXPECT_EQ(policy.history().ExpectedTime("w1")->ms, 1000);
  EXPECT_EQ(policy.history().ExpectedTime("w2")->ms, 90000);
  EXPECT_EQ(Seats(policy.Choose(Candidates({"w1", "w2"}), spec, 5, 1)), std::set<std::string>{"w1"});
  // Of two times, the slower: one slow round is enough to doubt a client.
  DeadlineSelection two;
  for (double ms : {1000.0, 7000.0}) two.Observe(Record({Accepted("w1", ms)}), spec);
  EXPECT_EQ(two.history().ExpectedTime("w1")->ms, 7000);
  // Only the last five count: w2 became fast.
  for (int i = 0; i < 5; ++i) policy.Observe(Record({Accepted("w2", 500)}), spec);
  EXPECT_EQ(policy.history().ExpectedTime("w2")->ms, 500);
  EXPECT_EQ(Seats(policy.Choose(Candidates({"w1", "w2"}), spec, 9, 1)), std::set<std::string>{"w2"});
}

TEST(DeadlineSelectionTest, EqualTimesAreDrawnFromTheSeedRoundAndAttemptReproducibly) {
  const v1::JobSpec spec = DeadlineSpec(3, 0);
  DeadlineSelection policy;
  std::vector<std::string> seats;
  v1::RoundRecord record;
  for (int i = 0; i < 6; ++i) {
    seats.push_back("w" + std::to_string(i));
    *record.add_workers() = Accepted(seats.back(), 1000);
  }
  policy.Observe(record, spec);
  std::set<std::string> ever;
  std::set<std::set<std::string>> different;
  for (uint32_t round = 1; round <= 20; ++round) {
    auto a = Seats(policy.Choose(Candidates(seats), spec, round, 1));
    EXPECT_EQ(a, Seats(policy.Choose(Candidates(seats), spec, round, 1))) << "round " << round;
    ever.insert(a.begin(), a.end());
    different.insert(a);
  }
  EXPECT_EQ(ever.size(), 6u) << "every tied client gets its turn";
  EXPECT_GT(different.size(), 1u);
  // The same history in another policy gives the same choice.
  DeadlineSelection again;
  again.Observe(record, spec);
  EXPECT_EQ(Seats(again.Choose(Candidates(seats), spec, 4, 2)), Seats(policy.Choose(Candidates(seats), spec, 4, 2)));
}

v1::WorkerRoundReport Trained(const std::string& worker, double reported_ms, uint64_t samples, double loss) {
  v1::WorkerRoundReport w = Accepted(worker, reported_ms);
  w.set_samples(samples);
  w.set_train_loss(loss);
  return w;
}

v1::JobSpec UtilitySpec(uint32_t clients_per_round, double straggler_penalty) {
  v1::JobSpec spec = DeadlineSpec(clients_per_round, 0);
  spec.mutable_selection()->set_policy("utility");
  spec.mutable_selection()->set_straggler_penalty(straggler_penalty);
  return spec;
}

TEST(UtilitySelectionTest, TheClientWithMoreLossTimesSamplesIsPreferred) {
  const v1::JobSpec spec = UtilitySpec(1, 2);
  UtilitySelection policy;
  v1::RoundRecord record = Record({Trained("w1", 1000, 100, 0.5), Trained("w2", 1000, 100, 2.0),
                                   Trained("w3", 1000, 400, 0.4)});
  record.set_round(1);
  policy.Observe(record, spec);
  // Utilities 50, 200, 160: scaled to 0, 1, 0.73; the same staleness bonus for all three.
  auto scores = policy.Scores(Candidates({"w1", "w2", "w3"}), spec, 2);
  EXPECT_GT(scores["w2"], scores["w3"]);
  EXPECT_GT(scores["w3"], scores["w1"]);
  EXPECT_NEAR(scores["w2"] - scores["w1"], 1.0, 1e-9);
  EXPECT_EQ(Seats(policy.Choose(Candidates({"w1", "w2", "w3"}), spec, 2, 1)), std::set<std::string>{"w2"});
  EXPECT_EQ(Seats(policy.Choose(Candidates({"w1", "w2", "w3"}), UtilitySpec(2, 2), 2, 1)),
            (std::set<std::string>{"w2", "w3"}));
  // A never-seen client is explored before any of them.
  EXPECT_EQ(Seats(policy.Choose(Candidates({"w1", "w2", "w4"}), spec, 2, 1)), std::set<std::string>{"w4"});
}

TEST(UtilitySelectionTest, AClientSlowerThanTheDeadlineIsPenalisedByAlpha) {
  UtilitySelection policy;
  v1::RoundRecord record = Record({Trained("fast", 1000, 100, 0.5), Trained("slow", 180000, 100, 2.0)});
  record.set_round(1);
  policy.Observe(record, UtilitySpec(1, 2));
  // The slow client has the most utility, but takes three times the 60 s deadline: x (1/3)^alpha.
  auto scores = policy.Scores(Candidates({"fast", "slow"}), UtilitySpec(1, 2), 2);
  const double bonus = std::sqrt(0.1 * std::log(2.0) / 1);
  EXPECT_NEAR(scores["fast"], 0 + bonus, 1e-9);
  EXPECT_NEAR(scores["slow"], (1 + bonus) / 9, 1e-9);
  EXPECT_EQ(Seats(policy.Choose(Candidates({"fast", "slow"}), UtilitySpec(1, 2), 2, 1)), std::set<std::string>{"fast"});
  // alpha 0: no penalty, the utility decides.
  EXPECT_EQ(Seats(policy.Choose(Candidates({"fast", "slow"}), UtilitySpec(1, 0), 2, 1)), std::set<std::string>{"slow"});
}

TEST(UtilitySelectionTest, AClientLeftOutForLongComesBackThroughItsStaleness) {
  const v1::JobSpec spec = UtilitySpec(1, 2);
  UtilitySelection policy;
  v1::RoundRecord first = Record({Trained("old", 1000, 100, 1.0)});
  first.set_round(1);
  policy.Observe(first, spec);
  v1::RoundRecord later = Record({Trained("recent", 1000, 100, 1.0)});
  later.set_round(30);
  policy.Observe(later, spec);
  // Equal utilities; "old" was last selected in round 1, "recent" in round 30.
  auto scores = policy.Scores(Candidates({"old", "recent"}), spec, 31);
  EXPECT_NEAR(scores["old"] - scores["recent"],
              std::sqrt(0.1 * std::log(31.0) / 1) - std::sqrt(0.1 * std::log(31.0) / 30), 1e-9);
  EXPECT_EQ(Seats(policy.Choose(Candidates({"old", "recent"}), spec, 31, 1)), std::set<std::string>{"old"});
}

// RandomSelection's draw as it was before over-selection: shuffle with the job's seed, the
// round and the attempt; the first clients_per_round; sorted by seat.
std::vector<std::string> DrawBeforeOverSelection(std::vector<Client> candidates, const v1::JobSpec& spec, uint32_t round,
                                                 uint32_t attempt) {
  std::mt19937_64 rng(spec.seed() * 1000003ull + round * 131ull + attempt);
  std::shuffle(candidates.begin(), candidates.end(), rng);
  if (candidates.size() > spec.clients_per_round()) candidates.resize(spec.clients_per_round());
  std::vector<std::string> seats;
  for (const auto& c : candidates) seats.push_back(c.seat);
  std::sort(seats.begin(), seats.end());
  return seats;
}

TEST(RandomSelectionTest, WithoutOverSelectionItDrawsTheSameClientsAsBefore) {
  std::vector<std::string> names;
  for (int i = 0; i < 12; ++i) names.push_back("w" + std::to_string(i));
  RandomSelection policy;
  for (uint64_t seed : {0ull, 1ull, 7ull, 123456789ull}) {
    for (uint32_t round = 1; round <= 5; ++round) {
      for (uint32_t attempt = 1; attempt <= 2; ++attempt) {
        v1::JobSpec spec;
        spec.set_seed(seed);
        spec.set_clients_per_round(5);
        std::vector<std::string> chosen;
        for (const auto& c : policy.Choose(Candidates(names), spec, round, attempt)) chosen.push_back(c.seat);
        EXPECT_EQ(chosen, DrawBeforeOverSelection(Candidates(names), spec, round, attempt));
        spec.mutable_selection()->set_policy("random");  // named, with its default: the same
        std::vector<std::string> named;
        for (const auto& c : policy.Choose(Candidates(names), spec, round, attempt)) named.push_back(c.seat);
        EXPECT_EQ(named, chosen);
        // Over-selected, it draws more of the same order: the clients it took before and more.
        spec.mutable_selection()->set_over_selection(0.4);
        auto more = Seats(policy.Choose(Candidates(names), spec, round, attempt));
        EXPECT_EQ(more.size(), 7u);
        for (const auto& seat : chosen) EXPECT_EQ(more.count(seat), 1u) << seat;
      }
    }
  }
}

TEST(SelectionPolicyTest, TheSpecNamesThePolicy) {
  v1::JobSpec spec;
  EXPECT_NE(dynamic_cast<RandomSelection*>(CreateSelectionPolicy(spec).get()), nullptr);
  spec.mutable_selection()->set_policy("deadline");
  EXPECT_NE(dynamic_cast<DeadlineSelection*>(CreateSelectionPolicy(spec).get()), nullptr);
  spec.mutable_selection()->set_policy("utility");
  EXPECT_NE(dynamic_cast<UtilitySelection*>(CreateSelectionPolicy(spec).get()), nullptr);
}

TEST(OverSelectedRoundTest, CompletesAtItsTargetAndRefusesALaterUpdateWithoutFoldingIt) {
  auto global = std::make_shared<const TensorSet>(Layout(1, 1, 1));
  v1::JobSpec fedavg_spec;
  fedavg_spec.set_strategy("fedavg");
  auto fedavg = CreateStrategy(fedavg_spec, *global);
  ASSERT_TRUE(fedavg.ok());
  ManualClock clock;
  Round round("job-1", 4, 1, 3, global, (*fedavg)->BeginRound(*global), 1, {},
              std::numeric_limits<double>::infinity(), Round::NormPolicy::kRefuse, &clock);
  for (const char* w : {"w1", "w2", "w3"}) round.AddParticipant(0, {{w, 1}});
  round.CompleteAtAccepted(2);
  round.MarkDispatched();
  EXPECT_FALSE(round.Complete());
  ASSERT_TRUE(round.Submit(HeaderFor("w1", 10), Layout(1, 1, 1), 1).ok());
  EXPECT_FALSE(round.Complete());
  ASSERT_TRUE(round.Submit(HeaderFor("w2", 10), Layout(3, 3, 3), 1).ok());
  EXPECT_TRUE(round.Complete()) << "two of three accepted: complete with w3 pending";
  EXPECT_EQ(round.PendingWorkers(), std::vector<std::string>{"w3"});
  clock.Advance(std::chrono::milliseconds(250));
  const auto dropped = round.Close("over-selected, the round had its 2 updates");
  EXPECT_EQ(dropped, std::vector<std::string>{"w3"});
  Status late = round.Admit(HeaderFor("w3", 10));
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(late.message().find("the round has closed (over-selected, the round had its 2 updates)"), std::string::npos)
      << late.message();
  EXPECT_EQ(round.Submit(HeaderFor("w3", 10), Layout(1000, 1000, 1000), 1).code(), StatusCode::kFailedPrecondition);
  auto step = round.Finish(**fedavg);
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(Values(step->model), (std::vector<float>{3, 3, 3})) << "the mean of w1's and w2's deltas only";
  v1::RoundRecord record;
  round.FillRecord(&record);
  EXPECT_EQ(record.clients_selected(), 3u);
  EXPECT_EQ(record.clients_reported(), 2u);
  for (const auto& w : record.workers()) {
    if (w.worker_id() == "w3") {
      EXPECT_EQ(w.outcome(), "dropped: over-selected, the round had its 2 updates");
      EXPECT_DOUBLE_EQ(w.dropped_ms(), 250) << "cancelled 250 ms after the tasks went out";
    } else {
      EXPECT_EQ(w.outcome(), "accepted");
      EXPECT_EQ(w.dropped_ms(), 0);
    }
  }
}

TEST(OverSelectedRoundTest, WithoutATargetOnlyAllReportedCompletes) {
  auto global = std::make_shared<const TensorSet>(Layout(1, 1, 1));
  v1::JobSpec fedavg_spec;
  fedavg_spec.set_strategy("fedavg");
  auto fedavg = CreateStrategy(fedavg_spec, *global);
  ASSERT_TRUE(fedavg.ok());
  Round round("job-1", 4, 1, 3, global, (*fedavg)->BeginRound(*global), 1);
  for (const char* w : {"w1", "w2"}) round.AddParticipant(0, {{w, 1}});
  round.MarkDispatched();
  ASSERT_TRUE(round.Submit(HeaderFor("w1", 10), Layout(1, 1, 1), 1).ok());
  EXPECT_FALSE(round.Complete());
  ASSERT_TRUE(round.Submit(HeaderFor("w2", 10), Layout(1, 1, 1), 1).ok());
  EXPECT_TRUE(round.Complete());
}

class OverSelectionJobTest : public JobRunnerFixture {
 protected:
  static v1::JobSpec Spec(uint32_t parties, uint32_t clients_per_round, double over_selection, uint32_t rounds = 1) {
    v1::JobSpec spec = SmallSpec(parties, 1, 60000);
    spec.set_clients_per_round(clients_per_round);
    spec.set_rounds(rounds);
    spec.mutable_selection()->set_policy("deadline");
    spec.mutable_selection()->set_over_selection(over_selection);
    return spec;
  }
  // The workers selected in each committed round, by round.
  std::vector<std::set<std::string>> SelectedByRound() {
    std::vector<std::set<std::string>> selected;
    for (const auto& record : Rounds()) {
      std::set<std::string> seats;
      for (const auto& w : record.workers()) seats.insert(w.worker_id());
      selected.push_back(seats);
    }
    return selected;
  }
  // Reports a compute time of `ms` with its update (a slow device, on a clock that stands still).
  static FakeAction Slow(double ms) {
    return FakeAction::Upload().WithTamper([ms](v1::UpdateHeader* h, TensorSet*) { h->set_compute_ms(ms); });
  }
};

TEST_F(OverSelectionJobTest, TheRoundClosesWithItsTargetAndCancelsTheOverSelectedClient) {
  auto late = std::make_shared<Gate>();
  // w1 and w2 upload once w3 has its task in hand (else the round could close, and cancel w3,
  // before w3's thread took the task up).
  auto first = std::make_shared<Gate>(), second = std::make_shared<Gate>();
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::UploadLate(first, 0.5f)));
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::UploadLate(second, 0.5f)));
  // w3 downloads, and uploads only when the test says: after its round has closed.
  FakeWorker& w3 = AddWorker("w3", Always(FakeAction::UploadLate(late, 100.0f)));
  Submit(Spec(3, 2, 0.5));  // ceil(2 x 1.5) = 3 selected, the round wants 2
  ASSERT_TRUE(late->AwaitReached());
  first->Open();
  second->Open();
  // No time passes: the round closes on w1's and w2's updates, not at its deadline.
  v1::Job job = AwaitEnd();
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  ASSERT_TRUE(w3.Await([&](const std::vector<v1::Task>& received, const std::vector<FakeTurn>&) {
    return std::any_of(received.begin(), received.end(), IsTaskCancel);
  }));
  ASSERT_EQ(w3.cancels().size(), 1u);
  EXPECT_EQ(w3.cancels()[0].round(), 1u);
  EXPECT_EQ(w3.cancels()[0].attempt(), 1u);
  EXPECT_EQ(w3.cancels()[0].reason(), "the round closed with its 2 updates (over-selected)");
  EXPECT_TRUE(w1.cancels().empty());
  EXPECT_TRUE(w2.cancels().empty());
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].attempt(), 1u) << "an over-selected client is no failure: the round is not retried";
  EXPECT_EQ(rounds[0].clients_selected(), 3u);
  EXPECT_EQ(rounds[0].clients_reported(), 2u);
  EXPECT_EQ(ReportOf(rounds[0], "w3").outcome(), "dropped: over-selected, the round had its 2 updates");
  EXPECT_DOUBLE_EQ(rounds[0].latency().total_ms(), 0) << "closed at once, not at the 60 s deadline";
  // The worker service does not count an update of w3's for that attempt against it.
  auto header = [](const std::string& worker, uint32_t round, uint32_t attempt) {
    v1::UpdateHeader h;
    h.set_job_id(kJobId);
    h.set_worker_id(worker);
    h.set_round(round);
    h.set_attempt(attempt);
    return h;
  };
  EXPECT_TRUE(runner()->CancelledAsOverSelected(header("w3", 1, 1)));
  EXPECT_FALSE(runner()->CancelledAsOverSelected(header("w1", 1, 1)));
  EXPECT_FALSE(runner()->CancelledAsOverSelected(header("w3", 1, 2)));
  EXPECT_FALSE(runner()->CancelledAsOverSelected(header("w3", 2, 1)));
  // Its update, when it comes, is refused before its tensors are read, and the model is the
  // mean of w1's and w2's.
  late->Open();
  ASSERT_TRUE(w3.AwaitFinished(1, 1));
  const FakeTurn turn = w3.turns()[0];
  ASSERT_TRUE(turn.admitted.has_value());
  EXPECT_EQ(turn.admitted->code(), StatusCode::kFailedPrecondition) << turn.admitted->message();
  EXPECT_FALSE(turn.verdict.has_value());
  auto before = store_.LoadCheckpoint(kJobId, 0);
  auto after = store_.LoadCheckpoint(kJobId, 1);
  ASSERT_TRUE(before.ok() && after.ok());
  // The model's tensors; the checkpoint holds the policy's history after them.
  TensorSet state;
  const TensorSet model = SplitModelAndState(std::move(after).value(), &state);
  ASSERT_EQ(model.size(), before->size());
  for (size_t i = 0; i < model.size(); ++i) EXPECT_FLOAT_EQ(model[i].values[0] - (*before)[i].values[0], 0.5f);
}

TEST_F(OverSelectionJobTest, NewClientsAreTriedThenTheOneSlowerThanTheDeadlineIsLeftOut) {
  AddWorker("w1", Always(FakeAction::Upload()));
  AddWorker("w2", Always(FakeAction::Upload()));
  AddWorker("w3", Always(Slow(90000)));  // its rounds take 90 s against a 60 s deadline
  v1::Job job = Run(Spec(3, 1, 0, /*rounds=*/6));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto selected = SelectedByRound();
  ASSERT_EQ(selected.size(), 6u);
  // Rounds 1 to 3: each client once, never-timed ones first.
  std::set<std::string> tried;
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(selected[r].size(), 1u);
    tried.insert(*selected[r].begin());
  }
  EXPECT_EQ(tried, (std::set<std::string>{"w1", "w2", "w3"}));
  for (int r = 3; r < 6; ++r) EXPECT_EQ(selected[r].count("w3"), 0u) << "round " << r + 1;
}

TEST_F(OverSelectionJobTest, ARestartedRunnerLearnsTheTimesAgainFromTheCommittedRounds) {
  // A seed for which a policy that forgot the history would pick w3 for round 4.
  v1::JobSpec spec = Spec(3, 1, 0, /*rounds=*/3);
  bool found = false;
  for (uint64_t seed = 1; seed < 200 && !found; ++seed) {
    spec.set_seed(seed);
    auto fresh = DeadlineSelection().Choose(Candidates({"w1", "w2", "w3"}), spec, 4, 1);
    found = Seats(fresh) == std::set<std::string>{"w3"};
  }
  ASSERT_TRUE(found);
  AddWorker("w1", Always(FakeAction::Upload()));
  AddWorker("w2", Always(FakeAction::Upload()));
  AddWorker("w3", Always(Slow(90000)));
  ASSERT_EQ(Run(spec).state(), v1::JOB_SUCCEEDED);
  ASSERT_EQ(SelectedByRound().size(), 3u);
  // As if the coordinator had restarted after round 3 of 5.
  v1::Job stored = Stored();
  stored.set_state(v1::JOB_RUNNING);
  stored.mutable_spec()->set_rounds(5);
  ASSERT_TRUE(store_.UpdateJob(stored).ok());
  StartRunner(stored);
  ASSERT_EQ(AwaitEnd().state(), v1::JOB_SUCCEEDED);
  auto selected = SelectedByRound();
  ASSERT_EQ(selected.size(), 5u);
  EXPECT_EQ(selected[3].count("w3"), 0u) << "round 4 forgot that w3 is slower than the deadline";
  EXPECT_EQ(selected[4].count("w3"), 0u);
}

// A record numbered 2^32 - 1 in the store (one hand-edited or damaged) ends the history the
// restarted runner rereads: the round after it would wrap to 0 and read the pages again for
// ever, and the job would never start.
TEST_F(OverSelectionJobTest, ARecordNumberedAtTheTopOfTheRangeEndsTheReread) {
  AddWorker("w1", Always(FakeAction::Upload()));
  AddWorker("w2", Always(FakeAction::Upload()));
  ASSERT_EQ(Run(Spec(2, 1, 0, /*rounds=*/2)).state(), v1::JOB_SUCCEEDED);
  v1::Job stored = Stored();
  auto tensors = store_.LoadCheckpoint(kJobId, 2);
  ASSERT_TRUE(tensors.ok()) << tensors.status().ToString();
  // Round 2's checkpoint as written before checkpoints carried the policy's history: the
  // restarted runner learns from the records.
  TensorSet state;
  const TensorSet model = SplitModelAndState(std::move(tensors).value(), &state);
  ASSERT_TRUE(store_.CommitRound(stored, Rounds().back(), model).ok());
  v1::RoundRecord stray = Rounds().back();
  stray.set_round(std::numeric_limits<uint32_t>::max());
  ASSERT_TRUE(store_.CommitRound(stored, stray, model).ok());
  stored.set_state(v1::JOB_RUNNING);
  stored.mutable_spec()->set_rounds(3);
  ASSERT_TRUE(store_.UpdateJob(stored).ok());
  StartRunner(stored);
  const v1::Job job = AwaitEnd();
  EXPECT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  EXPECT_EQ(job.rounds_committed(), 3u);
}

}  // namespace
}  // namespace tessera::server
