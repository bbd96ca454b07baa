// What a job's selection learned, kept across a restart:
//  - ClientHistory's encoding gives back every client as it was, and a hostile one (cut,
//    a count past its bytes, more times than are kept, a time out of range, seats out of
//    order, bytes left over, a tensor that is no packed encoding) is DataLoss naming the
//    source and the field.
//  - The round driver writes it into each round's checkpoint, all of it: a resumed job's
//    policy knows every client an uninterrupted one does, whether or not the records it could
//    reread still show them; a history that cannot be read is named, and the records teach
//    the policy again.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "job_runner_fixture.h"
#include "server/selection/client_history.h"
#include "server/selection/deadline_selection.h"
#include "server/strategy/strategy.h"

namespace tessera::server {
namespace {

v1::WorkerRoundReport Report(const std::string& worker, const std::string& outcome, double ms) {
  v1::WorkerRoundReport w;
  w.set_worker_id(worker);
  w.set_outcome(outcome);
  w.set_reported_ms(ms);
  w.set_dropped_ms(ms);
  w.set_train_loss(0.25 * ms / 1000);
  w.set_samples(static_cast<uint64_t>(ms));
  return w;
}

// Seven rounds: w1 in each (more times than are kept), w2 dropped at the deadline, a cohort,
// w3 selected once and failed (selected, never timed).
ClientHistory Observed() {
  v1::JobSpec spec;
  spec.set_round_deadline_ms(60000);
  ClientHistory history;
  for (uint32_t round = 1; round <= 7; ++round) {
    v1::RoundRecord record;
    record.set_round(round);
    *record.add_workers() = Report("w1", "accepted", 1000 + round);
    if (round == 2) *record.add_workers() = Report("w2", "dropped: deadline", 60000);
    if (round == 3) *record.add_workers() = Report("w3", "failed: no device", 0);
    if (round == 4) {
      v1::WorkerRoundReport cohort = Report("m1", "accepted: clipped", 3000);
      cohort.set_cohort("site-a");
      *record.add_workers() = cohort;
    }
    history.Observe(record, spec);
  }
  return history;
}

TEST(ClientHistoryTest, TheEncodingGivesBackEveryClientAsItWas) {
  const ClientHistory history = Observed();
  ASSERT_EQ(history.clients(), 4u);
  auto decoded = ClientHistory::Decode(history.Encode(), "test");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_TRUE(*decoded == history);
  EXPECT_EQ(decoded->LastSelected("w3"), 3u);
  EXPECT_FALSE(decoded->ExpectedTime("w3").has_value());
  EXPECT_TRUE(decoded->ExpectedTime("w2")->at_least);
  EXPECT_EQ(decoded->LastAccepted("cohort:site-a")->samples, 3000u);
  const NamedTensor tensor = history.ToTensor();
  EXPECT_EQ(tensor.name, ClientHistory::kTensorName);
  for (float v : tensor.values) EXPECT_TRUE(v >= 0 && v < 16777216.0f && v == std::floor(v)) << v;
  auto unpacked = ClientHistory::FromTensor(tensor, "test");
  ASSERT_TRUE(unpacked.ok()) << unpacked.status().ToString();
  EXPECT_TRUE(*unpacked == history);
  // An empty history too.
  auto empty = ClientHistory::FromTensor(ClientHistory().ToTensor(), "test");
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(empty->clients(), 0u);
}

void ExpectRefused(const Result<ClientHistory>& decoded, const std::string& field) {
  ASSERT_FALSE(decoded.ok()) << "expected a refusal naming " << field;
  EXPECT_EQ(decoded.status().code(), StatusCode::kDataLoss) << decoded.status().ToString();
  EXPECT_NE(decoded.status().message().find("ckpt-7"), std::string::npos) << decoded.status().message();
  EXPECT_NE(decoded.status().message().find(field), std::string::npos) << decoded.status().message();
}

TEST(ClientHistoryTest, AHostileEncodingIsDataLossNamingTheSourceAndTheField) {
  const std::string good = Observed().Encode();
  // Cut anywhere after the header: the field it ends in is named.
  for (size_t cut = 12; cut < good.size(); cut += 7) {
    ExpectRefused(ClientHistory::Decode(good.substr(0, cut), "ckpt-7"), "field '");
  }
  ExpectRefused(ClientHistory::Decode("TSRHIST0" + good.substr(8), "ckpt-7"), "magic");
  ExpectRefused(ClientHistory::Decode(good + "x", "ckpt-7"), "bytes after the last client");
  std::string many = good;
  const uint32_t count = 0xffffffffu;
  std::memcpy(many.data() + 8, &count, 4);
  ExpectRefused(ClientHistory::Decode(many, "ckpt-7"), "field 'clients'");

  // One client, written by hand: seat "a", selected in round 9, no update, `times` times.
  const auto one = [](const std::string& seat, uint8_t times, double ms, uint8_t accepted = 0) {
    std::string out = "TSRHIST1";
    const uint32_t n = 1, seat_bytes = static_cast<uint32_t>(seat.size()), last = 9;
    out.append(reinterpret_cast<const char*>(&n), 4);
    out.append(reinterpret_cast<const char*>(&seat_bytes), 4);
    out += seat;
    out.append(reinterpret_cast<const char*>(&last), 4);
    out.push_back(static_cast<char>(accepted));
    out.push_back(static_cast<char>(times));
    for (uint8_t t = 0; t < times; ++t) {
      out.append(reinterpret_cast<const char*>(&ms), 8);
      out.push_back(0);
    }
    return out;
  };
  ASSERT_TRUE(ClientHistory::Decode(one("a", 5, 10), "ckpt-7").ok());
  ExpectRefused(ClientHistory::Decode(one("a", 6, 10), "ckpt-7"), "field 'times'");
  ExpectRefused(ClientHistory::Decode(one("a", 1, std::nan("")), "ckpt-7"), "field 'times'");
  ExpectRefused(ClientHistory::Decode(one("a", 1, -1), "ckpt-7"), "field 'times'");
  ExpectRefused(ClientHistory::Decode(one("a", 0, 0, /*accepted=*/2), "ckpt-7"), "field 'accepted'");
  ExpectRefused(ClientHistory::Decode(one(std::string(ClientHistory::kMaxSeatBytes + 1, 's'), 0, 0), "ckpt-7"),
                "field 'seat'");
  // Two clients of one seat, or out of order.
  std::string twice = one("a", 0, 0);
  const uint32_t two = 2;
  std::memcpy(twice.data() + 8, &two, 4);
  twice += twice.substr(12);
  ExpectRefused(ClientHistory::Decode(twice, "ckpt-7"), "field 'seat'");

  // The tensor: a value that is no packed integer, a length that does not fit the values, another shape.
  const NamedTensor tensor = Observed().ToTensor();
  NamedTensor fraction = tensor;
  fraction.values[3] = 0.5f;
  ExpectRefused(ClientHistory::FromTensor(fraction, "ckpt-7"), "value 3");
  NamedTensor longer = tensor;
  longer.values[0] += 3;
  ExpectRefused(ClientHistory::FromTensor(longer, "ckpt-7"), "field 'length'");
  NamedTensor reshaped = tensor;
  reshaped.shape = {1, static_cast<int64_t>(tensor.values.size())};
  ExpectRefused(ClientHistory::FromTensor(reshaped, "ckpt-7"), "field 'shape'");
  // More than a history can take is refused by its shape, before its values are read.
  NamedTensor huge = tensor;
  huge.shape = {static_cast<int64_t>(3 + (ClientHistory::kMaxEncodedBytes + 2) / 3)};
  ExpectRefused(ClientHistory::FromTensor(huge, "ckpt-7"), "bytes of history");
}

class SelectionHistoryJobTest : public JobRunnerFixture {
 protected:
  // Three parties, one client a round, the deadline policy; a seed for which a policy that
  // knew nothing would pick w3 for round 4.
  static v1::JobSpec Spec(uint32_t rounds) {
    v1::JobSpec spec = SmallSpec(3, 1, 60000);
    spec.set_clients_per_round(1);
    spec.set_rounds(rounds);
    spec.mutable_selection()->set_policy("deadline");
    spec.mutable_selection()->set_over_selection(0);
    for (uint64_t seed = 1; seed < 200; ++seed) {
      spec.set_seed(seed);
      std::vector<Client> candidates;
      for (uint32_t i = 0; i < 3; ++i) candidates.push_back(Client{"w" + std::to_string(i + 1), "", i, {}});
      auto fresh = DeadlineSelection().Choose(candidates, spec, 4, 1);
      if (fresh.size() == 1 && fresh[0].seat == "w3") return spec;
    }
    ADD_FAILURE() << "no seed picks w3 first";
    return spec;
  }
  // w1 and w2 fast; w3 reports a 90 s compute time against the 60 s deadline.
  void AddWorkers() {
    AddWorker("w1", Always(FakeAction::Upload()));
    AddWorker("w2", Always(FakeAction::Upload()));
    AddWorker("w3", Always(FakeAction::Upload().WithTamper([](v1::UpdateHeader* h, TensorSet*) {
      h->set_compute_ms(90000);
    })));
  }
  // Resumes the stored job for rounds 4 and 5; returns who was selected in each.
  std::vector<std::set<std::string>> ResumeForTwoMoreRounds() {
    v1::Job stored = Stored();
    stored.set_state(v1::JOB_RUNNING);
    stored.mutable_spec()->set_rounds(5);
    EXPECT_TRUE(store_.UpdateJob(stored).ok());
    StartRunner(stored);
    const v1::Job ended = AwaitEnd();
    EXPECT_EQ(ended.state(), v1::JOB_SUCCEEDED) << ended.error();
    std::vector<std::set<std::string>> selected;
    for (const auto& record : Rounds()) {
      if (record.round() < 4) continue;
      std::set<std::string> seats;
      for (const auto& w : record.workers()) seats.insert(w.worker_id());
      selected.push_back(seats);
    }
    return selected;
  }
  // The selection tensors of the checkpoint of `round`.
  TensorSet SelectionTensors(uint32_t round) {
    auto tensors = store_.LoadCheckpoint(kJobId, round);
    EXPECT_TRUE(tensors.ok()) << tensors.status().ToString();
    TensorSet state, selection;
    if (tensors.ok()) SplitModelAndState(std::move(tensors).value(), &state, &selection);
    return selection;
  }
};

TEST_F(SelectionHistoryJobTest, EachCheckpointHoldsAllThePolicyKnewAtItsRound) {
  AddWorkers();
  ASSERT_EQ(Run(Spec(3)).state(), v1::JOB_SUCCEEDED);
  ClientHistory expected;
  for (uint32_t round = 1; round <= 3; ++round) {
    expected.Observe(Rounds()[round - 1], Stored().spec());
    const TensorSet selection = SelectionTensors(round);
    ASSERT_EQ(selection.size(), 1u) << "round " << round;
    auto held = ClientHistory::FromTensor(selection[0], "round " + std::to_string(round));
    ASSERT_TRUE(held.ok()) << held.status().ToString();
    EXPECT_TRUE(*held == expected) << "round " << round;
  }
  EXPECT_EQ(expected.clients(), 3u);
  EXPECT_TRUE(SelectionTensors(0).empty()) << "the initial model knows no round";
}

// The records a restart could reread no longer show the clients (as records past the window
// it rereads would not): the checkpoint's history still knows w3 is slower than the deadline.
TEST_F(SelectionHistoryJobTest, AResumedJobKnowsWhatItsCheckpointKnowsNotOnlyWhatItRereads) {
  AddWorkers();
  ASSERT_EQ(Run(Spec(3)).state(), v1::JOB_SUCCEEDED);
  const v1::Job stored = Stored();
  for (v1::RoundRecord record : Rounds()) {
    record.clear_workers();
    ASSERT_TRUE(store_.UpdateRoundRecord(stored, record).ok());
  }
  const auto selected = ResumeForTwoMoreRounds();
  ASSERT_EQ(selected.size(), 2u);
  EXPECT_EQ(selected[0].count("w3"), 0u) << "round 4 forgot that w3 is slower than the deadline";
  EXPECT_EQ(selected[1].count("w3"), 0u);
}

// A history in the checkpoint that cannot be read is named, and the records teach the policy.
TEST_F(SelectionHistoryJobTest, AnUnreadableHistoryIsNamedAndTheRecordsTeachThePolicyAgain) {
  AddWorkers();
  ASSERT_EQ(Run(Spec(3)).state(), v1::JOB_SUCCEEDED);
  auto tensors = store_.LoadCheckpoint(kJobId, 3);
  ASSERT_TRUE(tensors.ok());
  TensorSet state, selection;
  const TensorSet model = SplitModelAndState(std::move(tensors).value(), &state, &selection);
  ASSERT_EQ(selection.size(), 1u);
  selection[0].values[2] = 0.5f;
  const v1::Job stored = Stored();
  ASSERT_TRUE(store_.WriteCheckpoint(kJobId, 3, model, selection).ok());
  ASSERT_TRUE(store_.CommitWrittenRound(stored, Rounds().back()).ok());
  const auto selected = ResumeForTwoMoreRounds();
  ASSERT_EQ(selected.size(), 2u);
  EXPECT_EQ(selected[0].count("w3"), 0u);
  EXPECT_NE(Events().find("selection history not usable"), std::string::npos) << Events();
  EXPECT_NE(Events().find("job-1-test checkpoint of round 3: tensor 'selection/history': value 2"), std::string::npos)
      << Events();
}

}  // namespace
}  // namespace tessera::server
