// The adaptive server optimisers (FedAdam, FedYogi, FedAdagrad; Reddi et al. 2021) against
// values computed by hand outside this code (a few lines of Python that round m, v and w to
// float32 where the strategy stores them), and their state across a checkpoint.
#include <gtest/gtest.h>

#include <limits>

#include "server/strategy/strategy.h"
#include "tests/server/small_tensors.h"

namespace tessera::server {
namespace {

using testing::Layout;
using testing::Values;

// eta 0.1, beta1 0.9, beta2 0.99, tau 0.01: v starts at tau^2 = 1e-4.
v1::JobSpec AdaptiveSpec(const std::string& strategy) {
  v1::JobSpec spec;
  spec.set_strategy(strategy);
  spec.mutable_server()->set_learning_rate(0.1);
  spec.mutable_server()->set_beta1(0.9);
  if (strategy != "fedadagrad") spec.mutable_server()->set_beta2(0.99);
  spec.mutable_server()->set_tau(0.01);
  return spec;
}

std::unique_ptr<Strategy> Make(const v1::JobSpec& spec, const TensorSet& layout) {
  auto strategy = CreateStrategy(spec, layout);
  EXPECT_TRUE(strategy.ok()) << strategy.status().ToString();
  return std::move(strategy).value();
}

Status Fold(RoundAggregate& aggregate, const TensorSet& delta, uint64_t samples, const std::string& client = "w") {
  ClientUpdate update;
  update.client = client;
  update.samples = samples;
  update.delta = &delta;
  return aggregate.Fold(update);
}

// Round 1: two clients, (1, 0, -2) with 1 sample and (-1, 4, 2) with 3: the mean delta is
// d1 = (-0.5, 3, 1). Round 2: one client, d2 = (0.01, 2, -0.05). Returns both steps, each
// adopted before the next round.
std::vector<StrategyStep> TwoRounds(Strategy& strategy) {
  std::vector<StrategyStep> steps;
  const TensorSet w0 = Layout(1, 2, 3);
  auto first = strategy.BeginRound(w0);
  EXPECT_TRUE(Fold(*first, Layout(1, 0, -2), 1, "w1").ok());
  EXPECT_TRUE(Fold(*first, Layout(-1, 4, 2), 3, "w2").ok());
  auto step1 = strategy.Finish(w0, *first);
  EXPECT_TRUE(step1.ok()) << step1.status().ToString();
  strategy.Adopt(step1->state);
  steps.push_back(*step1);
  auto second = strategy.BeginRound(step1->model);
  EXPECT_TRUE(Fold(*second, Layout(0.01f, 2, -0.05f), 5).ok());
  auto step2 = strategy.Finish(step1->model, *second);
  EXPECT_TRUE(step2.ok()) << step2.status().ToString();
  strategy.Adopt(step2->state);
  steps.push_back(*step2);
  return steps;
}

void ExpectValues(const TensorSet& set, const std::vector<float>& expected, const std::string& what) {
  const std::vector<float> got = Values(set);
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], expected[i]) << what << " [" << i << "]";
}

// The state is m for every tensor, then v for every tensor.
void ExpectState(const TensorSet& state, const std::vector<float>& m, const std::vector<float>& v,
                 const std::string& what) {
  ASSERT_EQ(state.size(), 4u) << what;
  EXPECT_EQ(state[0].name, "m/w");
  EXPECT_EQ(state[1].name, "m/b");
  EXPECT_EQ(state[2].name, "v/w");
  EXPECT_EQ(state[3].name, "v/b");
  ExpectValues({state[0], state[1]}, m, what + " m");
  ExpectValues({state[2], state[3]}, v, what + " v");
}

// m is the same for the three: m1 = 0.1 d1 = (-0.05, 0.3, 0.1); m2 = 0.9 m1 + 0.1 d2 =
// (-0.044, 0.47, 0.085).
const std::vector<float> kM1 = {-0.05f, 0.3f, 0.1f};
const std::vector<float> kM2 = {-0.044f, 0.47f, 0.085f};

TEST(FedAdamTest, TwoRoundsByHand) {
  // v1 = 0.99 * 1e-4 + 0.01 d1^2 = (0.002599, 0.090099, 0.010099);
  // w1 = w0 + 0.1 m1 / (sqrt(v1) + 0.01), e.g. 1 - 0.005 / 0.0609804 = 0.9180064.
  auto adam = Make(AdaptiveSpec("fedadam"), Layout(1, 2, 3));
  EXPECT_EQ(adam->name(), "fedadam");
  auto steps = TwoRounds(*adam);
  ExpectValues(steps[0].model, {0.91800642f, 2.09672284f, 3.09050274f}, "w1");
  ExpectState(steps[0].state, kM1, {0.002599f, 0.0900989994f, 0.0100990003f}, "round 1");
  // v2 = 0.99 v1 + 0.01 d2^2 = (0.00257401, 0.129198, 0.01002301).
  ExpectValues(steps[1].model, {0.845560193f, 2.22394204f, 3.16769481f}, "w2");
  ExpectState(steps[1].state, kM2, {0.00257401005f, 0.129198015f, 0.01002301f}, "round 2");
}

TEST(FedYogiTest, TwoRoundsByHandWithTheSecondMomentGoingBothWays) {
  // Round 1: v0 = 1e-4 < d1^2 everywhere, so v grows: v1 = v0 + 0.01 d1^2 = (0.0026, 0.0901,
  // 0.0101). Round 2: coordinate 0 has v1 = 0.0026 > d2^2 = 1e-4, so v shrinks to
  // 0.0026 - 0.01 * 1e-4 = 0.002599; coordinate 1 has v1 < 4 and grows to 0.1301.
  auto yogi = Make(AdaptiveSpec("fedyogi"), Layout(1, 2, 3));
  auto steps = TwoRounds(*yogi);
  ExpectValues(steps[0].model, {0.918019593f, 2.09672213f, 3.09049869f}, "w1");
  ExpectState(steps[0].state, kM1, {0.0026f, 0.0901f, 0.0101f}, "round 1");
  ExpectValues(steps[1].model, {0.84586525f, 2.22351146f, 3.16750932f}, "w2");
  ExpectState(steps[1].state, kM2, {0.002599f, 0.1301f, 0.0100749992f}, "round 2");
}

TEST(FedAdagradTest, TwoRoundsByHand) {
  // v1 = 1e-4 + d1^2 = (0.2501, 9.0001, 1.0001); v2 = v1 + d2^2 = (0.2502, 13.0001, 1.0026).
  auto adagrad = Make(AdaptiveSpec("fedadagrad"), Layout(1, 2, 3));
  auto steps = TwoRounds(*adagrad);
  ExpectValues(steps[0].model, {0.990198016f, 2.00996661f, 3.00990057f}, "w1");
  ExpectState(steps[0].state, kM1, {0.250099987f, 9.00010014f, 1.00010002f}, "round 1");
  ExpectValues(steps[1].model, {0.981573939f, 2.02296591f, 3.01830554f}, "w2");
  ExpectState(steps[1].state, kM2, {0.250199974f, 13.0001001f, 1.00260007f}, "round 2");
}

TEST(AdaptiveOptimizerTest, FinishLeavesTheStrategyAsItWasUntilTheStepIsAdopted) {
  const TensorSet w0 = Layout(1, 2, 3);
  auto adam = Make(AdaptiveSpec("fedadam"), w0);
  const std::string fresh = TensorSetSha256(adam->state());
  ExpectState(adam->state(), {0, 0, 0}, {1e-4f, 1e-4f, 1e-4f}, "fresh");  // m = 0, v = tau^2
  auto aggregate = adam->BeginRound(w0);
  ASSERT_TRUE(Fold(*aggregate, Layout(1, 1, 1), 1).ok());
  auto step = adam->Finish(w0, *aggregate);
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(TensorSetSha256(adam->state()), fresh);
  // The same aggregate finished twice gives the same step.
  auto again = adam->Finish(w0, *aggregate);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(TensorSetSha256(again->model), TensorSetSha256(step->model));
  EXPECT_EQ(TensorSetSha256(again->state), TensorSetSha256(step->state));
}

TEST(AdaptiveOptimizerTest, DefaultsFillWhatTheSpecLeavesUnset) {
  // Unset options take the defaults (learning rate 0.03, beta1 0.9, beta2 0.99, tau 1e-3):
  // v starts at tau^2 = 1e-6, and with one update d = (1, 1, 1), m1 = 0.1 and
  // v1 = 0.99e-6 + 0.01 = 0.01000099, so w1 = 0.03 * 0.1 / (sqrt(0.01000099) + 0.001)
  // = 0.003 / 0.10100495 = 0.0297015.
  v1::JobSpec spec;
  spec.set_strategy("fedadam");
  const TensorSet w0 = Layout(0, 0, 0);
  auto adam = Make(spec, w0);
  ExpectState(adam->state(), {0, 0, 0}, {1e-6f, 1e-6f, 1e-6f}, "fresh");
  auto aggregate = adam->BeginRound(w0);
  ASSERT_TRUE(Fold(*aggregate, Layout(1, 1, 1), 1).ok());
  auto step = adam->Finish(w0, *aggregate);
  ASSERT_TRUE(step.ok());
  for (float w : Values(step->model)) EXPECT_NEAR(w, 0.0297015, 1e-7);
  // beta1 = 0 is a value, not "unset": m is then the delta itself.
  spec.mutable_server()->set_beta1(0);
  auto no_momentum = Make(spec, w0);
  auto aggregate2 = no_momentum->BeginRound(w0);
  ASSERT_TRUE(Fold(*aggregate2, Layout(1, 1, 1), 1).ok());
  auto step2 = no_momentum->Finish(w0, *aggregate2);
  ASSERT_TRUE(step2.ok());
  for (float m : Values({step2->state[0], step2->state[1]})) EXPECT_FLOAT_EQ(m, 1.0f);
  // FedAdagrad's default learning rate is 0.3: v1 = 1e-6 + 1, so
  // w1 = 0.3 * 0.1 / (sqrt(1.000001) + 0.001) = 0.0299700.
  spec.set_strategy("fedadagrad");
  spec.mutable_server()->clear_beta1();
  auto adagrad = Make(spec, w0);
  auto aggregate3 = adagrad->BeginRound(w0);
  ASSERT_TRUE(Fold(*aggregate3, Layout(1, 1, 1), 1).ok());
  auto step3 = adagrad->Finish(w0, *aggregate3);
  ASSERT_TRUE(step3.ok());
  for (float w : Values(step3->model)) EXPECT_NEAR(w, 0.0299700, 1e-7);
}

TEST(AdaptiveOptimizerTest, MomentsSurviveACheckpointAndTheResumedRunIsBitIdentical) {
  for (const char* name : {"fedadam", "fedyogi", "fedadagrad"}) {
    SCOPED_TRACE(name);
    const v1::JobSpec spec = AdaptiveSpec(name);
    const TensorSet w0 = Layout(1, 2, 3);
    // An uninterrupted run of two rounds.
    auto uninterrupted = Make(spec, w0);
    auto reference = TwoRounds(*uninterrupted);

    // A run that stops after round 1: what its checkpoint holds, read back by a new strategy.
    auto first = Make(spec, w0);
    auto aggregate = first->BeginRound(w0);
    ASSERT_TRUE(Fold(*aggregate, Layout(1, 0, -2), 1, "w1").ok());
    ASSERT_TRUE(Fold(*aggregate, Layout(-1, 4, 2), 3, "w2").ok());
    auto step1 = first->Finish(w0, *aggregate);
    ASSERT_TRUE(step1.ok());
    first->Adopt(step1->state);
    const TensorSet checkpoint = JoinModelAndState(step1->model, first->state());
    ASSERT_EQ(checkpoint.size(), 6u);
    EXPECT_EQ(checkpoint[2].name, "strategy/m/w");
    EXPECT_EQ(checkpoint[5].name, "strategy/v/b");
    TensorSet state;
    const TensorSet model = SplitModelAndState(checkpoint, &state);
    auto resumed = Make(spec, model);
    ASSERT_TRUE(resumed->Restore(state).ok());
    EXPECT_EQ(TensorSetSha256(resumed->state()), TensorSetSha256(reference[0].state));

    auto second = resumed->BeginRound(model);
    ASSERT_TRUE(Fold(*second, Layout(0.01f, 2, -0.05f), 5).ok());
    auto step2 = resumed->Finish(model, *second);
    ASSERT_TRUE(step2.ok());
    EXPECT_EQ(TensorSetSha256(step2->model), TensorSetSha256(reference[1].model));
    EXPECT_EQ(TensorSetSha256(step2->state), TensorSetSha256(reference[1].state));

    // A fresh strategy (a state lost on restart) would have ended elsewhere.
    auto forgetful = Make(spec, model);
    auto third = forgetful->BeginRound(model);
    ASSERT_TRUE(Fold(*third, Layout(0.01f, 2, -0.05f), 5).ok());
    auto lost = forgetful->Finish(model, *third);
    ASSERT_TRUE(lost.ok());
    EXPECT_NE(TensorSetSha256(lost->model), TensorSetSha256(reference[1].model));
  }
}

TEST(AdaptiveOptimizerTest, ACheckpointStateThatCannotBeTheirsIsRefusedNamingTheTensor) {
  const TensorSet w0 = Layout(1, 2, 3);
  auto adam = Make(AdaptiveSpec("fedadam"), w0);
  // FedAvgM's velocity: another strategy's state.
  Status other = adam->Restore({{"momentum/w", {2}, {0, 0}}, {"momentum/b", {1}, {0}}});
  EXPECT_EQ(other.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other.message().find("fedadam state in the checkpoint"), std::string::npos) << other.message();

  TensorSet negative = adam->state();
  negative[3].values[0] = -1;  // v/b
  Status s = adam->Restore(negative);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'v/b'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("never negative"), std::string::npos) << s.message();

  // A negative moment too small for six decimals is shown as it is, not as -0.000000.
  TensorSet tiny = adam->state();
  tiny[2].values[1] = -1e-30f;  // v/w
  s = adam->Restore(tiny);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'v/w' holds -1e-30 at index 1"), std::string::npos) << s.message();

  TensorSet nan = adam->state();
  nan[0].values[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(adam->Restore(nan).code(), StatusCode::kInvalidArgument);
  // Refusals left the fresh state in place.
  ExpectState(adam->state(), {0, 0, 0}, {1e-4f, 1e-4f, 1e-4f}, "after refusals");

  auto fedavg = Make(v1::JobSpec(), w0);
  Status stateless = fedavg->Restore(adam->state());
  EXPECT_NE(stateless.message().find("fedavg keeps no state"), std::string::npos) << stateless.message();
}

TEST(AdaptiveOptimizerTest, TheKnownStrategiesAreNamed) {
  const std::string known(KnownStrategies());
  for (const char* name : {"fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad"}) {
    EXPECT_NE(known.find(name), std::string::npos) << known;
    v1::JobSpec spec;
    spec.set_strategy(name);
    auto strategy = CreateStrategy(spec, Layout(0, 0, 0));
    ASSERT_TRUE(strategy.ok()) << name;
    EXPECT_EQ((*strategy)->name(), name);
  }
}

// A batch norm's running statistics are buffers: no optimiser steps them. They take the
// round's mean delta as FedAvg does (momentum or an adaptive step could carry a running
// variance below zero), while the parameters beside them take the optimiser's step as before.
TEST(ServerOptimizerTest, BuffersTakeTheMeanDeltaWhateverTheOptimiser) {
  for (const std::string name : {"fedadam", "fedyogi", "fedadagrad", "fedavgm"}) {
    v1::JobSpec spec = AdaptiveSpec(name);
    if (name == "fedavgm") {
      spec.clear_server();
      spec.mutable_server()->set_learning_rate(1.0);
      spec.mutable_server()->set_momentum(0.9);
    }
    auto plain = Make(spec, Layout(0, 0, 0));
    auto buffered = CreateStrategy(spec, Layout(0, 0, 0), {"b"});
    ASSERT_TRUE(buffered.ok()) << buffered.status().ToString();
    const std::vector<StrategyStep> stepped = TwoRounds(*plain);
    const std::vector<StrategyStep> kept = TwoRounds(**buffered);
    ASSERT_EQ(stepped.size(), 2u);
    ASSERT_EQ(kept.size(), 2u);
    // b starts at 3; the mean deltas are 1 and then -0.05.
    const float expected_b[] = {4.0f, 3.95f};
    for (size_t r = 0; r < 2; ++r) {
      const std::vector<float> a = Values(stepped[r].model), b = Values(kept[r].model);
      ASSERT_EQ(b.size(), 3u) << name;
      EXPECT_FLOAT_EQ(b[0], a[0]) << name << " round " << r + 1 << ": a parameter beside a buffer";
      EXPECT_FLOAT_EQ(b[1], a[1]) << name << " round " << r + 1 << ": a parameter beside a buffer";
      EXPECT_FLOAT_EQ(b[2], expected_b[r]) << name << " round " << r + 1 << ": the buffer";
      // (FedAvgM's first step at learning rate 1 is the mean itself: its momentum starts at 0.)
      if (name != "fedavgm" || r > 0) {
        EXPECT_NE(a[2], expected_b[r]) << name << " round " << r + 1 << ": the optimiser would have moved it otherwise";
      }
    }
  }
}

}  // namespace
}  // namespace tessera::server
