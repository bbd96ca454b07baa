// An exception thrown while an update is checked, before its fold: the update is refused in
// the round as well as to its worker, so the round stops waiting for it at once.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "server/jobs/round.h"
#include "server/strategy/strategy.h"
#include "small_tensors.h"

namespace tessera::server {
namespace {

using testing::Layout;

std::unique_ptr<Strategy> FedAvg(const TensorSet& layout) {
  v1::JobSpec spec;
  spec.set_strategy("fedavg");
  auto strategy = CreateStrategy(spec, layout);
  EXPECT_TRUE(strategy.ok()) << strategy.status().ToString();
  return std::move(strategy).value();
}

// FedAvg's aggregate, whose check of the header's claims throws for one worker.
class ThrowingClaims : public RoundAggregate {
 public:
  ThrowingClaims(std::unique_ptr<RoundAggregate> inner, std::string thrower)
      : inner_(std::move(inner)), thrower_(std::move(thrower)) {}
  Status Fold(const ClientUpdate& update) override { return inner_->Fold(update); }
  uint64_t updates() const override { return inner_->updates(); }
  Status CheckClaims(const ClientUpdate& update) const override {
    if (update.client == thrower_) throw std::runtime_error("claims check ran out of memory (test)");
    return inner_->CheckClaims(update);
  }

 private:
  std::unique_ptr<RoundAggregate> inner_;
  std::string thrower_;
};

std::string OutcomeOf(const Round& round, const std::string& worker) {
  v1::RoundRecord record;
  round.FillRecord(&record);
  for (const auto& report : record.workers()) {
    if (report.worker_id() == worker) return report.outcome();
  }
  return "(no report)";
}

class RoundExceptionTest : public ::testing::Test {
 protected:
  RoundExceptionTest() : global_(std::make_shared<const TensorSet>(Layout(1, 1, 1))), fedavg_(FedAvg(*global_)) {}

  std::unique_ptr<Round> Open(std::unique_ptr<RoundAggregate> aggregate) {
    auto round = std::make_unique<Round>("job-1", 4, 1, 3, global_, std::move(aggregate), 1);
    round->AddParticipant(0, {{"w1", 1}});
    round->AddParticipant(1, {{"w2", 1}});
    round->MarkDispatched();
    return round;
  }

  // w1's update was refused for what was thrown; w2's is accepted; the round is complete
  // with nothing pending, and its record says why w1's update was refused.
  void ExpectRefusedAndComplete(Round& round, const Status& s, const std::string& thrown) {
    EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
    EXPECT_NE(s.message().find("checking it failed: " + thrown), std::string::npos) << s.message();
    EXPECT_FALSE(round.IsPending("w1"));
    EXPECT_FALSE(round.Complete());  // w2 is still pending
    ASSERT_TRUE(round.Submit(testing::HeaderFor("w2", 10), Layout(2, 2, 2), 1).ok());
    EXPECT_TRUE(round.Complete());
    EXPECT_TRUE(round.WaitComplete(SteadyClock().Now()));
    EXPECT_EQ(OutcomeOf(round, "w1"), "rejected: checking it failed: " + thrown);
    // A second upload of the refused worker is refused as having reported.
    EXPECT_EQ(round.Admit(testing::HeaderFor("w1", 10)).code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(round.Close("test").empty());
    EXPECT_EQ(round.accepted(), 1u);
  }

  std::shared_ptr<const TensorSet> global_;
  std::unique_ptr<Strategy> fedavg_;
};

TEST_F(RoundExceptionTest, AnExceptionWhileTheReportIsFilledRefusesTheUpdateInTheRound) {
  auto round = Open(fedavg_->BeginRound(*global_));
  round->SetReportHook([] { throw std::runtime_error("no memory left (test)"); });
  Status s;
  EXPECT_NO_THROW(s = round->Submit(testing::HeaderFor("w1", 10), Layout(1, 1, 1), 1));
  round->SetReportHook(nullptr);
  ExpectRefusedAndComplete(*round, s, "no memory left (test)");
}

TEST_F(RoundExceptionTest, AnExceptionWhileATrainedModelIsReportedRefusesTheUpdateInTheRound) {
  auto round = Open(fedavg_->BeginRound(*global_));
  round->SetReportHook([] { throw 42; });
  v1::UpdateHeader h = testing::HeaderFor("w1", 10);
  h.set_trained_weights(true);
  TensorSet trained = Layout(2, 2, 2);
  Status s;
  EXPECT_NO_THROW(s = round->SubmitTrained(h, trained, 1));
  round->SetReportHook(nullptr);
  ExpectRefusedAndComplete(*round, s, "an exception of unknown type");
}

TEST_F(RoundExceptionTest, AnExceptionInTheChecksRefusesTheUpdateInTheRound) {
  auto round = Open(std::make_unique<ThrowingClaims>(fedavg_->BeginRound(*global_), "w1"));
  Status s;
  EXPECT_NO_THROW(s = round->Submit(testing::HeaderFor("w1", 10), Layout(1, 1, 1), 1));
  ExpectRefusedAndComplete(*round, s, "claims check ran out of memory (test)");
}

}  // namespace
}  // namespace tessera::server
