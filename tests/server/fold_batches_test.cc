// The mean's batched fold: updates of a large model handed over with their buffers wait and
// fold together a block of the sums at a time, to the same bits as one after another; small
// models fold at once; the round hands over only what it folds as it came.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "server/jobs/round.h"
#include "server/strategy/aggregation.h"
#include "server/strategy/strategy.h"
#include "small_tensors.h"

namespace tessera::server {
namespace {

using testing::HeaderFor;
using testing::Layout;

std::unique_ptr<Strategy> Make(const std::string& strategy, const TensorSet& layout) {
  v1::JobSpec spec;
  spec.set_strategy(strategy);
  auto made = CreateStrategy(spec, layout);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  return std::move(made).value();
}

// An update whose delta is handed over waits, once counted, to be folded with others a block
// of the sums at a time (models of 1 MiB and more). The sums must come out the same to the
// bit as folding one update after another in the same order: values that round differently
// in any other order, a tensor longer than a block and not a multiple of it, and more updates
// than a batch so that some fold in batches and the rest when the round combines.
TEST(FedAvgTest, HandedDeltasFoldInBatchesToTheSameBitsAndTheirBuffersComeBack) {
  const size_t n = 300007;
  const TensorSet layout = {{"big", {n}, std::vector<float>(n, 0.0f)}, {"small", {3}, {0, 0, 0}}};
  auto one_by_one = OpenAggregate(AggregationOptions{}, layout);
  auto handed = OpenAggregate(AggregationOptions{}, layout);
  FloatBufferPool pool(uint64_t{1} << 30);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const int updates = 21;
  for (int u = 0; u < updates; ++u) {
    TensorSet delta = layout;
    for (auto& t : delta) {
      // Magnitudes from 2^-30 to 2^10, both signs: the double sums round, so their order shows.
      for (float& v : t.values) {
        const uint64_t r = next();
        const float m = 1.0f + static_cast<float>(r & 0x7FFFFF) / 8388608.0f;
        v = std::ldexp((r >> 63) ? -m : m, static_cast<int>((r >> 23) % 41) - 30);
      }
    }
    const uint64_t samples = next() % 999983 + 1;
    ClientUpdate update;
    update.client = "w" + std::to_string(u);
    update.samples = samples;
    update.delta = &delta;
    ASSERT_TRUE(one_by_one->Fold(update).ok());
    update.handed = HandedDelta{&delta, &pool};
    ASSERT_TRUE(handed->Fold(update).ok());
    EXPECT_TRUE(delta.empty()) << "update " << u << ": the aggregate took its buffers";
  }
  EXPECT_EQ(handed->updates(), static_cast<uint64_t>(updates));
  // The batches folded so far gave their buffers back; the updates still waiting did not.
  const uint64_t update_bytes = (n + 3) * sizeof(float);
  EXPECT_GT(pool.idle_bytes(), 0u);
  EXPECT_EQ(pool.idle_bytes() % update_bytes, 0u);
  EXPECT_LT(pool.idle_bytes(), updates * update_bytes);
  auto combine = [](const DeltaAggregate& aggregate) {
    std::vector<std::vector<double>> got;
    EXPECT_TRUE(aggregate.Combine([&](size_t, const std::vector<double>& delta) { got.push_back(delta); }).ok());
    return got;
  };
  const auto want = combine(*one_by_one);
  const auto got = combine(*handed);
  EXPECT_EQ(pool.idle_bytes(), updates * update_bytes) << "every buffer back once combined";
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size());
    EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(double)), 0) << "tensor " << i;
  }
  // Combining again gives the same values.
  const auto again = combine(*handed);
  ASSERT_EQ(again.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(again[i], got[i]);
}

// A small model's sums stay in the caches: its updates fold at once, and their buffers stay
// with the caller.
TEST(FedAvgTest, ASmallModelsUpdatesFoldAtOnceAndAreNotTaken) {
  FloatBufferPool pool(uint64_t{1} << 30);
  auto aggregate = OpenAggregate(AggregationOptions{}, Layout(0, 0, 0));
  TensorSet delta = Layout(1, 2, 3);
  ClientUpdate update;
  update.client = "w";
  update.samples = 1;
  update.delta = &delta;
  update.handed = HandedDelta{&delta, &pool};
  ASSERT_TRUE(aggregate->Fold(update).ok());
  ASSERT_EQ(delta.size(), 2u);
  EXPECT_FLOAT_EQ(delta[0].values[1], 2.0f);
  EXPECT_EQ(pool.idle_bytes(), 0u);
}

// Handed deltas from many threads at once: every update folded exactly once, whichever thread
// folds its batch (integer values, whose sums are exact in any order).
TEST(FedAvgTest, ConcurrentHandedFoldsTakeEveryUpdateOnce) {
  const size_t n = 300007;
  TensorSet global = {{"big", {n}, std::vector<float>(n, 0.0f)}, {"small", {3}, {0, 0, 0}}};
  auto fedavg = Make("fedavg", global);
  auto agg = fedavg->BeginRound(global);
  FloatBufferPool pool(uint64_t{1} << 30);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 12; ++i) {
        TensorSet delta = {{"big", {n}, pool.Take(n)}, {"small", {3}, pool.Take(3)}};
        for (size_t j = 0; j < n; ++j) delta[0].values[j] = static_cast<float>((t + 1) * (j % 7 + 1));
        for (size_t j = 0; j < 3; ++j) delta[1].values[j] = static_cast<float>((t + 1) * (j + 1));
        ClientUpdate update;
        update.client = "w";
        update.samples = static_cast<uint64_t>(t % 2 + 1);
        update.delta = &delta;
        update.handed = HandedDelta{&delta, &pool};
        EXPECT_TRUE(agg->Fold(update).ok());
        pool.Give(std::move(delta));  // what the aggregate left: nothing
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(agg->updates(), 96u);
  auto next = fedavg->Finish(global, *agg);
  ASSERT_TRUE(next.ok());
  const double k = 56.0 / 12.0;  // as in ConcurrentFoldsTakeEveryUpdateOnceAtEveryOffset
  for (size_t j = 0; j < n; ++j) ASSERT_FLOAT_EQ(next->model[0].values[j], static_cast<float>(k * (j % 7 + 1))) << j;
  for (size_t j = 0; j < 3; ++j) EXPECT_FLOAT_EQ(next->model[1].values[j], static_cast<float>(k * (j + 1)));
}

// The round hands an update's buffers to the aggregate only when the update is folded as it
// came: a clipped update is folded from its clipped copy, and its own buffers stay with the
// caller; a refused one is never taken.
TEST(RoundBoundsTest, OnlyAnUpdateFoldedAsItCameIsTakenFromItsCaller) {
  const size_t n = 300007;  // large enough for the mean to keep updates to fold together
  auto with = [n](float a, float b) {
    TensorSet set = {{"w", {n}, std::vector<float>(n, 0.0f)}};
    set[0].values[0] = a;
    set[0].values[1] = b;
    return set;
  };
  auto global = std::make_shared<const TensorSet>(with(0, 0));
  auto fedavg = Make("fedavg", *global);
  Round round("job-1", 4, 1, 3, global, fedavg->BeginRound(*global), 1, {}, /*max_update_norm=*/10,
              Round::NormPolicy::kClip);
  round.AddParticipant(0, {{"w1", 1}});
  round.AddParticipant(1, {{"w2", 1}});
  round.AddParticipant(2, {{"w3", 1}});
  FloatBufferPool pool(uint64_t{1} << 30);
  auto hand = [&](TensorSet& set) { return HandedDelta{&set, &pool}; };
  TensorSet plain = with(3, 4);  // norm 5: folded as it came
  ASSERT_TRUE(round.Submit(HeaderFor("w1", 10), plain, 1, nullptr, 0, nullptr, hand(plain)).ok());
  EXPECT_TRUE(plain.empty());
  TensorSet large = with(30, 40);  // norm 50: clipped to 10
  ASSERT_TRUE(round.Submit(HeaderFor("w2", 10), large, 1, nullptr, 0, nullptr, hand(large)).ok());
  ASSERT_EQ(large.size(), 1u);
  EXPECT_FLOAT_EQ(large[0].values[1], 40.0f);
  TensorSet nan = with(std::numeric_limits<float>::quiet_NaN(), 0);
  EXPECT_FALSE(round.Submit(HeaderFor("w3", 10), nan, 1, nullptr, 0, nullptr, hand(nan)).ok());
  EXPECT_EQ(nan.size(), 1u);
  round.Close("test");
  EXPECT_EQ(pool.idle_bytes(), 0u);  // w1's update waits for others
  auto next = round.Finish(*fedavg);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(pool.idle_bytes(), n * sizeof(float));  // folded when the round combined: w1's alone
  // (3, 4) and the clipped (6, 8), equally weighted.
  EXPECT_FLOAT_EQ(next->model[0].values[0], 4.5f);
  EXPECT_FLOAT_EQ(next->model[0].values[1], 6.0f);
}

}  // namespace
}  // namespace tessera::server
