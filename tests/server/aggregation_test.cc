// FedAvg arithmetic and the round's refusal of bad updates.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "server/round.h"
#include "server/update_aggregator.h"

namespace tessera::server {
namespace {

TensorSet Layout(float a, float b, float c) {
  return {{"w", {2}, {a, b}}, {"b", {1}, {c}}};
}

TEST(FedAvgTest, WeightsDeltasBySampleCount) {
  const TensorSet global = Layout(1, 2, 3);
  FedAvgAggregator agg(global);
  ASSERT_TRUE(agg.Add(Layout(1, 0, -2), 1).ok());
  ASSERT_TRUE(agg.Add(Layout(-1, 4, 2), 3).ok());
  EXPECT_EQ(agg.updates(), 2u);
  auto next = agg.Apply(global);
  ASSERT_TRUE(next.ok());
  // (1*1 + 3*-1)/4 = -0.5; (0 + 12)/4 = 3; (-2 + 6)/4 = 1
  EXPECT_FLOAT_EQ((*next)[0].values[0], 0.5f);
  EXPECT_FLOAT_EQ((*next)[0].values[1], 5.0f);
  EXPECT_FLOAT_EQ((*next)[1].values[0], 4.0f);
}

TEST(FedAvgTest, OneUpdateIsAppliedWhole) {
  const TensorSet global = Layout(0, 0, 0);
  FedAvgAggregator agg(global);
  ASSERT_TRUE(agg.Add(Layout(0.25f, -0.5f, 7), 17).ok());
  auto next = agg.Apply(global);
  ASSERT_TRUE(next.ok());
  EXPECT_FLOAT_EQ((*next)[0].values[0], 0.25f);
  EXPECT_FLOAT_EQ((*next)[0].values[1], -0.5f);
  EXPECT_FLOAT_EQ((*next)[1].values[0], 7.0f);
}

TEST(FedAvgTest, RefusesZeroWeightAndNothingToApply) {
  const TensorSet global = Layout(0, 0, 0);
  FedAvgAggregator agg(global);
  EXPECT_EQ(agg.Add(Layout(1, 1, 1), 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(agg.Apply(global).status().code(), StatusCode::kFailedPrecondition);
}

TEST(FedAvgTest, UnknownStrategyIsNamed) {
  auto agg = CreateAggregator("fedmagic", Layout(0, 0, 0));
  EXPECT_EQ(agg.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(agg.status().message().find("fedmagic"), std::string::npos);
}

class RoundTest : public ::testing::Test {
 protected:
  RoundTest() {
    global_ = std::make_shared<const TensorSet>(Layout(1, 1, 1));
    round_ = std::make_unique<Round>("job-1", 4, 1, 3, global_, std::make_unique<FedAvgAggregator>(*global_), 1);
    round_->AddParticipant(0, {{"w1", 1}});
    round_->AddParticipant(1, {{"w2", 1}});
    round_->AddParticipant(2, {{"w3", 1}});
  }
  v1::UpdateHeader Header(const std::string& worker) {
    v1::UpdateHeader h;
    h.set_worker_id(worker);
    h.set_job_id("job-1");
    h.set_round(4);
    h.set_attempt(1);
    h.set_base_model_version(3);
    h.set_samples(10);
    return h;
  }
  std::shared_ptr<const TensorSet> global_;
  std::unique_ptr<Round> round_;
};

TEST_F(RoundTest, RefusesAWrongShapeAndLeavesTheAggregateUntouched) {
  TensorSet wrong = {{"w", {3}, {1, 1, 1}}, {"b", {1}, {1}}};
  Status s = round_->Submit(Header("w1"), wrong, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("w1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("round 4"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("expected shape [2], got [3]"), std::string::npos) << s.message();
  ASSERT_TRUE(round_->Submit(Header("w2"), Layout(2, 2, 2), 1).ok());
  auto next = round_->ApplyAggregate();
  ASSERT_TRUE(next.ok());
  EXPECT_FLOAT_EQ((*next)[0].values[0], 3.0f);  // only w2's delta
  EXPECT_EQ(round_->accepted(), 1u);
}

TEST_F(RoundTest, RefusesNaNAndInfinity) {
  TensorSet nan = Layout(0, std::numeric_limits<float>::quiet_NaN(), 0);
  Status s = round_->Submit(Header("w1"), nan, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("NaN"), std::string::npos) << s.message();
  TensorSet inf = Layout(0, 0, std::numeric_limits<float>::infinity());
  s = round_->Submit(Header("w2"), inf, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("infinite"), std::string::npos) << s.message();
  EXPECT_EQ(round_->accepted(), 0u);
  EXPECT_EQ(round_->ApplyAggregate().status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(RoundTest, RefusesPastRoundsStaleModelsStrangersAndRepeats) {
  auto past = Header("w1");
  past.set_round(3);
  Status s = round_->Admit(past);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("past round"), std::string::npos) << s.message();

  auto stale = Header("w1");
  stale.set_base_model_version(2);
  EXPECT_NE(round_->Admit(stale).message().find("expected version 3"), std::string::npos);

  EXPECT_NE(round_->Admit(Header("w9")).message().find("not selected"), std::string::npos);

  auto empty = Header("w1");
  empty.set_samples(0);
  EXPECT_EQ(round_->Admit(empty).code(), StatusCode::kInvalidArgument);

  ASSERT_TRUE(round_->Submit(Header("w1"), Layout(0, 0, 0), 1).ok());
  EXPECT_NE(round_->Admit(Header("w1")).message().find("already reported"), std::string::npos);
}

TEST_F(RoundTest, ClosingDropsThePendingAndRefusesLateUpdates) {
  ASSERT_TRUE(round_->Submit(Header("w1"), Layout(0, 0, 0), 1).ok());
  auto dropped = round_->Close("deadline passed");
  EXPECT_EQ(dropped, (std::vector<std::string>{"w2", "w3"}));
  EXPECT_NE(round_->Admit(Header("w2")).message().find("closed"), std::string::npos);
  v1::RoundRecord record;
  round_->FillRecord(&record);
  EXPECT_EQ(record.clients_selected(), 3u);
  EXPECT_EQ(record.clients_reported(), 1u);
}

TEST_F(RoundTest, LostWorkersAreDroppedAtOnce) {
  const size_t pending = round_->DropLost([](const std::string& id, uint64_t) { return id != "w2"; });
  EXPECT_EQ(pending, 2u);
  EXPECT_NE(round_->Admit(Header("w2")).message().find("already reported"), std::string::npos);
}

}  // namespace
}  // namespace tessera::server
