// The asynchronous driver's test fixture: a JobRunnerFixture with an asynchronous job's spec,
// workers whose updates go when the test opens a gate per task, and a hook that holds a thread
// until the test releases it.
#pragma once

#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "job_runner_fixture.h"

namespace tessera::server {

// One gate per task, per worker, in the order the tasks arrive: the test opens the n-th
// task's gate to let that update go. The gates live in a state the script shares, so a worker
// that asks the script while the fixture tears down (after the test's locals are gone) still
// finds them.
class GatedTasks {
 public:
  FakeWorker::Script Script() {
    return [state = state_](const v1::TrainTask&) {
      auto gate = std::make_shared<Gate>();
      {
        std::lock_guard<std::mutex> lock(state->mu);
        state->gates.push_back(gate);
        if (state->open) gate->Open();
      }
      state->cv.notify_all();
      return FakeAction::UploadLate(gate);
    };
  }
  // Opens the gate of the worker's `task`-th task, once the worker has taken that task up (a
  // task is received on the channel before the worker's thread asks the script).
  void Open(size_t task) {
    std::shared_ptr<Gate> gate;
    {
      std::unique_lock<std::mutex> lock(state_->mu);
      ASSERT_TRUE(state_->cv.wait_for(lock, kWaitLimit, [&] { return task < state_->gates.size(); }))
          << "task " << task << " was never taken up";
      gate = state_->gates[task];
    }
    gate->Open();
  }
  // Opens every gate, and those of the tasks to come: the worker answers at once from now on.
  void OpenAll() {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->open = true;
    for (auto& gate : state_->gates) gate->Open();
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
    std::deque<std::shared_ptr<Gate>> gates;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// Holds a thread at a test's hook (an upload's between its check and its fold, a checkpoint's
// write) until Release(). Its state is shared with the hook, which the held thread may still
// be leaving when the test's locals are gone.
class HeldThread {
 public:
  // `first_only`: only the first call is held; later ones go through.
  std::function<void()> Hook(bool first_only = false) {
    return [state = state_, first_only] {
      std::unique_lock<std::mutex> lock(state->mu);
      if (first_only && state->entered) return;
      state->entered = true;
      state->cv.notify_all();
      state->cv.wait_for(lock, kWaitLimit, [&] { return state->released; });
    };
  }
  // Whether a thread reached the hook within kWaitLimit.
  bool AwaitEntered() {
    std::unique_lock<std::mutex> lock(state_->mu);
    return state_->cv.wait_for(lock, kWaitLimit, [&] { return state_->entered; });
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->released = true;
    }
    state_->cv.notify_all();
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool entered = false, released = false;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

class AsyncDriverTest : public JobRunnerFixture {
 protected:
  static v1::JobSpec AsyncSpec(uint32_t clients, uint32_t steps, uint32_t buffer, uint32_t max_staleness) {
    v1::JobSpec spec = SmallSpec(clients, clients);
    spec.set_rounds(steps);
    auto* async = spec.mutable_async();
    async->set_buffer_size(buffer);
    async->set_max_staleness(max_staleness);
    async->set_staleness_weighting("polynomial");
    async->set_staleness_exponent(0.5);
    async->set_concurrency(clients);
    return spec;
  }

  // The updates of `worker` refused as its fault so far (the registry's count).
  uint64_t UpdatesRejected(const std::string& worker) {
    for (const auto& status : registry_.List()) {
      if (status.worker_id() == worker) return status.updates_rejected();
    }
    ADD_FAILURE() << "no worker '" << worker << "'";
    return 0;
  }

  // The n-th train task `worker` received (0-based); blocks until it has.
  static v1::TrainTask TrainTask(const FakeWorker& worker, size_t n) {
    v1::TrainTask found;
    EXPECT_TRUE(worker.Await([&](const std::vector<v1::Task>& received, const std::vector<FakeTurn>&) {
      size_t seen = 0;
      for (const auto& task : received) {
        if (!task.has_train()) continue;
        if (seen++ == n) {
          found = task.train();
          return true;
        }
      }
      return false;
    })) << worker.name() << " never received train task " << n;
    return found;
  }

  // `worker`'s first update refused, its verdict holding `expected`; the worker, past its rest,
  // trains again and its next update makes the job's one step. An update refused between its
  // check and its fold leaves neither its task nor a buffer waiting for a fold that never ends.
  void ExpectRefusedAndTrainedAgain(FakeWorker& worker, const std::string& expected) {
    const v1::TrainTask first = TrainTask(worker, 0);
    ASSERT_TRUE(worker.AwaitFinished(first.round(), 1));
    const auto turns = worker.turns();
    ASSERT_FALSE(turns.empty());
    ASSERT_TRUE(turns.front().verdict.has_value());
    EXPECT_NE(turns.front().verdict->message().find(expected), std::string::npos) << turns.front().verdict->ToString();
    ASSERT_TRUE(AwaitRunnerWaiting());
    clock_.Advance(std::chrono::milliseconds(1100));  // past the refused client's rest
    EXPECT_GT(TrainTask(worker, 1).round(), first.round());
    const v1::Job end = AwaitEnd();
    EXPECT_EQ(end.state(), v1::JOB_SUCCEEDED) << end.error();
    const auto rounds = Rounds();
    ASSERT_EQ(rounds.size(), 1u);
    EXPECT_EQ(rounds[0].async_step().updates_folded(), 1u);
    EXPECT_EQ(rounds[0].async_step().updates_refused(), 1u);
  }

  bool AwaitCommitted(uint32_t version) { return AwaitEvent("committed round " + std::to_string(version) + ";"); }

  // Every accepted report in the job's records, by worker: (step, staleness, weight).
  struct Folded {
    uint32_t step;
    uint32_t staleness;
    double weight;
  };
  std::map<std::string, std::vector<Folded>> FoldedByWorker() {
    std::map<std::string, std::vector<Folded>> folded;
    for (const auto& record : Rounds()) {
      for (const auto& report : record.workers()) {
        if (report.outcome() == "accepted") {
          folded[report.worker_id()].push_back({record.round(), report.staleness(), report.staleness_weight()});
        }
      }
    }
    return folded;
  }
};

}  // namespace tessera::server
