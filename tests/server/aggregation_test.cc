// Strategy arithmetic (FedAvg, FedAvgM) against hand-computed values, and their state. The
// round's checks of the updates it takes are in round_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>

#include "proto/tensor_transfer.h"
#include "server/strategy/strategy.h"
#include "small_tensors.h"

namespace tessera::server {
namespace {

using testing::Layout;

v1::JobSpec Spec(const std::string& strategy, double server_lr = 0, double server_momentum = 0) {
  v1::JobSpec spec;
  spec.set_strategy(strategy);
  spec.mutable_server()->set_learning_rate(server_lr);
  spec.mutable_server()->set_momentum(server_momentum);
  return spec;
}

std::unique_ptr<Strategy> Make(const v1::JobSpec& spec, const TensorSet& layout) {
  auto strategy = CreateStrategy(spec, layout);
  EXPECT_TRUE(strategy.ok()) << strategy.status().ToString();
  return std::move(strategy).value();
}

Status Fold(RoundAggregate& aggregate, const TensorSet& delta, uint64_t samples) {
  ClientUpdate update;
  update.client = "w";
  update.samples = samples;
  update.delta = &delta;
  return aggregate.Fold(update);
}

TEST(FedAvgTest, WeightsDeltasBySampleCount) {
  const TensorSet global = Layout(1, 2, 3);
  auto fedavg = Make(Spec("fedavg"), global);
  auto agg = fedavg->BeginRound(global);
  ASSERT_TRUE(Fold(*agg, Layout(1, 0, -2), 1).ok());
  ASSERT_TRUE(Fold(*agg, Layout(-1, 4, 2), 3).ok());
  EXPECT_EQ(agg->updates(), 2u);
  auto next = fedavg->Finish(global, *agg);
  ASSERT_TRUE(next.ok());
  // (1*1 + 3*-1)/4 = -0.5; (0 + 12)/4 = 3; (-2 + 6)/4 = 1
  EXPECT_FLOAT_EQ(next->model[0].values[0], 0.5f);
  EXPECT_FLOAT_EQ(next->model[0].values[1], 5.0f);
  EXPECT_FLOAT_EQ(next->model[1].values[0], 4.0f);
  EXPECT_TRUE(next->state.empty());
}

TEST(FedAvgTest, OneUpdateIsAppliedWhole) {
  const TensorSet global = Layout(0, 0, 0);
  auto fedavg = Make(Spec("fedavg"), global);
  auto agg = fedavg->BeginRound(global);
  ASSERT_TRUE(Fold(*agg, Layout(0.25f, -0.5f, 7), 17).ok());
  auto next = fedavg->Finish(global, *agg);
  ASSERT_TRUE(next.ok());
  EXPECT_FLOAT_EQ(next->model[0].values[0], 0.25f);
  EXPECT_FLOAT_EQ(next->model[0].values[1], -0.5f);
  EXPECT_FLOAT_EQ(next->model[1].values[0], 7.0f);
}

TEST(FedAvgTest, RefusesZeroWeightOverflowAndNothingToApply) {
  const TensorSet global = Layout(0, 0, 0);
  auto fedavg = Make(Spec("fedavg"), global);
  auto agg = fedavg->BeginRound(global);
  EXPECT_EQ(Fold(*agg, Layout(1, 1, 1), 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fedavg->Finish(global, *agg).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Fold(*agg, Layout(1, 1, 1), std::numeric_limits<uint64_t>::max() - 1).ok());
  Status overflow = Fold(*agg, Layout(1, 1, 1), 2);
  EXPECT_EQ(overflow.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(overflow.message().find("overflows"), std::string::npos) << overflow.message();
  EXPECT_EQ(agg->updates(), 1u);  // the refused update left the aggregate as it was
}

// A scale out of (0, 1] is refused naming it with its significant digits: a tiny one is not
// shown as 0.
TEST(FedAvgTest, RefusesAScaleOutOfRangeNamingIt) {
  const TensorSet global = Layout(0, 0, 0);
  auto fedavg = Make(Spec("fedavg"), global);
  auto agg = fedavg->BeginRound(global);
  const TensorSet delta = Layout(1, 1, 1);
  ClientUpdate update;
  update.client = "w";
  update.samples = 1;
  update.delta = &delta;
  update.scale = -1e-9;
  const Status refused = agg->Fold(update);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("its scale -1e-09 is not in (0, 1]"), std::string::npos) << refused.message();
  EXPECT_EQ(agg->updates(), 0u);
}

TEST(FedAvgTest, ConcurrentFoldsAddUp) {
  TensorSet global = {{"big", {4096}, std::vector<float>(4096, 0.0f)}};
  auto fedavg = Make(Spec("fedavg"), global);
  auto agg = fedavg->BeginRound(global);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      TensorSet delta = {{"big", {4096}, std::vector<float>(4096, static_cast<float>(t + 1))}};
      for (int i = 0; i < 25; ++i) EXPECT_TRUE(Fold(*agg, delta, 2).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(agg->updates(), 200u);
  auto next = fedavg->Finish(global, *agg);
  ASSERT_TRUE(next.ok());
  for (float v : next->model[0].values) ASSERT_FLOAT_EQ(v, 4.5f);  // mean of 1..8
}

// Concurrent folds of two tensors, one of them longer than any vector or block a fold may
// work in: every value must take every update exactly once. Integer values with integer
// weights keep the sums exact in any order, so the mean is known.
TEST(FedAvgTest, ConcurrentFoldsTakeEveryUpdateOnceAtEveryOffset) {
  const size_t n = 5003;
  TensorSet global = {{"big", {n}, std::vector<float>(n, 0.0f)}, {"small", {3}, {0, 0, 0}}};
  auto fedavg = Make(Spec("fedavg"), global);
  auto agg = fedavg->BeginRound(global);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      TensorSet delta = {{"big", {n}, std::vector<float>(n)}, {"small", {3}, {1, 2, 3}}};
      for (size_t j = 0; j < n; ++j) delta[0].values[j] = static_cast<float>((t + 1) * (j % 7 + 1));
      for (float& v : delta[1].values) v *= static_cast<float>(t + 1);
      for (int i = 0; i < 40; ++i) EXPECT_TRUE(Fold(*agg, delta, static_cast<uint64_t>(t % 2 + 1)).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(agg->updates(), 320u);
  auto next = fedavg->Finish(global, *agg);
  ASSERT_TRUE(next.ok());
  // Weights 1 for t even, 2 for t odd: sum of w(t+1) = 1+4+3+8+5+12+7+16 = 56 over a total
  // weight of 12, so the mean is 56/12 of each value's multiplier.
  const double k = 56.0 / 12.0;
  for (size_t j = 0; j < n; ++j) ASSERT_FLOAT_EQ(next->model[0].values[j], static_cast<float>(k * (j % 7 + 1))) << j;
  for (size_t j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(next->model[1].values[j], static_cast<float>(k * (j + 1)));
}

TEST(FedAvgTest, UnknownStrategyIsNamed) {
  auto strategy = CreateStrategy(Spec("fedmagic"), Layout(0, 0, 0));
  EXPECT_EQ(strategy.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(strategy.status().message().find("fedmagic"), std::string::npos);
  EXPECT_NE(strategy.status().message().find("fedavgm"), std::string::npos);
}

TEST(FedAvgTest, RefusesAStateItDoesNotKeep) {
  auto fedavg = Make(Spec("fedavg"), Layout(0, 0, 0));
  Status s = fedavg->Restore({{"momentum/w", {2}, {0, 0}}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("fedavg keeps no state"), std::string::npos) << s.message();
}

TEST(FedAvgMTest, ServerMomentumByHand) {
  // lr 0.5, momentum 0.9. Round 1: mean delta d1 = (2, -4, 1); v1 = d1; w1 = w0 + 0.5 v1.
  // Round 2: mean delta d2 = (1, 1, 1); v2 = 0.9 v1 + d2 = (2.8, -2.6, 1.9); w2 = w1 + 0.5 v2.
  const TensorSet w0 = Layout(1, 1, 1);
  auto fedavgm = Make(Spec("fedavgm", 0.5, 0.9), w0);
  auto agg1 = fedavgm->BeginRound(w0);
  ASSERT_TRUE(Fold(*agg1, Layout(4, -8, 2), 1).ok());  // mean over weights 1 and 1
  ASSERT_TRUE(Fold(*agg1, Layout(0, 0, 0), 1).ok());
  auto step1 = fedavgm->Finish(w0, *agg1);
  ASSERT_TRUE(step1.ok());
  EXPECT_FLOAT_EQ(step1->model[0].values[0], 2.0f);
  EXPECT_FLOAT_EQ(step1->model[0].values[1], -1.0f);
  EXPECT_FLOAT_EQ(step1->model[1].values[0], 1.5f);
  ASSERT_EQ(step1->state.size(), 2u);
  EXPECT_EQ(step1->state[0].name, "momentum/w");
  EXPECT_FLOAT_EQ(step1->state[0].values[1], -4.0f);
  // Finish does not change the strategy until the step is adopted.
  EXPECT_FLOAT_EQ(fedavgm->state()[0].values[1], 0.0f);
  fedavgm->Adopt(step1->state);

  auto agg2 = fedavgm->BeginRound(step1->model);
  ASSERT_TRUE(Fold(*agg2, Layout(1, 1, 1), 5).ok());
  auto step2 = fedavgm->Finish(step1->model, *agg2);
  ASSERT_TRUE(step2.ok());
  EXPECT_FLOAT_EQ(step2->state[0].values[0], 2.8f);
  EXPECT_FLOAT_EQ(step2->state[0].values[1], -2.6f);
  EXPECT_FLOAT_EQ(step2->state[1].values[0], 1.9f);
  EXPECT_FLOAT_EQ(step2->model[0].values[0], 2.0f + 1.4f);
  EXPECT_FLOAT_EQ(step2->model[0].values[1], -1.0f - 1.3f);
  EXPECT_FLOAT_EQ(step2->model[1].values[0], 1.5f + 0.95f);
}

TEST(FedAvgMTest, StateSurvivesTheCheckpointAndAWrongOneIsRefused) {
  const TensorSet w0 = Layout(1, 1, 1);
  auto a = Make(Spec("fedavgm", 1.0, 0.5), w0);
  auto agg = a->BeginRound(w0);
  ASSERT_TRUE(Fold(*agg, Layout(1, 2, 3), 1).ok());
  auto step = a->Finish(w0, *agg);
  ASSERT_TRUE(step.ok());
  a->Adopt(step->state);

  // What the checkpoint holds, and what a restarted coordinator makes of it.
  TensorSet checkpoint = JoinModelAndState(step->model, a->state());
  ASSERT_EQ(checkpoint.size(), 4u);
  EXPECT_EQ(checkpoint[2].name, "strategy/momentum/w");
  TensorSet state;
  TensorSet model = SplitModelAndState(checkpoint, &state);
  EXPECT_EQ(TensorSetSha256(model), TensorSetSha256(step->model));
  auto b = Make(Spec("fedavgm", 1.0, 0.5), model);
  ASSERT_TRUE(b->Restore(state).ok());
  EXPECT_EQ(TensorSetSha256(b->state()), TensorSetSha256(a->state()));

  Status wrong = b->Restore({{"momentum/w", {3}, {0, 0, 0}}, {"momentum/b", {1}, {0}}});
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("fedavgm state"), std::string::npos) << wrong.message();
}

}  // namespace
}  // namespace tessera::server
