// The server sides of FedProx, FedNova and SCAFFOLD against hand-computed values: FedNova's
// normalised aggregation and its refusal of claims out of range; SCAFFOLD's model and
// control variate updates with client sub-sampling, its per-party state through a
// checkpoint, its downloads, the round's refusal of an update without its variate or with a
// change no client could have computed from its delta; both giving a model's buffers FedAvg's
// sample-weighted mean.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/train/client_algorithms.h"
#include "proto/tensor_transfer.h"
#include "proto/update_envelope.h"
#include "server/jobs/participant_models.h"
#include "server/jobs/round.h"
#include "server/strategy/strategy.h"
#include "tests/server/small_tensors.h"

namespace tessera::server {
namespace {

using testing::Layout;
using testing::Values;

void ExpectValues(const TensorSet& set, const std::vector<float>& expected, const std::string& what) {
  const std::vector<float> got = Values(set);
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-6) << what << " value " << i;
}

v1::JobSpec Spec(const std::string& strategy, uint32_t parties = 4) {
  v1::JobSpec spec;
  spec.set_strategy(strategy);
  spec.set_local_epochs(10);
  spec.set_batch_size(1);
  spec.mutable_optimizer()->set_learning_rate(0.1);
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.mutable_data()->mutable_partition()->set_parties(parties);
  if (strategy == "fedprox") spec.set_proximal_mu(0.01);
  return spec;
}

// `buffers`: the names of the model's buffers (CreateStrategy's).
std::unique_ptr<Strategy> Make(const v1::JobSpec& spec, const TensorSet& layout,
                               const std::vector<std::string>& buffers = {}) {
  auto strategy = CreateStrategy(spec, layout, buffers);
  EXPECT_TRUE(strategy.ok()) << strategy.status().ToString();
  return std::move(strategy).value();
}

ClientUpdate Update(const TensorSet& delta, uint64_t samples, uint64_t steps, double normalizer, uint32_t party = 0,
                    const std::map<std::string, TensorSet>* payload = nullptr) {
  ClientUpdate update;
  update.client = "w" + std::to_string(party);
  update.party = party;
  update.samples = samples;
  update.local_steps = steps;
  update.step_normalizer = normalizer;
  update.delta = &delta;
  update.payload = payload;
  return update;
}

TEST(FedProxStrategyTest, TheServerSideIsFedAvg) {
  const TensorSet global = Layout(1, 2, 3);
  auto fedprox = Make(Spec("fedprox"), global);
  EXPECT_EQ(fedprox->name(), "fedprox");
  auto agg = fedprox->BeginRound(global);
  const TensorSet a = Layout(1, 0, -2), b = Layout(-1, 4, 2);
  ASSERT_TRUE(agg->Fold(Update(a, 1, 1, 1)).ok());
  ASSERT_TRUE(agg->Fold(Update(b, 3, 1, 1)).ok());
  auto next = fedprox->Finish(global, *agg);
  ASSERT_TRUE(next.ok());
  ExpectValues(next->model, {0.5f, 5.0f, 4.0f}, "fedprox model");  // as FedAvgTest's
  EXPECT_TRUE(fedprox->Restore({{"x", {1}, {0}}}).message().find("fedprox keeps no state") != std::string::npos);
}

// FedNova's round by hand, over x = (1, 1, 1) with `buffers` named: client A has 1 sample,
// a = 2, delta (2, 4, -2); client B 3 samples, a = 4, delta (4, 0, 8).
Result<StrategyStep> FedNovaRoundByHand(const std::vector<std::string>& buffers) {
  const TensorSet global = Layout(1, 1, 1);
  auto fednova = Make(Spec("fednova"), global, buffers);
  auto agg = fednova->BeginRound(global);
  RETURN_IF_ERROR(agg->Fold(Update(Layout(2, 4, -2), 1, 2, 2.0)));
  RETURN_IF_ERROR(agg->Fold(Update(Layout(4, 0, 8), 3, 4, 4.0)));
  return fednova->Finish(global, *agg);
}

TEST(FedNovaStrategyTest, NormalisedAggregationByHand) {
  // x = (1, 1, 1). Client A: 1 sample, a = 2, delta (2, 4, -2); client B: 3 samples, a = 4,
  // delta (4, 0, 8). p = (1/4, 3/4); d_A = (1, 2, -1), d_B = (1, 0, 2);
  // sum p d = (1, 0.5, 1.25); tau_eff = 1/4 * 2 + 3/4 * 4 = 3.5; x' = x + 3.5 (1, 0.5, 1.25).
  auto next = FedNovaRoundByHand({});
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  ExpectValues(next->model, {4.5f, 2.75f, 5.375f}, "fednova model");
  EXPECT_TRUE(next->state.empty());
  // FedAvg would have given (4.5, 2, 6.5): the client with more steps weighs less here.

  // Equal normalisers: exactly FedAvg's sample-weighted mean.
  const TensorSet global = Layout(1, 1, 1);
  auto fednova = Make(Spec("fednova"), global);
  auto equal = fednova->BeginRound(global);
  ASSERT_TRUE(equal->Fold(Update(Layout(2, 4, -2), 1, 3, 3.0)).ok());
  ASSERT_TRUE(equal->Fold(Update(Layout(4, 0, 8), 3, 3, 3.0)).ok());
  auto averaged = fednova->Finish(global, *equal);
  ASSERT_TRUE(averaged.ok());
  ExpectValues(averaged->model, {4.5f, 2.0f, 6.5f}, "fednova with equal a_i");
}

TEST(FedNovaStrategyTest, ClaimsOutOfRangeAreRefusedNamingTheField) {
  const TensorSet global = Layout(0, 0, 0);
  auto fednova = Make(Spec("fednova"), global);  // 10 epochs, batch 1, momentum 0.9
  auto agg = fednova->BeginRound(global);
  const TensorSet d = Layout(1, 1, 1);
  struct Case {
    uint64_t samples, steps;
    double normalizer;
    const char* expected;
  };
  for (const Case& c : {Case{5, 0, 1.0, "field 'local_steps': fednova needs the update's local steps; expected an "
                                          "integer in [1, 50]"},
                        Case{5, 51, 51.0, "field 'local_steps'"},
                        Case{5, 4, 3.9, "field 'step_normalizer': expected FedNova's a_i for 4 local steps at momentum "
                                        "0.9, a number in [4, 40], got 3.9"},
                        Case{5, 4, 41.0, "field 'step_normalizer'"},
                        Case{5, 4, std::numeric_limits<double>::quiet_NaN(), "field 'step_normalizer'"}}) {
    Status s = agg->CheckClaims(Update(d, c.samples, c.steps, c.normalizer));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.expected;
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << s.message();
    EXPECT_FALSE(agg->Fold(Update(d, c.samples, c.steps, c.normalizer)).ok()) << c.expected;
  }
  EXPECT_EQ(agg->updates(), 0u);
  EXPECT_TRUE(agg->CheckClaims(Update(d, 5, 4, 5.61 + 1.0)).ok());
}

// A worker trains with the spec's momentum as a float and computes a_i at it: 0.99 is
// 0.9900000095 there, so after tau = 1.04e8 steps (1000 epochs of 104000 samples in batches of
// 1) a_i = tau / q - rho (1 - rho^tau) / q^2 with q = 9.9999905e-3 is 10400000018.2, above
// tau / 0.01 = 1.04e10 (and its slack of 10.4) but below tau / q = 10400009918.2.
TEST(FedNovaStrategyTest, TheNormaliserIsBoundedAtTheMomentumTheWorkerTrainsWith) {
  v1::JobSpec spec = Spec("fednova");
  spec.set_local_epochs(1000);
  spec.mutable_optimizer()->set_momentum(0.99);
  const TensorSet global = Layout(0, 0, 0);
  auto fednova = Make(spec, global);
  auto agg = fednova->BeginRound(global);
  const uint64_t steps = 104000000;
  const double reported = FedNovaNormalizer(steps, static_cast<float>(0.99)).value();
  EXPECT_NEAR(reported, 10400000018.2, 0.1);
  const TensorSet d = Layout(1, 1, 1);
  Status s = agg->CheckClaims(Update(d, 104000, steps, reported));
  EXPECT_TRUE(s.ok()) << s.ToString();
  // Past tau / q it is refused still.
  EXPECT_FALSE(agg->CheckClaims(Update(d, 104000, steps, 10400009918.3 + 11)).ok());
}

// Six digits print the bound and a claim just past it alike (1.04e+10, 1.04e+10): the message
// then gives as many as tell them apart. The bound is 1.04e8 / (1 - 0.99 as a float).
TEST(FedNovaStrategyTest, ARefusedNormaliserIsToldApartFromItsBound) {
  v1::JobSpec spec = Spec("fednova");
  spec.set_local_epochs(1000);
  spec.mutable_optimizer()->set_momentum(0.99);
  const TensorSet global = Layout(0, 0, 0);
  auto agg = Make(spec, global)->BeginRound(global);
  const TensorSet d = Layout(1, 1, 1);
  Status s = agg->CheckClaims(Update(d, 104000, 104000000, 10400009929.3));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a number in [1.04e+08, 10400009918.22235], got 10400009929.3"), std::string::npos)
      << s.message();
  // Figures that differ in six digits keep them.
  s = agg->CheckClaims(Update(d, 104000, 4, 401));
  EXPECT_NE(s.message().find("at momentum 0.99, a number in [4, 400], got 401"), std::string::npos) << s.message();
}

TEST(FedNovaStrategyTest, TheRoundRefusesABadClaimAtTheHeader) {
  auto global = std::make_shared<const TensorSet>(Layout(0, 0, 0));
  auto fednova = Make(Spec("fednova"), *global);
  Round round("job-1", 1, 1, 0, global, fednova->BeginRound(*global), 1, fednova->PayloadSets());
  round.AddParticipant(0, {{"w1", 1}});
  v1::UpdateHeader h;
  h.set_worker_id("w1");
  h.set_job_id("job-1");
  h.set_round(1);
  h.set_attempt(1);
  h.set_samples(5);
  h.set_local_steps(4);
  h.set_step_normalizer(400);
  Status s = round.Admit(h);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("update from worker 'w1' for job job-1 round 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("field 'step_normalizer'"), std::string::npos) << s.message();
  h.set_step_normalizer(FedNovaNormalizer(4, 0.9).value());  // what a worker reports: 9.049
  EXPECT_TRUE(round.Admit(h).ok());
}

// ---- SCAFFOLD ----

std::map<std::string, TensorSet> ControlDelta(const TensorSet& change) { return {{"control_delta", change}}; }

TEST(ScaffoldStrategyTest, ModelAndControlVariatesByHandWithSubSampling) {
  // N = 4 parties. Round 1 takes parties 0 and 2 from x = (1, 1, 1), c = 0:
  //   party 0: dy = (2, 0, -2), dc = (0.4, 0, 0.8);  party 2: dy = (0, 4, 2), dc = (-0.4, 0.8, 0.4).
  //   x <- x + mean dy = (2, 3, 1);  c <- c + (1/4) sum dc = (0, 0.2, 0.3);  c_0, c_2 = their dc.
  const TensorSet x0 = Layout(1, 1, 1);
  auto scaffold = Make(Spec("scaffold"), x0);
  EXPECT_EQ(scaffold->PayloadSets(), (std::vector<std::string>{"control_delta"}));
  EXPECT_EQ(scaffold->DownloadSets(), (std::vector<std::string>{"server_control", "client_control"}));
  ExpectValues(scaffold->state(), {0, 0, 0}, "fresh c");

  auto round1 = scaffold->BeginRound(x0);
  const TensorSet dy0 = Layout(2, 0, -2), dy2 = Layout(0, 4, 2);
  const auto dc0 = ControlDelta(Layout(0.4f, 0, 0.8f)), dc2 = ControlDelta(Layout(-0.4f, 0.8f, 0.4f));
  ASSERT_TRUE(round1->Fold(Update(dy0, 10, 1, 1, 0, &dc0)).ok());
  ASSERT_TRUE(round1->Fold(Update(dy2, 30, 1, 1, 2, &dc2)).ok());  // samples do not weigh
  auto step1 = scaffold->Finish(x0, *round1);
  ASSERT_TRUE(step1.ok()) << step1.status().ToString();
  ExpectValues(step1->model, {2, 3, 1}, "round 1 model");
  ASSERT_EQ(step1->state.size(), 6u);
  EXPECT_EQ(step1->state[0].name, "control/server/w");
  EXPECT_EQ(step1->state[2].name, "control/party/0/w");
  EXPECT_EQ(step1->state[5].name, "control/party/2/b");
  ExpectValues(step1->state, {0, 0.2f, 0.3f, 0.4f, 0, 0.8f, -0.4f, 0.8f, 0.4f}, "round 1 state");
  ExpectValues(scaffold->state(), {0, 0, 0}, "c before the step is adopted");
  scaffold->Adopt(step1->state);

  // What each participant downloads besides the model: c, and its own c_i (zero for a party
  // that never took part).
  const TensorSet for2 = scaffold->DownloadTensors(2);
  ASSERT_EQ(for2.size(), 4u);
  EXPECT_EQ(for2[0].name, "server_control/w");
  EXPECT_EQ(for2[3].name, "client_control/b");
  ExpectValues(for2, {0, 0.2f, 0.3f, -0.4f, 0.8f, 0.4f}, "party 2's download");
  ExpectValues(scaffold->DownloadTensors(1), {0, 0.2f, 0.3f, 0, 0, 0}, "party 1's download");

  // Round 2 takes party 1 alone, from x = (2, 3, 1): dy = (1, 1, 1), dc = (0.8, 0.4, -0.4).
  //   x <- (3, 4, 2);  c <- (0, 0.2, 0.3) + (0.2, 0.1, -0.1) = (0.2, 0.3, 0.2);
  //   c_1 = dc; c_0 and c_2, who sat out, keep theirs.
  auto round2 = scaffold->BeginRound(step1->model);
  const TensorSet dy1 = Layout(1, 1, 1);
  const auto dc1 = ControlDelta(Layout(0.8f, 0.4f, -0.4f));
  ASSERT_TRUE(round2->Fold(Update(dy1, 5, 1, 1, 1, &dc1)).ok());
  auto step2 = scaffold->Finish(step1->model, *round2);
  ASSERT_TRUE(step2.ok());
  ExpectValues(step2->model, {3, 4, 2}, "round 2 model");
  ASSERT_EQ(step2->state.size(), 8u);
  EXPECT_EQ(step2->state[4].name, "control/party/1/w");
  ExpectValues(step2->state, {0.2f, 0.3f, 0.2f, 0.4f, 0, 0.8f, 0.8f, 0.4f, -0.4f, -0.4f, 0.8f, 0.4f},
               "round 2 state");
}

TEST(ScaffoldStrategyTest, RefusesAnUpdateWithoutItsVariateOrAPartyTwice) {
  const TensorSet x0 = Layout(0, 0, 0);
  auto scaffold = Make(Spec("scaffold"), x0);
  auto round = scaffold->BeginRound(x0);
  const TensorSet dy = Layout(1, 1, 1);
  Status missing = round->Fold(Update(dy, 1, 1, 1, 0));
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("'control_delta'"), std::string::npos) << missing.message();
  const auto dc = ControlDelta(Layout(1, 1, 1));
  ASSERT_TRUE(round->Fold(Update(dy, 1, 1, 1, 3, &dc)).ok());
  Status twice = round->Fold(Update(dy, 1, 1, 1, 3, &dc));
  EXPECT_NE(twice.message().find("party 3 has already been folded"), std::string::npos) << twice.message();
  Status outside = round->Fold(Update(dy, 1, 1, 1, 4, &dc));
  EXPECT_NE(outside.message().find("the job has 4 parties"), std::string::npos) << outside.message();
  const auto short_dc = ControlDelta({{"w", {2}, {1, 1}}});
  EXPECT_FALSE(round->Fold(Update(dy, 1, 1, 1, 1, &short_dc)).ok());
  EXPECT_EQ(round->updates(), 1u);
}

TEST(ScaffoldStrategyTest, PerPartyStateSurvivesTheCheckpointAndAWrongOneIsRefused) {
  const TensorSet x0 = Layout(1, 1, 1);
  auto a = Make(Spec("scaffold"), x0);
  auto round = a->BeginRound(x0);
  const TensorSet dy = Layout(1, 2, 3);
  const auto dc = ControlDelta(Layout(0.5f, -0.5f, 0.25f));
  ASSERT_TRUE(round->Fold(Update(dy, 1, 1, 1, 3, &dc)).ok());
  auto step = a->Finish(x0, *round);
  ASSERT_TRUE(step.ok());
  a->Adopt(step->state);

  TensorSet state;
  const TensorSet model = SplitModelAndState(JoinModelAndState(step->model, a->state()), &state);
  auto b = Make(Spec("scaffold"), model);
  ASSERT_TRUE(b->Restore(state).ok());
  EXPECT_EQ(TensorSetSha256(b->state()), TensorSetSha256(a->state()));
  EXPECT_EQ(TensorSetSha256(b->DownloadTensors(3)), TensorSetSha256(a->DownloadTensors(3)));

  auto refused = [&](TensorSet wrong, const std::string& expected) {
    Status s = Make(Spec("scaffold"), model)->Restore(std::move(wrong));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << expected;
    EXPECT_NE(s.message().find(expected), std::string::npos) << s.message();
  };
  // Party 3's variate in a job of 3 parties.
  Status s = Make(Spec("scaffold", 3), model)->Restore(state);
  EXPECT_NE(s.message().find("expected a party's variate 'control/party/P/...' with P in (-1, 3)"), std::string::npos)
      << s.message();
  TensorSet renamed = state;
  renamed[2].name = "control/party/x/w";
  refused(renamed, "expected a party's variate");
  TensorSet cut = state;
  cut.pop_back();
  refused(cut, "scaffold state in the checkpoint: 3 tensors");
  TensorSet reshaped = state;
  reshaped[0].shape = {1, 2};
  refused(reshaped, "expected 'control/server/w' [2]");
  TensorSet infinite = state;
  infinite[3].values[0] = std::numeric_limits<float>::infinity();
  refused(infinite, "scaffold state in the checkpoint");
  // A name or shape edited into the checkpoint is named escaped and bounded, not echoed.
  for (size_t at : {size_t{0}, size_t{2}}) {
    TensorSet hostile = state;
    hostile[at].name = (at == 0 ? "control/server/" : "control/party/0/") + std::string(100000, 'w') + "\n\x1b[2J";
    Status why = Make(Spec("scaffold"), model)->Restore(std::move(hostile));
    EXPECT_EQ(why.code(), StatusCode::kInvalidArgument);
    EXPECT_LT(why.message().size(), 2000u) << "tensor " << at;
    EXPECT_EQ(why.message().find('\n'), std::string::npos) << "tensor " << at;
    EXPECT_EQ(why.message().find('\x1b'), std::string::npos) << "tensor " << at;
  }
  TensorSet deep = state;
  deep[0].shape.assign(100000, 1);
  Status why = Make(Spec("scaffold"), model)->Restore(std::move(deep));
  EXPECT_EQ(why.code(), StatusCode::kInvalidArgument);
  EXPECT_LT(why.message().size(), 2000u);
}

TEST(ScaffoldStrategyTest, TheRoundWantsTheVariatesSetWithTheModelsLayout) {
  auto global = std::make_shared<const TensorSet>(Layout(0, 0, 0));
  auto scaffold = Make(Spec("scaffold"), *global);
  Round round("job-1", 1, 1, 0, global, scaffold->BeginRound(*global), 1, scaffold->PayloadSets());
  round.AddParticipant(2, {{"w1", 1}});
  auto header = [&](const TensorSet& control) {
    v1::UpdateHeader h;
    h.set_worker_id("w1");
    h.set_job_id("job-1");
    h.set_round(1);
    h.set_attempt(1);
    h.set_samples(5);
    wire::UpdateBytes stream;
    wire::AppendUpdateSet("delta", *global, UpdateEncoding::kFloat32, 0, 1 << 20, &h, &stream);
    if (!control.empty()) {
      wire::AppendUpdateSet("control_delta", control, UpdateEncoding::kFloat32, 0, 1 << 20, &h, &stream);
    }
    return h;
  };
  Status missing = round.CheckManifest(header({}));
  EXPECT_NE(missing.message().find("no set 'control_delta'; this job's strategy needs one"), std::string::npos)
      << missing.message();
  Status shaped = round.CheckManifest(header({{"w", {3}, {0, 0, 0}}, {"b", {1}, {0}}}));
  EXPECT_NE(shaped.message().find("tensor 'w' of set 'control_delta': expected shape [2], got [3]"), std::string::npos)
      << shaped.message();
  ASSERT_TRUE(round.CheckManifest(header(*global)).ok());

  // A variate's change that is not finite is refused, naming the set and the value: folded, it
  // would reach c and c_i and every client's next rounds.
  TensorSet nan_change = Layout(1, 2, 3);
  nan_change[0].values[1] = std::numeric_limits<float>::quiet_NaN();
  const std::map<std::string, TensorSet> poisoned = ControlDelta(nan_change);
  Round other("job-1", 1, 1, 0, global, scaffold->BeginRound(*global), 1, scaffold->PayloadSets());
  other.AddParticipant(2, {{"w1", 1}});
  Status refused = other.Submit(header(*global), Layout(0, 0, 0), 1, &poisoned);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("set 'control_delta'"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("element 1 is NaN; expected finite values"), std::string::npos) << refused.message();

  // The update folds in with its party: party 2's c_i moves. (Its delta's norm over the
  // learning rate, 17.3, bounds the change: see ScaffoldBoundTest.)
  const std::map<std::string, TensorSet> payload = ControlDelta(Layout(1, 2, 3));
  ASSERT_TRUE(round.Submit(header(*global), Layout(1, 1, 1), 1, &payload).ok());
  round.Close("done");
  auto step = round.Finish(*scaffold);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  ASSERT_EQ(step->state.size(), 4u);
  EXPECT_EQ(step->state[2].name, "control/party/2/w");
  ExpectValues(step->state, {0.25f, 0.5f, 0.75f, 1, 2, 3}, "c and c_2 after one update");
}

TEST(ScaffoldStrategyTest, EachParticipantDownloadsTheModelWithItsOwnVariates) {
  const TensorSet global = Layout(1, 2, 3);
  auto scaffold = Make(Spec("scaffold"), global);
  Client lone{"w1", "", 0, {"w1"}};
  Client cohort{"cohort:site", "site", 1, {"m1", "m2"}};
  ParticipantModels models = EncodeParticipantModels(*scaffold, global, {lone, cohort}, 7, 4096);
  ASSERT_EQ(models.size(), 3u);
  EXPECT_EQ(models["m1"], models["m2"]) << "a cohort's members share one encoding";
  EXPECT_NE(models["w1"], models["m1"]);
  const TensorSet& tensors = models["w1"]->tensors();
  ASSERT_EQ(tensors.size(), 6u);
  EXPECT_EQ(tensors[0].name, "w");
  EXPECT_EQ(tensors[2].name, "server_control/w");
  EXPECT_EQ(tensors[5].name, "client_control/b");
  EXPECT_EQ(models["w1"]->version(), 7u);
  // A strategy without download sets: nothing per participant.
  EXPECT_TRUE(EncodeParticipantModels(*Make(Spec("fedavg"), global), global, {lone}, 7, 4096).empty());
}

// ---- SCAFFOLD's bound on a variate's change ----

// `worker`'s update to round 1 of job-1, attempt 1, from model version 0: a delta and a
// control_delta laid out as `global`.
v1::UpdateHeader ScaffoldHeader(const std::string& worker, const TensorSet& global) {
  v1::UpdateHeader h;
  h.set_worker_id(worker);
  h.set_job_id("job-1");
  h.set_round(1);
  h.set_attempt(1);
  h.set_samples(5);
  wire::UpdateBytes stream;
  wire::AppendUpdateSet("delta", global, UpdateEncoding::kFloat32, 0, 1 << 20, &h, &stream);
  wire::AppendUpdateSet("control_delta", global, UpdateEncoding::kFloat32, 0, 1 << 20, &h, &stream);
  return h;
}

TEST(ScaffoldBoundTest, AHugeButFiniteChangeIsRefusedNamingTheNormAndTheBound) {
  // lr 0.1 and c = 0: a change computed from the delta (3, 4, 0) after K steps is
  // -delta / (K lr), of L2 norm 50 / K. The bound is 50 (with 1e-5 of it for rounding).
  auto global = std::make_shared<const TensorSet>(Layout(0, 0, 0));
  auto scaffold = Make(Spec("scaffold"), *global);
  Round round("job-1", 1, 1, 0, global, scaffold->BeginRound(*global), 1, scaffold->PayloadSets());
  for (uint32_t party = 0; party < 3; ++party) round.AddParticipant(party, {{"w" + std::to_string(party), 1}});
  const TensorSet delta = Layout(3, 4, 0);

  // Finite, so the layout and finite checks pass it; folded, c would be 2.5e37 and every
  // client's next correction with it.
  const auto huge = ControlDelta(Layout(1e38f, 0, 0));
  Status refused = round.Submit(ScaffoldHeader("w0", *global), delta, 1, &huge);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  for (const char* expected : {"update from worker 'w0' for job job-1 round 1: set 'control_delta'",
                               "has L2 norm 1e+38", "expected at most 50.0005",
                               "the delta's L2 norm 5 over the learning rate 0.1"}) {
    EXPECT_NE(refused.message().find(expected), std::string::npos) << expected << "\n" << refused.message();
  }
  const auto beyond = ControlDelta(Layout(-30, -40.01f, 0));  // L2 norm 50.008
  EXPECT_NE(round.Submit(ScaffoldHeader("w1", *global), delta, 1, &beyond).message().find("expected at most 50.0005"),
            std::string::npos);

  // One local step's change, the largest this delta allows, folds.
  const auto one_step = ControlDelta(Layout(-30, -40, 0));
  ASSERT_TRUE(round.Submit(ScaffoldHeader("w2", *global), delta, 1, &one_step).ok());
  round.Close("done");
  auto step = round.Finish(*scaffold);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  // c = (1/4) of the one change folded, c_2 the change: the refused ones reached neither.
  ASSERT_EQ(step->state.size(), 4u);
  EXPECT_EQ(step->state[2].name, "control/party/2/w");
  ExpectValues(step->state, {-7.5f, -10, 0, -30, -40, 0}, "c and c_2");
}

TEST(ScaffoldBoundTest, HonestChangesFoldWhateverTheirStepsAndTheServersVariate) {
  // Changes computed as a worker computes them (ScaffoldClientVariates, its learning rate a
  // float), against a server variate c of up to 1e5 a value, far larger than the clients'
  // (x - y_i) / (K lr) of up to 0.01: the change is then nearly -c, rounded to float at a
  // spacing of 0.008, which must not count against it. One local step is the tight case: the
  // bound is the delta's norm over lr, K times an honest K-step client's.
  std::mt19937 random(7);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  auto tensors = [&](const std::string& prefix, float scale) {
    TensorSet set = {{prefix + "w", {64}, std::vector<float>(64)}, {prefix + "b", {8}, std::vector<float>(8)}};
    for (auto& t : set) {
      for (float& v : t.values) v = scale * unit(random);
    }
    return set;
  };
  const TensorSet global = tensors("", 1.0f);
  auto scaffold = Make(Spec("scaffold"), global);
  TensorSet state = tensors("control/server/", 1e5f);
  for (auto& t : tensors("control/party/0/", 1e5f)) state.push_back(std::move(t));
  ASSERT_TRUE(scaffold->Restore(state).ok());
  auto strip = [](const TensorSet& set) {
    TensorSet out = set;
    for (auto& t : out) t.name = t.name.substr(t.name.rfind('/') + 1);
    return out;
  };
  const TensorSet c = strip(TensorSet(state.begin(), state.begin() + 2));
  auto round = scaffold->BeginRound(global);
  uint32_t party = 0;
  for (const double steps : {1.0, 7.0, 600.0}) {
    const TensorSet ci = party == 0 ? strip(TensorSet(state.begin() + 2, state.end())) : tensors("", 0.0f);
    TensorSet trained = global;
    const TensorSet move = tensors("", 1e-3f);
    for (size_t i = 0; i < trained.size(); ++i) {
      for (size_t j = 0; j < trained[i].values.size(); ++j) trained[i].values[j] += move[i].values[j];
    }
    auto client = ScaffoldClientVariates(global, trained, c, ci, steps, static_cast<float>(0.1));
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    const TensorSet delta = DeltaFrom(trained, global);
    const auto payload = ControlDelta(client->control_delta);
    Status folded = round->Fold(Update(delta, 10, static_cast<uint64_t>(steps), 1, party, &payload));
    EXPECT_TRUE(folded.ok()) << steps << " steps: " << folded.ToString();
    ++party;
  }
  EXPECT_EQ(round->updates(), 3u);
}

// SCAFFOLD reads no step count: its bound on a variate's change takes the worst case of one
// local step (K >= 1), whatever the update claims. A claim of 0, of 2^64 - 1 (a negative
// count sent as unsigned) or a normaliser that is not finite is neither refused at the header
// nor lets a larger change through, and the round comes out the same to the bit.
TEST(ScaffoldBoundTest, TheClaimedStepsAndNormaliserNeitherWidenTheBoundNorChangeTheRound) {
  auto global = std::make_shared<const TensorSet>(Layout(0, 0, 0));
  const TensorSet delta = Layout(3, 4, 0);  // bound 50: its norm 5 over lr 0.1
  const auto within = ControlDelta(Layout(-30, -40, 0));
  const auto beyond = ControlDelta(Layout(-30, -40.01f, 0));
  std::vector<TensorSet> states;
  for (const uint64_t steps : {uint64_t{0}, uint64_t{1}, std::numeric_limits<uint64_t>::max()}) {
    for (const double normalizer : {0.0, std::numeric_limits<double>::quiet_NaN(), 1e308}) {
      auto scaffold = Make(Spec("scaffold"), *global);
      Round round("job-1", 1, 1, 0, global, scaffold->BeginRound(*global), 1, scaffold->PayloadSets());
      round.AddParticipant(0, {{"w0", 1}});
      round.AddParticipant(1, {{"w1", 1}});
      auto header = [&](const std::string& worker) {
        v1::UpdateHeader h = ScaffoldHeader(worker, *global);
        h.set_local_steps(steps);
        h.set_step_normalizer(normalizer);
        return h;
      };
      ASSERT_TRUE(round.Admit(header("w0")).ok()) << steps;
      Status refused = round.Submit(header("w1"), delta, 1, &beyond);
      EXPECT_NE(refused.message().find("expected at most 50.0005"), std::string::npos) << steps << " " << refused.message();
      ASSERT_TRUE(round.Submit(header("w0"), delta, 1, &within).ok()) << steps;
      round.Close("done");
      auto step = round.Finish(*scaffold);
      ASSERT_TRUE(step.ok()) << step.status().ToString();
      ExpectValues(step->state, {-7.5f, -10, 0, -30, -40, 0}, "c and c_0");
      states.push_back(step->state);
    }
  }
  for (const TensorSet& state : states) EXPECT_EQ(Values(state), Values(states.front()));
}

// Under update_norm_policy "clip" the round scales a delta beyond max_update_norm by s = bound /
// norm. The change the client computed from the delta it sent is checked against that delta,
// then scaled to the one it would have computed from the clipped delta, s (change + c) - c, so
// an honest one-step client is not refused for being clipped, and c keeps its bound.
TEST(ScaffoldBoundTest, AClippedDeltasChangeIsCheckedAsSentAndScaledWithIt) {
  auto global = std::make_shared<const TensorSet>(Layout(0, 0, 0));
  auto scaffold = Make(Spec("scaffold"), *global);
  Round round("job-1", 1, 1, 0, global, scaffold->BeginRound(*global), 1, scaffold->PayloadSets(), 1.0,
              Round::NormPolicy::kClip);
  round.AddParticipant(0, {{"w0", 1}});
  round.AddParticipant(1, {{"w1", 1}});
  const TensorSet delta = Layout(3, 4, 0);  // norm 5: clipped by 1/5 to (0.6, 0.8, 0)

  // Beyond the sent delta's bound of 50 (norm 5 over lr 0.1): refused, naming the sent norm.
  const auto beyond = ControlDelta(Layout(-30, -40.01f, 0));
  Status refused = round.Submit(ScaffoldHeader("w1", *global), delta, 1, &beyond);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  for (const char* expected : {"expected at most 50.0005", "the delta's L2 norm 5 over the learning rate 0.1"}) {
    EXPECT_NE(refused.message().find(expected), std::string::npos) << expected << "\n" << refused.message();
  }
  // One local step's change from the sent delta folds, scaled by 1/5.
  const auto one_step = ControlDelta(Layout(-30, -40, 0));
  ASSERT_TRUE(round.Submit(ScaffoldHeader("w0", *global), delta, 1, &one_step).ok());
  round.Close("done");
  auto step = round.Finish(*scaffold);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  ExpectValues(step->model, {0.6f, 0.8f, 0}, "the model moved by the clipped delta");
  ASSERT_EQ(step->state.size(), 4u);
  // c = (1/4) of the scaled change (-6, -8, 0); c_0 the scaled change.
  ExpectValues(step->state, {-1.5f, -2, 0, -6, -8, 0}, "c and c_0");
}

TEST(ScaffoldBoundTest, TheStrategyNeedsAPositiveLearningRate) {
  v1::JobSpec spec = Spec("scaffold");
  spec.mutable_optimizer()->set_learning_rate(0);
  auto made = CreateStrategy(spec, Layout(0, 0, 0));
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("spec.optimizer.learning_rate must be a positive number"), std::string::npos)
      << made.status().message();
}

// ---- Buffers ----
// "b" is a buffer (a batch norm's running statistic): no optimiser steps it, and both
// strategies give it FedAvg's sample-weighted mean of the deltas, while "w" takes their rule.

TEST(FedNovaStrategyTest, ABufferTakesTheSampleWeightedMeanDelta) {
  // NormalisedAggregationByHand's round: w as there, x' = (1, 1) + 3.5 (1, 0.5) = (4.5, 2.75);
  // the buffer 1 + (1 * -2 + 3 * 8) / 4 = 6.5, where the normalised rule gives it 5.375.
  auto next = FedNovaRoundByHand({"b"});
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  ExpectValues(next->model, {4.5f, 2.75f, 6.5f}, "fednova model with a buffer");
  EXPECT_TRUE(next->state.empty());
}

TEST(ScaffoldStrategyTest, ABufferTakesTheSampleWeightedMeanDeltaAndKeepsNoVariate) {
  // ModelAndControlVariatesByHand's first round with "b" a buffer. w as there: x = (2, 3),
  // c = (0, 0.2), c_0 = (0.4, 0), c_2 = (-0.4, 0.8). The buffer: 1 + (10 * -2 + 30 * 2) / 40 = 2
  // (the unweighted mean would leave it at 1), and its variates stay 0 (c's would be 0.3), the
  // clients' changes for it (here large) ignored.
  const TensorSet x0 = Layout(1, 1, 1);
  auto scaffold = Make(Spec("scaffold"), x0, {"b"});
  auto round = scaffold->BeginRound(x0);
  const TensorSet dy0 = Layout(2, 0, -2), dy2 = Layout(0, 4, 2);
  const auto dc0 = ControlDelta(Layout(0.4f, 0, 0.8f)), dc2 = ControlDelta(Layout(-0.4f, 0.8f, 1e30f));
  ASSERT_TRUE(round->Fold(Update(dy0, 10, 1, 1, 0, &dc0)).ok());
  ASSERT_TRUE(round->Fold(Update(dy2, 30, 1, 1, 2, &dc2)).ok());
  auto step = scaffold->Finish(x0, *round);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  ExpectValues(step->model, {2, 3, 2}, "model");
  ExpectValues(step->state, {0, 0.2f, 0, 0.4f, 0, 0, -0.4f, 0.8f, 0}, "c, c_0 and c_2");
  scaffold->Adopt(step->state);
  ExpectValues(scaffold->DownloadTensors(2), {0, 0.2f, 0, -0.4f, 0.8f, 0}, "party 2's download");

  // The state keeps its layout, a buffer's entries zero: a checkpoint of it restores to the
  // same bits. One whose buffer entries are not zero restores with them zeroed.
  auto resumed = Make(Spec("scaffold"), x0, {"b"});
  ASSERT_TRUE(resumed->Restore(step->state).ok());
  EXPECT_EQ(TensorSetSha256(resumed->state()), TensorSetSha256(scaffold->state()));
  TensorSet stale = step->state;
  stale[1].values[0] = 0.3f;
  stale[5].values[0] = 5.0f;
  auto zeroed = Make(Spec("scaffold"), x0, {"b"});
  ASSERT_TRUE(zeroed->Restore(stale).ok());
  EXPECT_EQ(TensorSetSha256(zeroed->state()), TensorSetSha256(scaffold->state()));
}

}  // namespace
}  // namespace tessera::server
