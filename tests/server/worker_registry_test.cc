// WorkerRegistry's liveness on a clock the test moves: a worker is lost after the heartbeat
// timeout of silence, at once when its task channel closes, and back with a heartbeat or a
// reopened channel; no test here sleeps.
#include "server/workers/worker_registry.h"

#include <gtest/gtest.h>

#include <chrono>

namespace tessera::server {
namespace {

using std::chrono::milliseconds;

// A task channel that takes nothing (the registry only needs one attached).
class NullSink final : public TaskChannelSink {
 public:
  void TasksQueued() override {}
  void Superseded() override {}
};

class WorkerRegistryTest : public ::testing::Test {
 protected:
  WorkerRegistryTest() : registry_(Options(&clock_)) {}

  static WorkerRegistryOptions Options(const Clock* clock) {
    WorkerRegistryOptions options;
    options.heartbeat_interval_ms = 5000;
    options.heartbeat_timeout_ms = 15000;
    options.clock = clock;
    return options;
  }

  v1::JoinResponse Join(const std::string& name) {
    v1::JoinRequest request;
    request.set_name(name);
    request.mutable_device()->set_kind("cpu");
    auto joined = registry_.Join(request);
    EXPECT_TRUE(joined.ok()) << joined.status().ToString();
    return joined.ok() ? *joined : v1::JoinResponse();
  }

  ManualClock clock_;
  WorkerRegistry registry_;
};

// Past max_workers known names a new name is refused, saying the limit and the flag, while
// every known one (joined, or from before a restart) still joins again.
TEST(WorkerRegistryLimitTest, ANewNamePastTheLimitIsRefusedAndKnownNamesStillRejoin) {
  ManualClock clock;
  WorkerRegistryOptions options;
  options.clock = &clock;
  options.max_workers = 3;
  WorkerRegistry registry(options);
  v1::WorkerStatus before_restart;
  before_restart.set_worker_id("old");
  registry.Restore({before_restart});
  v1::JoinRequest request;
  request.mutable_device()->set_kind("cpu");
  for (const char* name : {"w1", "w2"}) {
    request.set_name(name);
    ASSERT_TRUE(registry.Join(request).ok()) << name;
  }
  request.set_name("w3");
  EXPECT_EQ(registry.Admits("w3").code(), StatusCode::kResourceExhausted);
  auto refused = registry.Join(request);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("'w3'"), std::string::npos) << refused.status().message();
  EXPECT_NE(refused.status().message().find("--max-workers 3"), std::string::npos) << refused.status().message();
  EXPECT_EQ(registry.List().size(), 3u);
  for (const char* name : {"w1", "old"}) {
    request.set_name(name);
    EXPECT_TRUE(registry.Admits(name).ok()) << name;
    EXPECT_TRUE(registry.Join(request).ok()) << name;
  }
}

// A worker is forgotten only once it is not alive; then its name no longer counts toward
// max_workers, its channel is told to finish, and the name joins again as a new worker.
TEST(WorkerRegistryForgetTest, OnlyAWorkerNoLongerAliveIsForgottenAndItsNameIsFreed) {
  ManualClock clock;
  WorkerRegistryOptions options;
  options.clock = &clock;
  options.heartbeat_timeout_ms = 15000;
  options.max_workers = 2;
  WorkerRegistry registry(options);
  v1::WorkerStatus before_restart;
  before_restart.set_worker_id("old");
  before_restart.set_name("old");
  registry.Restore({before_restart});
  v1::JoinRequest request;
  request.set_name("w1");
  auto joined = registry.Join(request);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  bool superseded = false;
  class RecordingSink final : public TaskChannelSink {
   public:
    explicit RecordingSink(bool* superseded) : superseded_(superseded) {}
    void TasksQueued() override {}
    void Superseded() override { *superseded_ = true; }
   private:
    bool* superseded_;
  };
  ASSERT_TRUE(registry.OpenChannel("w1", registry.Generation("w1"), std::make_shared<RecordingSink>(&superseded)).ok());

  Status alive = registry.Forget("w1");
  EXPECT_EQ(alive.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(alive.message().find("'w1': it is alive"), std::string::npos) << alive.message();
  EXPECT_EQ(registry.List().size(), 2u);
  EXPECT_FALSE(superseded);

  const Status unknown = registry.Forget("no\nbody");
  EXPECT_EQ(unknown.code(), StatusCode::kNotFound);
  EXPECT_EQ(unknown.message(), "forget worker 'no\\nbody': no such worker") << "the name is echoed escaped";

  EXPECT_EQ(registry.Admits("w2").code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(registry.Forget("old").ok()) << "restored, never joined since: no session to go on with";
  EXPECT_TRUE(registry.Admits("w2").ok()) << "a forgotten name no longer counts toward max_workers";

  clock.Advance(std::chrono::milliseconds(15001));  // w1 is silent past the heartbeat timeout
  ASSERT_FALSE(registry.IsAlive("w1"));
  v1::WorkerStatus removed;
  ASSERT_TRUE(registry.Forget("w1", &removed).ok());
  EXPECT_EQ(removed.worker_id(), "w1");
  EXPECT_TRUE(superseded) << "the channel still attached is told to finish";
  EXPECT_TRUE(registry.List().empty());
  EXPECT_EQ(registry.Generation("w1"), 0u);
  EXPECT_EQ(registry.Authenticate("w1", joined->session()).code(), StatusCode::kUnauthenticated)
      << "the old session is gone with the worker";
  EXPECT_EQ(registry.Forget("w1").code(), StatusCode::kNotFound);
  auto again = registry.Join(request);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_NE(again->session(), joined->session());
  EXPECT_EQ(registry.List().size(), 1u);
}

// A clock that reads a few seconds past its epoch, as the steady clock does just after boot
// (a coordinator a service manager starts as the machine comes up). It never waits.
class JustBootedClock final : public Clock {
 public:
  TimePoint Now() const override { return TimePoint{} + std::chrono::seconds(3); }
  bool WaitUntil(std::unique_lock<std::mutex>&, std::condition_variable&, TimePoint,
                 const std::function<bool()>& done) const override {
    return done();
  }
};

// Workers known from before a restart are listed as not alive until they join, whatever the
// clock reads: not alive, not counted alive, not ready.
TEST(WorkerRegistryRestoreTest, ARestoredWorkerIsNotAliveUntilItJoinsEvenJustAfterBoot) {
  JustBootedClock clock;
  WorkerRegistryOptions options;
  options.clock = &clock;
  options.heartbeat_timeout_ms = 15000;
  WorkerRegistry registry(options);
  v1::WorkerStatus before_restart;
  before_restart.set_worker_id("old");
  before_restart.set_name("old");
  registry.Restore({before_restart});
  EXPECT_FALSE(registry.IsAlive("old"));
  const WorkerRegistry::Counts counts = registry.CountByLiveness();
  EXPECT_EQ(counts.alive, 0u);
  EXPECT_EQ(counts.gone, 1u);
  const std::vector<v1::WorkerStatus> listed = registry.List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_FALSE(listed[0].alive());
  EXPECT_EQ(listed[0].state(), "not joined since restart");
  v1::JoinRequest request;
  request.set_name("old");
  ASSERT_TRUE(registry.Join(request).ok());
  EXPECT_TRUE(registry.IsAlive("old")) << "joined: alive again";
  EXPECT_EQ(registry.CountByLiveness().alive, 1u);
}

// A worker that reads nothing while messages keep coming for it (verdicts of calls it keeps
// making, tasks) holds at most kMaxOutbox of them: the oldest go, the newest stay in order.
TEST_F(WorkerRegistryTest, AWorkersOutboxIsBoundedAndKeepsTheNewest) {
  const v1::JoinResponse joined = Join("w1");
  const size_t extra = 10;
  for (size_t i = 0; i < WorkerRegistry::kMaxOutbox + extra; ++i) {
    v1::Task task;
    task.mutable_verdict()->set_round(static_cast<uint32_t>(i));
    ASSERT_TRUE(registry_.Send(joined.worker_id(), task).ok());
  }
  EXPECT_EQ(registry_.outbox_dropped(), extra);
  auto channel = std::make_shared<NullSink>();
  const uint64_t generation = registry_.Generation(joined.worker_id());
  ASSERT_TRUE(registry_.OpenChannel(joined.worker_id(), generation, channel).ok());
  bool closed = false;
  size_t taken = 0;
  while (auto task = registry_.TakeTask(joined.worker_id(), generation, &closed)) {
    EXPECT_EQ(task->verdict().round(), extra + taken);
    ++taken;
  }
  EXPECT_FALSE(closed);
  EXPECT_EQ(taken, WorkerRegistry::kMaxOutbox);
}

TEST_F(WorkerRegistryTest, SilenceLongerThanTheTimeoutLosesAWorkerAndAHeartbeatBringsItBack) {
  const v1::JoinResponse w = Join("w1");
  EXPECT_EQ(w.heartbeat_interval_ms(), 5000u);
  EXPECT_EQ(w.heartbeat_timeout_ms(), 15000u);
  ASSERT_TRUE(registry_.IsAlive(w.worker_id()));
  clock_.Advance(milliseconds(15000));
  EXPECT_TRUE(registry_.IsAlive(w.worker_id())) << "exactly the timeout is not yet too long";
  clock_.Advance(milliseconds(1));
  EXPECT_FALSE(registry_.IsAlive(w.worker_id()));
  ASSERT_TRUE(registry_.Heartbeat(w.worker_id(), w.session(), "idle").ok());
  EXPECT_TRUE(registry_.IsAlive(w.worker_id()));
  // Heartbeats on time keep it alive however long it lives.
  for (int i = 0; i < 100; ++i) {
    clock_.Advance(milliseconds(5000));
    ASSERT_TRUE(registry_.Heartbeat(w.worker_id(), w.session(), "idle").ok());
  }
  EXPECT_TRUE(registry_.IsAlive(w.worker_id()));
}

TEST_F(WorkerRegistryTest, AClosedTaskChannelLosesAWorkerAtOnceWhateverItsHeartbeats) {
  const v1::JoinResponse w = Join("w1");
  const uint64_t generation = registry_.Generation(w.worker_id());
  auto sink = std::make_shared<NullSink>();
  ASSERT_TRUE(registry_.OpenChannel(w.worker_id(), generation, sink).ok());
  EXPECT_EQ(registry_.ReadyWorkers(), std::vector<std::string>{w.worker_id()});
  registry_.CloseChannel(w.worker_id(), generation, sink.get());
  EXPECT_FALSE(registry_.IsAlive(w.worker_id())) << "no waiting for the heartbeat timeout";
  EXPECT_TRUE(registry_.ReadyWorkers().empty());
  // Its heartbeats go on, saying "idle": it is still listed as not alive and disconnected.
  ASSERT_TRUE(registry_.Heartbeat(w.worker_id(), w.session(), "idle").ok());
  EXPECT_FALSE(registry_.IsAlive(w.worker_id()));
  const std::vector<v1::WorkerStatus> listed = registry_.List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_FALSE(listed[0].alive());
  EXPECT_EQ(listed[0].state(), "disconnected");
  // Reopening the channel in the same session brings it back.
  ASSERT_TRUE(registry_.OpenChannel(w.worker_id(), generation, std::make_shared<NullSink>()).ok());
  EXPECT_TRUE(registry_.IsAlive(w.worker_id()));
}

TEST_F(WorkerRegistryTest, ASilentWorkerLeavesTheReadyList) {
  const v1::JoinResponse quiet = Join("quiet");
  const v1::JoinResponse chatty = Join("chatty");
  for (const auto* w : {&quiet, &chatty}) {
    ASSERT_TRUE(registry_.OpenChannel(w->worker_id(), registry_.Generation(w->worker_id()),
                                      std::make_shared<NullSink>()).ok());
  }
  EXPECT_EQ(registry_.ReadyWorkers().size(), 2u);
  clock_.Advance(milliseconds(10000));
  ASSERT_TRUE(registry_.Heartbeat(chatty.worker_id(), chatty.session(), "idle").ok());
  clock_.Advance(milliseconds(10000));
  EXPECT_EQ(registry_.ReadyWorkers(), std::vector<std::string>{chatty.worker_id()});
  bool listed_gone = false;
  for (const auto& w : registry_.List()) {
    if (w.worker_id() == quiet.worker_id()) listed_gone = !w.alive();
  }
  EXPECT_TRUE(listed_gone);
}

// A bounded listing copies only the first workers, in name order, and tells how many there
// are; the liveness counts agree with the statuses without copying them.
TEST_F(WorkerRegistryTest, ABoundedListCopiesItsFirstWorkersAndCountsTheRest) {
  const v1::JoinResponse a = Join("a-worker");
  Join("b-worker");
  Join("c-worker");
  clock_.Advance(milliseconds(20000));  // all three silent past the timeout
  ASSERT_TRUE(registry_.Heartbeat(a.worker_id(), a.session(), "idle").ok());
  google::protobuf::RepeatedPtrField<v1::WorkerStatus> first;
  EXPECT_EQ(registry_.ListInto(&first, 2), 1u);  // 3 workers, 2 listed
  ASSERT_EQ(first.size(), 2);
  EXPECT_EQ(first[0].name(), "a-worker");
  EXPECT_EQ(first[1].name(), "b-worker");
  google::protobuf::RepeatedPtrField<v1::WorkerStatus> none;
  EXPECT_EQ(registry_.ListInto(&none, 0), 3u);
  EXPECT_EQ(none.size(), 0);
  EXPECT_EQ(registry_.List().size(), 3u);
  const WorkerRegistry::Counts counts = registry_.CountByLiveness();
  EXPECT_EQ(counts.alive, 1u);
  EXPECT_EQ(counts.gone, 2u);
}

// Whether a worker takes models inside its tasks is what its join said; a task queued with
// one comes out of TakeTask as one message, with the model parsed in, and counts as written.
TEST_F(WorkerRegistryTest, AnInlineModelIsForWorkersThatTakeItAndReadsAsOneMessage) {
  Join("old");
  v1::JoinRequest request;
  request.set_name("new");
  request.set_accepts_inline_model(true);
  ASSERT_TRUE(registry_.Join(request).ok());
  EXPECT_FALSE(registry_.AcceptsInlineModel("old"));
  EXPECT_TRUE(registry_.AcceptsInlineModel("new"));
  EXPECT_FALSE(registry_.AcceptsInlineModel("nobody"));

  v1::InlineModel model;
  model.mutable_manifest()->set_total_bytes(4);
  model.add_chunks()->set_data("abcd");
  OutgoingTask outgoing;
  outgoing.task.mutable_train()->set_job_id("job-1");
  outgoing.inline_model = std::make_shared<const std::string>(model.SerializeAsString());
  int written = 0;
  outgoing.on_written = [&] { ++written; };
  ASSERT_TRUE(registry_.Send("new", std::move(outgoing)).ok());
  bool closed = false;
  auto task = registry_.TakeTask("new", registry_.Generation("new"), &closed);
  ASSERT_TRUE(task.has_value());
  EXPECT_EQ(task->train().job_id(), "job-1");
  EXPECT_EQ(task->train().inline_model().chunks(0).data(), "abcd");
  EXPECT_EQ(task->train().inline_model().manifest().total_bytes(), 4u);
  EXPECT_EQ(written, 1);

  // A round's task as shared bytes and the worker's own fields reads as their merge.
  v1::TrainTask shared;
  shared.set_job_id("job-1");
  shared.set_round(4);
  v1::TrainTask own;
  own.set_party_index(3);
  OutgoingTask by_wire;
  by_wire.train_shared = std::make_shared<const std::string>(shared.SerializeAsString());
  by_wire.train_own = own.SerializeAsString();
  by_wire.inline_model = std::make_shared<const std::string>(model.SerializeAsString());
  ASSERT_TRUE(registry_.Send("new", std::move(by_wire)).ok());
  task = registry_.TakeTask("new", registry_.Generation("new"), &closed);
  ASSERT_TRUE(task.has_value());
  EXPECT_EQ(task->train().job_id(), "job-1");
  EXPECT_EQ(task->train().round(), 4u);
  EXPECT_EQ(task->train().party_index(), 3u);
  EXPECT_EQ(task->train().inline_model().chunks(0).data(), "abcd");
}

// A name or cohort outside the rule is refused, named escaped (a control character never
// reaches a log raw) and bounded.
TEST_F(WorkerRegistryTest, ANameOrCohortOutsideTheRuleIsRefusedNamedEscaped) {
  v1::JoinRequest request;
  request.mutable_device()->set_kind("cpu");
  request.set_name("w\n1");
  auto named = registry_.Join(request);
  ASSERT_FALSE(named.ok());
  EXPECT_EQ(named.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(named.status().message().find("join: field 'name' 'w\\n1': expected letters"), std::string::npos)
      << named.status().message();
  EXPECT_EQ(named.status().message().find('\n'), std::string::npos) << named.status().message();
  request.set_name("w1");
  request.set_cohort(std::string(129, 'c'));
  auto long_cohort = registry_.Join(request);
  ASSERT_FALSE(long_cohort.ok());
  EXPECT_NE(long_cohort.status().message().find("join: field 'cohort'"), std::string::npos) << long_cohort.status().message();
  EXPECT_NE(long_cohort.status().message().find("expected at most 128"), std::string::npos) << long_cohort.status().message();
  request.set_cohort("site\x1b[2J");
  auto control = registry_.Join(request);
  ASSERT_FALSE(control.ok());
  EXPECT_EQ(control.status().message().find('\x1b'), std::string::npos) << control.status().message();
  request.set_cohort("site-a.1");
  EXPECT_TRUE(registry_.Join(request).ok());
}

// The coordinator's own pause (its process stopped, its VM paused) is not its workers'
// silence: the heartbeats they sent meanwhile wait unread in its sockets, and a round that looks
// at liveness as the process wakes, before the pause watch has ticked, must not drop them.
// Silence outside the pause still counts.
class WorkerRegistryPauseTest : public ::testing::Test {
 protected:
  static constexpr milliseconds kTick{250};

  WorkerRegistryPauseTest() : registry_(Options(&clock_)) {}

  static WorkerRegistryOptions Options(const Clock* clock) {
    WorkerRegistryOptions options;
    options.heartbeat_interval_ms = 5000;
    options.heartbeat_timeout_ms = 15000;
    options.clock = clock;
    options.pause_tick = kTick;
    options.pause_slack = milliseconds(1000);
    return options;
  }

  std::string Join(const std::string& name) {
    v1::JoinRequest request;
    request.set_name(name);
    request.mutable_device()->set_kind("cpu");
    auto joined = registry_.Join(request);
    EXPECT_TRUE(joined.ok()) << joined.status().ToString();
    return joined.ok() ? joined->worker_id() : "";
  }

  // Moves the clock by `by` in ticks, each once the pause watch waits for it: no pause.
  void Tick(milliseconds by) {
    for (milliseconds moved{0}; moved < by; moved += kTick) {
      ASSERT_TRUE(clock_.AwaitWaiters(1, std::chrono::seconds(30))) << "the pause watch never waited";
      clock_.Advance(kTick);
    }
    ASSERT_TRUE(clock_.AwaitWaiters(1, std::chrono::seconds(30)));
  }

  ManualClock clock_;
  WorkerRegistry registry_;
};

TEST_F(WorkerRegistryPauseTest, APauseLongerThanTheTimeoutLosesNobodyAndSilenceAfterItStillCounts) {
  const std::string id = Join("w1");
  ASSERT_TRUE(clock_.AwaitWaiters(1, std::chrono::seconds(30)));
  clock_.Advance(std::chrono::seconds(60));  // the coordinator stopped for a minute
  // Looked at before the pause watch has run: the pause is under way as far as it knows.
  EXPECT_TRUE(registry_.IsAlive(id)) << "a worker dropped for the coordinator's own pause";
  Tick(milliseconds(14500));  // 0.25 s of the minute plus 14.5 s since: 14.75 s of silence
  EXPECT_TRUE(registry_.IsAlive(id));
  Tick(milliseconds(500));  // 15.25 s
  EXPECT_FALSE(registry_.IsAlive(id)) << "silence after the pause is the worker's";
}

TEST_F(WorkerRegistryPauseTest, SilenceWithoutAPauseLosesAWorkerAsBefore) {
  const std::string id = Join("w1");
  Tick(milliseconds(15000));
  EXPECT_TRUE(registry_.IsAlive(id));
  Tick(milliseconds(250));
  EXPECT_FALSE(registry_.IsAlive(id));
}

TEST_F(WorkerRegistryPauseTest, AHeartbeatReadJustAfterAPauseCountsFromThere) {
  v1::JoinRequest request;
  request.set_name("w1");
  request.mutable_device()->set_kind("cpu");
  auto joined = registry_.Join(request);
  ASSERT_TRUE(joined.ok());
  ASSERT_TRUE(clock_.AwaitWaiters(1, std::chrono::seconds(30)));
  clock_.Advance(std::chrono::seconds(60));
  // The heartbeat queued during the pause is read before the watch ticks.
  ASSERT_TRUE(registry_.Heartbeat(joined->worker_id(), joined->session(), "idle").ok());
  Tick(milliseconds(15000));
  EXPECT_TRUE(registry_.IsAlive(joined->worker_id()));
  Tick(milliseconds(250));
  EXPECT_FALSE(registry_.IsAlive(joined->worker_id()));
}

}  // namespace
}  // namespace tessera::server
