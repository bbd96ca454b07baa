// The robust aggregation rules (coordinate-wise median, trimmed mean, multi-Krum) against
// values worked out by hand, composed with a server optimiser, independent of the order the
// updates arrive in; and the round's update norm policy "clip".
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "server/jobs/round.h"
#include "server/strategy/strategy.h"
#include "tests/server/small_tensors.h"

namespace tessera::server {
namespace {

using testing::Layout;
using testing::Values;

v1::JobSpec RuleSpec(const std::string& rule, const std::string& strategy = "fedavg") {
  v1::JobSpec spec;
  spec.set_strategy(strategy);
  spec.mutable_aggregation()->set_rule(rule);
  return spec;
}

std::unique_ptr<Strategy> Make(const v1::JobSpec& spec, const TensorSet& layout) {
  auto strategy = CreateStrategy(spec, layout);
  EXPECT_TRUE(strategy.ok()) << strategy.status().ToString();
  return std::move(strategy).value();
}

struct Update {
  std::string client;
  TensorSet delta;
  uint64_t samples = 1;
};

// Folds `updates` into a round of `spec`'s strategy from global model `global` and returns
// the next model.
Result<TensorSet> Aggregate(const v1::JobSpec& spec, const TensorSet& global, const std::vector<Update>& updates) {
  auto strategy = Make(spec, global);
  auto aggregate = strategy->BeginRound(global);
  for (const auto& u : updates) {
    ClientUpdate update;
    update.client = u.client;
    update.samples = u.samples;
    update.delta = &u.delta;
    RETURN_IF_ERROR(aggregate->Fold(update));
  }
  ASSIGN_OR_RETURN(StrategyStep step, strategy->Finish(global, *aggregate));
  return step.model;
}

void ExpectModel(const Result<TensorSet>& model, const std::vector<float>& expected) {
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const std::vector<float> got = Values(*model);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], expected[i]) << "[" << i << "]";
}

// Five clients; w4 claims a thousand times the samples of the others.
//   coordinate 0:  1, 2, 3, 100, -50   sorted -50, 1, 2, 3, 100
//   coordinate 1: 10, -1, 0, 2, 3      sorted -1, 0, 2, 3, 10
//   coordinate 2: -3, 0, 5, 1, 2       sorted -3, 0, 1, 2, 5
const std::vector<Update> kFive = {
    {"w1", Layout(1, 10, -3)}, {"w2", Layout(2, -1, 0)},       {"w3", Layout(3, 0, 5)},
    {"w4", Layout(100, 2, 1), 1000}, {"w5", Layout(-50, 3, 2)},
};

TEST(MedianTest, CoordinateWiseAndUnweighted) {
  // The middle of each sorted column: (2, 2, 1), whatever w4's sample count.
  ExpectModel(Aggregate(RuleSpec("median"), Layout(0, 0, 0), kFive), {2, 2, 1});
}

TEST(MedianTest, AnEvenCountTakesTheMeanOfTheTwoMiddleValues) {
  // Without w5: columns 1, 2, 3, 100 -> 2.5; -1, 0, 2, 10 -> 1; -3, 0, 1, 5 -> 0.5.
  const std::vector<Update> four(kFive.begin(), kFive.begin() + 4);
  ExpectModel(Aggregate(RuleSpec("median"), Layout(10, 10, 10), four), {12.5f, 11, 10.5f});
}

TEST(TrimmedMeanTest, CutsTheFractionFromEachSide) {
  // trim_fraction 0.2 of 5: one value cut from each side of each column, the mean of the
  // middle three: (1 + 2 + 3) / 3 = 2; (0 + 2 + 3) / 3 = 5/3; (0 + 1 + 2) / 3 = 1.
  v1::JobSpec spec = RuleSpec("trimmed-mean");
  spec.mutable_aggregation()->set_trim_fraction(0.2);
  ExpectModel(Aggregate(spec, Layout(0, 0, 0), kFive), {2, 5.0f / 3, 1});
  // The default fraction is 0.2 as well.
  ExpectModel(Aggregate(RuleSpec("trimmed-mean"), Layout(0, 0, 0), kFive), {2, 5.0f / 3, 1});
}

TEST(TrimmedMeanTest, TheCutIsTheFloorOfTheFractionOfTheUpdatesCounted) {
  // 100 updates of value k^2, k = 0..99, and trim_fraction 0.29: 0.29 x 100 is
  // 28.999999999999996 in double, but the cut is 29 from each side. The mean of k^2 for
  // k = 29..70 is (S(70) - S(28)) / 42 = (116795 - 7714) / 42 = 2597.1667, with
  // S(n) = n(n+1)(2n+1)/6; a cut of 28 would give (S(71) - S(27)) / 44 = 2611.5.
  std::vector<Update> updates;
  for (int k = 0; k < 100; ++k) {
    const float v = static_cast<float>(k * k);
    updates.push_back({"w" + std::to_string(1000 + k), Layout(v, v, v)});
  }
  v1::JobSpec spec = RuleSpec("trimmed-mean");
  spec.mutable_aggregation()->set_trim_fraction(0.29);
  ExpectModel(Aggregate(spec, Layout(0, 0, 0), updates), {2597.1667f, 2597.1667f, 2597.1667f});
}

// Five clients, f = 1: each is scored by its 5 - 1 - 2 = 2 nearest others. Squared distances:
//   w1-w2 1, w1-w3 1, w1-w4 300, w1-w5 200, w2-w3 2, w2-w4 281, w2-w5 221, w3-w4 281,
//   w3-w5 201, w4-w5 500.
// Scores: w1 1+1 = 2; w2 1+2 = 3; w3 1+2 = 3; w4 281+281 = 562; w5 200+201 = 401.
const std::vector<Update> kKrumFive = {
    {"w1", Layout(1, 2, 3)},   {"w2", Layout(2, 2, 3)},          {"w3", Layout(1, 3, 3)},
    {"w4", Layout(11, 12, 13), 5000}, {"w5", Layout(-9, 2, 13)},
};

v1::JobSpec KrumSpec(uint32_t f, uint32_t m) {
  v1::JobSpec spec = RuleSpec("krum");
  spec.mutable_aggregation()->set_byzantine_clients(f);
  spec.mutable_aggregation()->set_selected(m);
  return spec;
}

TEST(KrumTest, SelectsTheUpdateWithTheBestScore) {
  ExpectModel(Aggregate(KrumSpec(1, 1), Layout(0, 0, 0), kKrumFive), {1, 2, 3});  // w1
  ExpectModel(Aggregate(KrumSpec(1, 0), Layout(0, 0, 0), kKrumFive), {1, 2, 3});  // m unset: Krum
}

TEST(KrumTest, MultiKrumAveragesTheBestAndBreaksTiesByClientId) {
  // m = 3: w1, w2, w3: (4/3, 7/3, 3).
  ExpectModel(Aggregate(KrumSpec(1, 3), Layout(0, 0, 0), kKrumFive), {4.0f / 3, 7.0f / 3, 3});
  // m = 2: w1, then w2 and w3 tie at 3 and the smaller id, w2, is taken: (1.5, 2, 3).
  ExpectModel(Aggregate(KrumSpec(1, 2), Layout(0, 0, 0), kKrumFive), {1.5f, 2, 3});
  // m = 4 takes w5 (401) before w4 (562): (1 + 2 + 1 - 9, 2 + 2 + 3 + 2, 3 + 3 + 3 + 13) / 4.
  ExpectModel(Aggregate(KrumSpec(1, 4), Layout(0, 0, 0), kKrumFive), {-1.25f, 2.25f, 5.5f});
}

TEST(KrumTest, TooFewUpdatesForItsByzantineCountAreRefusedNotGuessed) {
  // n = 4 with f = 1: 4 <= 2f + 2.
  const std::vector<Update> four(kKrumFive.begin(), kKrumFive.begin() + 4);
  auto model = Aggregate(KrumSpec(1, 1), Layout(0, 0, 0), four);
  EXPECT_EQ(model.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(model.status().message().find("byzantine_clients = 1 needs more than 4 updates, the round has 4"),
            std::string::npos)
      << model.status().message();
}

TEST(RobustRuleTest, NothingFoldedIsRefused) {
  for (const char* rule : {"median", "trimmed-mean", "krum"}) {
    auto model = Aggregate(RuleSpec(rule), Layout(0, 0, 0), {});
    EXPECT_EQ(model.status().code(), StatusCode::kFailedPrecondition) << rule;
  }
}

TEST(RobustRuleTest, AnUpdateThatDoesNotFitIsRefusedAndLeavesNoTrace) {
  auto strategy = Make(RuleSpec("median"), Layout(0, 0, 0));
  auto aggregate = strategy->BeginRound(Layout(0, 0, 0));
  TensorSet wrong = {{"w", {3}, {1, 2, 3}}, {"b", {1}, {0}}};
  ClientUpdate update;
  update.client = "w1";
  update.samples = 1;
  update.delta = &wrong;
  EXPECT_EQ(aggregate->Fold(update).code(), StatusCode::kInvalidArgument);
  update.delta = &kFive[0].delta;
  update.samples = 0;
  EXPECT_EQ(aggregate->Fold(update).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(aggregate->updates(), 0u);
}

TEST(RobustRuleTest, TheResultDoesNotDependOnTheOrderUpdatesArriveIn) {
  // Values with many significant bits, where a sum's order shows in its last bits.
  std::mt19937 random(11);
  std::normal_distribution<float> normal(0, 1);
  std::vector<Update> updates;
  for (int c = 0; c < 9; ++c) {
    TensorSet delta = {{"w", {64}, std::vector<float>(64)}, {"b", {3}, std::vector<float>(3)}};
    for (auto& t : delta) {
      for (auto& v : t.values) v = normal(random) * 1e3f;
    }
    updates.push_back({"w" + std::to_string(c), delta, static_cast<uint64_t>(c + 1)});
  }
  const TensorSet global = {{"w", {64}, std::vector<float>(64, 0.5f)}, {"b", {3}, std::vector<float>(3, 0.5f)}};
  v1::JobSpec trimmed = RuleSpec("trimmed-mean");
  trimmed.mutable_aggregation()->set_trim_fraction(0.25);
  for (const v1::JobSpec& spec : {RuleSpec("median"), trimmed, KrumSpec(2, 4)}) {
    SCOPED_TRACE(spec.aggregation().rule());
    auto first = Aggregate(spec, global, updates);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    std::vector<Update> shuffled = updates;
    for (int trial = 0; trial < 5; ++trial) {
      std::shuffle(shuffled.begin(), shuffled.end(), random);
      auto again = Aggregate(spec, global, shuffled);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(TensorSetSha256(*again), TensorSetSha256(*first));
    }
  }
}

TEST(RobustRuleTest, AMedianComposesWithFedAdam) {
  // The median of kFive, (2, 2, 1), is FedAdam's pseudo-gradient d. With eta 0.1, beta1 0.9,
  // beta2 0.99, tau 0.01: m = 0.1 d = (0.2, 0.2, 0.1); v = 0.99e-4 + 0.01 d^2 =
  // (0.040099, 0.040099, 0.010099); w = w0 + 0.1 m / (sqrt(v) + 0.01), e.g.
  // 1 + 0.02 / 0.2102474 = 1.0951260.
  v1::JobSpec spec = RuleSpec("median", "fedadam");
  spec.mutable_server()->set_learning_rate(0.1);
  spec.mutable_server()->set_beta1(0.9);
  spec.mutable_server()->set_beta2(0.99);
  spec.mutable_server()->set_tau(0.01);
  ExpectModel(Aggregate(spec, Layout(1, 2, 3), kFive), {1.09512603f, 2.09512615f, 3.09050274f});
}

v1::UpdateHeader Header(const std::string& worker) {
  v1::UpdateHeader h;
  h.set_worker_id(worker);
  h.set_job_id("job-1");
  h.set_round(1);
  h.set_attempt(1);
  h.set_base_model_version(0);
  h.set_samples(10);
  return h;
}

TEST(UpdateNormPolicyTest, ClipScalesAnUpdateBeyondTheBoundDownToItAndSaysSo) {
  auto global = std::make_shared<const TensorSet>(Layout(1, 1, 1));
  auto fedavg = Make(v1::JobSpec(), *global);
  Round round("job-1", 1, 1, 0, global, fedavg->BeginRound(*global), 1, {}, /*max_update_norm=*/10,
              Round::NormPolicy::kClip);
  round.AddParticipant(0, {{"w1", 1}});
  round.AddParticipant(1, {{"w2", 1}});
  // Norm 50, scaled by 10/50 to (6, 8, 0); norm 5, within the bound, untouched.
  ASSERT_TRUE(round.Submit(Header("w1"), Layout(30, 40, 0), 1).ok());
  ASSERT_TRUE(round.Submit(Header("w2"), Layout(3, 4, 0), 1).ok());
  round.Close("test");
  EXPECT_EQ(round.accepted(), 2u);
  v1::RoundRecord record;
  round.FillRecord(&record);
  for (const auto& w : record.workers()) {
    if (w.worker_id() == "w1") {
      EXPECT_EQ(w.outcome(), "accepted: clipped, its delta's L2 norm 50 scaled down to the job's max_update_norm 10");
      EXPECT_DOUBLE_EQ(w.update_norm(), 50);  // as it was sent
    } else {
      EXPECT_EQ(w.outcome(), "accepted");
    }
  }
  auto next = round.Finish(*fedavg);
  ASSERT_TRUE(next.ok());
  // Global (1, 1, 1) plus the mean of (6, 8, 0) and (3, 4, 0).
  EXPECT_EQ(Values(next->model), (std::vector<float>{5.5f, 7, 1}));
}

TEST(UpdateNormPolicyTest, RefuseIsTheDefault) {
  auto global = std::make_shared<const TensorSet>(Layout(1, 1, 1));
  auto fedavg = Make(v1::JobSpec(), *global);
  Round round("job-1", 1, 1, 0, global, fedavg->BeginRound(*global), 1, {}, /*max_update_norm=*/10);
  round.AddParticipant(0, {{"w1", 1}});
  Status s = round.Submit(Header("w1"), Layout(30, 40, 0), 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exceeds the job's max_update_norm 10"), std::string::npos) << s.message();
  EXPECT_EQ(round.accepted(), 0u);
}

}  // namespace
}  // namespace tessera::server
