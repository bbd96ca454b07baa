// Client selection: the policy's draw, the seat table on a MemoryStateStore (a new client
// takes the lowest free party and keeps it; a seat that cannot be saved is not given; stored
// seats that do not fit the job are not used, each named), and in the round driver who is
// picked: clients_per_round of the ready workers as the seed draws, seats stable across
// rounds and a restart, seats that do not fit the job seated again when it resumes, workers
// without a free party or not ready left out.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "job_runner_fixture.h"
#include "server/selection/selection.h"

namespace tessera::server {
namespace {

using std::chrono::milliseconds;

std::map<std::string, Client> Lone(const std::vector<std::string>& workers) {
  std::map<std::string, Client> clients;
  for (const auto& w : workers) clients[w] = Client{w, "", 0, {w}};
  return clients;
}

std::map<std::string, uint32_t> Parties(const std::vector<Client>& clients) {
  std::map<std::string, uint32_t> parties;
  for (const auto& c : clients) parties[c.seat] = c.party;
  return parties;
}

TEST(RandomSelectionTest, IsReproducibleFromTheSeedRoundAndAttemptAndSortedBySeat) {
  std::vector<Client> candidates;
  for (int i = 0; i < 10; ++i) candidates.push_back({"w" + std::to_string(i), "", static_cast<uint32_t>(i), {}});
  v1::JobSpec spec;
  spec.set_seed(3);
  spec.set_clients_per_round(4);
  RandomSelection policy;
  auto a = policy.Choose(candidates, spec, 5, 1);
  auto b = policy.Choose(candidates, spec, 5, 1);
  ASSERT_EQ(a.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].seat, b[i].seat);
  for (size_t i = 1; i < a.size(); ++i) EXPECT_LT(a[i - 1].seat, a[i].seat);
  // Fewer candidates than clients_per_round: all of them.
  spec.set_clients_per_round(20);
  EXPECT_EQ(policy.Choose(candidates, spec, 5, 1).size(), 10u);
}

TEST(SeatTableTest, ANewClientTakesTheLowestFreePartyAndKeepsItInTheNextTable) {
  MemoryStateStore store;
  ASSERT_TRUE(store.SaveSeat("job-1-a", "w2", 0).ok());  // from before a restart
  SeatTable seats(&store, "job-1-a");
  std::vector<Status> dropped;
  ASSERT_TRUE(seats.Load(3, &dropped).ok());
  EXPECT_TRUE(dropped.empty());
  auto seated = seats.Seat(Lone({"w1", "w2", "w3"}), 3);
  ASSERT_TRUE(seated.ok()) << seated.status().ToString();
  EXPECT_EQ(Parties(*seated), (std::map<std::string, uint32_t>{{"w1", 1}, {"w2", 0}, {"w3", 2}}));
  SeatTable again(&store, "job-1-a");
  ASSERT_TRUE(again.Load(3, &dropped).ok());
  EXPECT_TRUE(dropped.empty());
  auto reseated = again.Seat(Lone({"w3", "w4"}), 3);
  ASSERT_TRUE(reseated.ok());
  EXPECT_EQ(Parties(*reseated), (std::map<std::string, uint32_t>{{"w3", 2}})) << "every party is taken: w4 waits";
}

TEST(SeatTableTest, ASeatThatCannotBeSavedIsAnErrorAndIsNotGiven) {
  MemoryStateStore store;
  SeatTable seats(&store, "job-1-a");
  std::vector<Status> dropped;
  ASSERT_TRUE(seats.Load(2, &dropped).ok());
  store.FailNextWrites(StateWrite::kSaveSeat, 1, ResourceExhaustedError("scripted: the disk is full"));
  auto seated = seats.Seat(Lone({"w1"}), 2);
  EXPECT_EQ(seated.status().message(), "scripted: the disk is full");
  EXPECT_EQ(seats.size(), 0u);
  EXPECT_TRUE(store.LoadSeats("job-1-a")->empty());
  seated = seats.Seat(Lone({"w1"}), 2);
  ASSERT_TRUE(seated.ok());
  EXPECT_EQ(Parties(*seated), (std::map<std::string, uint32_t>{{"w1", 0}}));
}

// Loads the seats of job-1-a for `parties` and seats `clients`: the parties they get, and in
// *dropped what Load said of the seats it did not use.
std::map<std::string, uint32_t> LoadAndSeat(MemoryStateStore& store, uint32_t parties,
                                            const std::vector<std::string>& clients, std::vector<Status>* dropped) {
  SeatTable seats(&store, "job-1-a");
  const Status loaded = seats.Load(parties, dropped);
  EXPECT_TRUE(loaded.ok()) << loaded.ToString();
  auto seated = seats.Seat(Lone(clients), parties);
  EXPECT_TRUE(seated.ok()) << seated.status().ToString();
  return seated.ok() ? Parties(*seated) : std::map<std::string, uint32_t>{};
}

TEST(SeatTableTest, ASeatOutsideThePartitionIsNotUsedAndItsClientIsSeatedAgain) {
  MemoryStateStore store;
  ASSERT_TRUE(store.SaveSeat("job-1-a", "w1", 7).ok());  // a partition of 3 has parties 0 to 2
  ASSERT_TRUE(store.SaveSeat("job-1-a", "w2", 0).ok());
  std::vector<Status> dropped;
  // Used as stored, w1 would be sent party 7 every round, and every update it sent refused.
  EXPECT_EQ(LoadAndSeat(store, 3, {"w1", "w2"}, &dropped), (std::map<std::string, uint32_t>{{"w1", 1}, {"w2", 0}}));
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].code(), StatusCode::kDataLoss);
  EXPECT_EQ(dropped[0].message(),
            "job job-1-a: seat 'w1' on party 7 is not used: expected a party below 3, the partition's parties; the "
            "client is seated again");
  EXPECT_EQ(store.LoadSeats("job-1-a")->size(), 2u) << "the rows stay until a client is seated again";
  EXPECT_EQ(store.LoadSeats("job-1-a")->back(), (std::pair<std::string, uint32_t>{"w1", 1}))
      << "w1's row now holds its new party";
}

TEST(SeatTableTest, TwoSeatsOnOnePartyAreNotUsedAndEachClientIsSeatedAgain) {
  MemoryStateStore store;
  ASSERT_TRUE(store.SaveSeat("job-1-a", "w1", 0).ok());
  ASSERT_TRUE(store.SaveSeat("job-1-a", "w2", 1).ok());
  ASSERT_TRUE(store.SaveSeat("job-1-a", "w3", 1).ok());
  std::vector<Status> dropped;
  // Used as stored, w2 and w3 would both train party 1, and party 2 no one.
  EXPECT_EQ(LoadAndSeat(store, 3, {"w1", "w2", "w3"}, &dropped),
            (std::map<std::string, uint32_t>{{"w1", 0}, {"w2", 1}, {"w3", 2}}));
  ASSERT_EQ(dropped.size(), 2u);
  for (const Status& why : dropped) {
    EXPECT_EQ(why.code(), StatusCode::kDataLoss);
    EXPECT_NE(why.message().find("job job-1-a: seat '"), std::string::npos) << why.message();
    EXPECT_NE(why.message().find("' on party 1 is not used: expected one seat a party, found 2 on it"),
              std::string::npos)
        << why.message();
  }
  EXPECT_NE(dropped[0].message().find("'w2'"), std::string::npos) << dropped[0].message();
  EXPECT_NE(dropped[1].message().find("'w3'"), std::string::npos) << dropped[1].message();
}

TEST(SeatTableTest, WithWorkersOwnFilesAnyPartyFitsButTwoSeatsOnOneDoNot) {
  MemoryStateStore store;
  ASSERT_TRUE(store.SaveSeat("job-1-a", "w1", 40).ok());
  ASSERT_TRUE(store.SaveSeat("job-1-a", "w2", 3).ok());
  ASSERT_TRUE(store.SaveSeat("job-1-a", "w3", 3).ok());
  std::vector<Status> dropped;
  EXPECT_EQ(LoadAndSeat(store, 0, {"w1", "w2", "w3"}, &dropped),
            (std::map<std::string, uint32_t>{{"w1", 40}, {"w2", 0}, {"w3", 1}}));
  EXPECT_EQ(dropped.size(), 2u);
}

TEST(SeatTableTest, ASeatNoWorkerCanHoldIsNotUsedAndItsPartyIsSeatedAgain) {
  MemoryStateStore store;
  ASSERT_TRUE(store.SaveSeat("job-1-a", "w1\x1b[2J\nforged line", 0).ok());
  ASSERT_TRUE(store.SaveSeat("job-1-a", "cohort:site-a", 1).ok());
  std::vector<Status> dropped;
  // Used as stored, no worker could ever hold party 0: it would never be trained, and w1
  // would find every party taken.
  EXPECT_EQ(LoadAndSeat(store, 2, {"cohort:site-a", "w1"}, &dropped),
            (std::map<std::string, uint32_t>{{"cohort:site-a", 1}, {"w1", 0}}));
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].message(),
            "job job-1-a: seat 'w1\\x1b[2J\\nforged line' on party 0 is not used: expected a worker's name or "
            "'cohort:' and a cohort's, 1 to 128 letters, digits, '-', '_' or '.'; party 0 is seated again");
  // Nor a name past 128 characters, shown cut.
  MemoryStateStore long_names;
  ASSERT_TRUE(long_names.SaveSeat("job-1-a", std::string(5000, 'w'), 0).ok());
  ASSERT_TRUE(long_names.SaveSeat("job-1-a", "", 1).ok());
  EXPECT_EQ(LoadAndSeat(long_names, 2, {"w1"}, &dropped), (std::map<std::string, uint32_t>{{"w1", 0}}));
  ASSERT_EQ(dropped.size(), 3u);
  EXPECT_LT(dropped[1].message().size(), 500u) << dropped[1].message();
  EXPECT_NE(dropped[1].message().find("(5000 bytes)"), std::string::npos) << dropped[1].message();
  EXPECT_NE(dropped[2].message().find("seat '' on party 1 is not used"), std::string::npos) << dropped[2].message();
}

TEST(SeatTableTest, SeatsNotUsedAreNamedUpToABoundAndCountedPastIt) {
  MemoryStateStore store;
  for (uint32_t i = 0; i < kNamedDroppedSeats + 5; ++i) {
    ASSERT_TRUE(store.SaveSeat("job-1-a", "w" + std::to_string(i), 100 + i).ok());
  }
  std::vector<Status> dropped;
  EXPECT_EQ(LoadAndSeat(store, 3, {"w0"}, &dropped), (std::map<std::string, uint32_t>{{"w0", 0}}));
  ASSERT_EQ(dropped.size(), kNamedDroppedSeats + 1);
  EXPECT_EQ(dropped.back().message(), "job job-1-a: 5 more stored seats are not used");
}

TEST(SeatTableTest, MoreStoredSeatsThanAJobCanHoldAreNoneOfThemUsed) {
  MemoryStateStore store;
  for (size_t i = 0; i <= kMaxStoredSeats; ++i) {
    ASSERT_TRUE(store.SaveSeat("job-1-a", "w" + std::to_string(i), static_cast<uint32_t>(i)).ok());
  }
  std::vector<Status> dropped;
  SeatTable seats(&store, "job-1-a");
  ASSERT_TRUE(seats.Load(0, &dropped).ok());
  EXPECT_EQ(seats.size(), 0u);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].message(),
            "job job-1-a: no stored seat is used, every client is seated again: seats table: job 'job-1-a': more "
            "than 100000 seats stored; expected at most 100000");
  auto seated = seats.Seat(Lone({"w5"}), 0);
  ASSERT_TRUE(seated.ok());
  EXPECT_EQ(Parties(*seated), (std::map<std::string, uint32_t>{{"w5", 0}}));
}

class SelectionTest : public JobRunnerFixture {
 protected:
  // Worker -> the party of each train task it received, in order.
  static std::vector<uint32_t> PartiesOf(const FakeWorker& worker) {
    std::vector<uint32_t> parties;
    for (const auto& turn : worker.turns()) parties.push_back(turn.task.party_index());
    return parties;
  }
};

TEST_F(SelectionTest, ARoundTakesClientsPerRoundOfTheReadyWorkersAsTheSeedDraws) {
  std::vector<FakeWorker*> workers;
  for (int i = 1; i <= 5; ++i) workers.push_back(&AddWorker("w" + std::to_string(i), Always(FakeAction::Upload())));
  v1::JobSpec spec = SmallSpec(5, 3);
  spec.set_clients_per_round(3);
  v1::Job job = Run(spec);
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  // Every ready worker is seated (new ones in name order take parties 0..4); the policy
  // draws three of them for (seed, round 1, attempt 1).
  auto stored_seats = store_.LoadSeats(kJobId);
  ASSERT_TRUE(stored_seats.ok());
  std::vector<Client> candidates;
  for (const auto& [seat, party] : *stored_seats) candidates.push_back(Client{seat, "", party, {seat}});
  ASSERT_EQ(candidates.size(), 5u);
  std::set<std::string> expected;
  for (const auto& c : RandomSelection().Choose(candidates, spec, 1, 1)) expected.insert(c.seat);
  ASSERT_EQ(expected.size(), 3u);
  std::set<std::string> picked;
  for (FakeWorker* w : workers) {
    if (w->turns().empty()) continue;
    picked.insert(w->name());
    const uint32_t party = w->turns()[0].task.party_index();
    EXPECT_EQ(party, static_cast<uint32_t>(std::stoi(w->name().substr(1)) - 1)) << w->name();
  }
  EXPECT_EQ(picked, expected);
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].clients_selected(), 3u);
}

TEST_F(SelectionTest, SeatsAreStableAcrossRoundsAndARestartAndAWorkerWithoutAFreePartyIsLeftOut) {
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::UploadRandom(1)));
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::UploadRandom(2)));
  FakeWorker& w3 = AddWorker("w3", Always(FakeAction::UploadRandom(3)));
  v1::JobSpec spec = SmallSpec(3, 3);
  spec.set_rounds(2);
  ASSERT_EQ(Run(spec).state(), v1::JOB_SUCCEEDED);
  // As if the coordinator had restarted after round 2 of 3; a worker whose name sorts first
  // has joined meanwhile, and finds every party taken.
  FakeWorker& w0 = AddWorker("w0", Always(FakeAction::Upload()));
  v1::Job stored = Stored();
  stored.set_state(v1::JOB_RUNNING);
  stored.mutable_spec()->set_rounds(3);
  ASSERT_TRUE(store_.UpdateJob(stored).ok());
  StartRunner(stored);
  ASSERT_EQ(AwaitEnd().state(), v1::JOB_SUCCEEDED);
  EXPECT_EQ(PartiesOf(w1), (std::vector<uint32_t>{0, 0, 0}));
  EXPECT_EQ(PartiesOf(w2), (std::vector<uint32_t>{1, 1, 1}));
  EXPECT_EQ(PartiesOf(w3), (std::vector<uint32_t>{2, 2, 2}));
  EXPECT_TRUE(w0.turns().empty()) << "w0 has no party and is never selected";
  ASSERT_EQ(Rounds().size(), 3u);
}

TEST_F(SelectionTest, SeatsThatDoNotFitTheJobAreSeatedAgainWhenItResumesAndEveryPartyIsTrainedOnce) {
  FakeWorker& w1 = AddWorker("w1", Always(FakeAction::UploadRandom(1)));
  FakeWorker& w2 = AddWorker("w2", Always(FakeAction::UploadRandom(2)));
  FakeWorker& w3 = AddWorker("w3", Always(FakeAction::UploadRandom(3)));
  v1::JobSpec spec = SmallSpec(3, 3);
  ASSERT_EQ(Run(spec).state(), v1::JOB_SUCCEEDED);
  // The state database damaged or edited while the coordinator was down: w1 outside the
  // partition, w3 on w2's party. Used as stored, w1's updates (for party 7, which has no
  // samples) are refused every attempt until the round fails, and w2 and w3 both train party 1.
  ASSERT_TRUE(store_.SaveSeat(kJobId, "w1", 7).ok());
  ASSERT_TRUE(store_.SaveSeat(kJobId, "w3", 1).ok());
  v1::Job stored = Stored();
  stored.set_state(v1::JOB_RUNNING);
  stored.mutable_spec()->set_rounds(2);
  ASSERT_TRUE(store_.UpdateJob(stored).ok());
  StartRunner(stored);
  const v1::Job ended = AwaitEnd();
  ASSERT_EQ(ended.state(), v1::JOB_SUCCEEDED) << ended.error() << "\n" << Events();
  std::multiset<uint32_t> trained;
  for (FakeWorker* w : {&w1, &w2, &w3}) {
    ASSERT_EQ(PartiesOf(*w).size(), 2u) << w->name();
    trained.insert(PartiesOf(*w)[1]);
  }
  EXPECT_EQ(trained, (std::multiset<uint32_t>{0, 1, 2})) << "each party trained once in the resumed round";
  const std::string events = Events();
  EXPECT_NE(events.find("job job-1-test: seat 'w1' on party 7 is not used: expected a party below 3"),
            std::string::npos)
      << events;
  EXPECT_NE(events.find("job job-1-test: seat 'w2' on party 1 is not used: expected one seat a party, found 2"),
            std::string::npos)
      << events;
  EXPECT_NE(events.find("job job-1-test: seat 'w3' on party 1 is not used"), std::string::npos) << events;
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[1].workers_size(), 3);
}

TEST_F(SelectionTest, WorkersNotReadyAreNotSelected) {
  FakeWorker& alive = AddWorker("w1", Always(FakeAction::Upload()));
  FakeWorker& vanished = AddWorker("w2", Always(FakeAction::Upload()));
  FakeWorker& silent = AddWorker("w3", Always(FakeAction::Upload()));
  vanished.Vanish();  // its task channel closed
  // Past the heartbeat timeout: w1 heartbeats on time, w3 has been silent.
  registry_clock_.Advance(milliseconds(registry_.options().heartbeat_timeout_ms - 1000));
  ASSERT_TRUE(alive.Heartbeat().ok());
  registry_clock_.Advance(milliseconds(2000));
  v1::Job job = Run(SmallSpec(3, 1));
  ASSERT_EQ(job.state(), v1::JOB_SUCCEEDED) << job.error();
  auto rounds = Rounds();
  ASSERT_EQ(rounds.size(), 1u);
  ASSERT_EQ(rounds[0].workers_size(), 1);
  EXPECT_EQ(rounds[0].workers(0).worker_id(), "w1");
  EXPECT_TRUE(vanished.turns().empty());
  EXPECT_TRUE(silent.turns().empty());
}

}  // namespace
}  // namespace tessera::server
