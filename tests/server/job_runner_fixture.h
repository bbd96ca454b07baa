// The round driver without gRPC, disk or real time: a JobRunner over a MemoryStateStore and a
// real WorkerRegistry, with FakeWorkers in place of the network, and time on ManualClocks.
//
//  - clock_ is the runner's: round deadlines, the wait for workers, retry delays and recorded
//    latencies. It moves only when a test calls Advance(); a test that needs the runner to be
//    in a wait before it moves time calls AwaitRunnerWaiting() first.
//  - registry_clock_ is the registry's: it stands still, so workers stay alive without
//    heartbeats until a test moves it or one vanishes.
//
// Nothing here sleeps: every wait is on a condition with kWaitLimit as its bound, reached
// only when a test fails.
#pragma once

#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/clock.h"
#include "fake_worker.h"
#include "server/jobs/job_runner.h"
#include "server/state/memory_state_store.h"
#include "server/workers/rendezvous_store.h"
#include "server/workers/worker_registry.h"

namespace tessera::server {

class JobRunnerFixture : public ::testing::Test {
 public:
  // A one-round MLP job on the IID partition of the operator's Fashion-MNIST among `clients`
  // parties, three attempts per round.
  static v1::JobSpec SmallSpec(uint32_t clients, uint32_t min_clients, uint32_t deadline_ms = 60000);

 protected:
  static constexpr char kJobId[] = "job-1-test";

  JobRunnerFixture();
  void TearDown() override;

  // A worker, joined and ready before it is returned.
  FakeWorker& AddWorker(const std::string& name, FakeWorker::Script script);
  // The same action for every task.
  static FakeWorker::Script Always(FakeAction action);

  // Stores a pending job of `spec` and starts its runner; returns at once.
  void Submit(const v1::JobSpec& spec);
  // Starts a runner for `job` as stored (a new one, or one resumed after a stop).
  void StartRunner(const v1::Job& job);
  // Blocks until the job ends (its event log closes), then joins the runner's thread;
  // returns the job as the runner last saw it.
  v1::Job AwaitEnd();
  v1::Job Run(const v1::JobSpec& spec);
  // Stops the runner as the coordinator's shutdown does (blocks until its thread ended).
  void StopRunner();
  std::shared_ptr<JobRunner> runner();

  // Blocks until the runner's thread waits on clock_ (exactly one waiter): an Advance() from
  // now on is seen by that wait, or, where the wait counted is one whose condition was just
  // met and that is ending, by the next: the runner's wait ends by a deadline taken from
  // the clock before it looked at what time decides.
  bool AwaitRunnerWaiting();
  // Moves the clock by `step` each time the runner waits on it, until the job has ended: for a
  // job that may end at its runner's first look or at a later one (a lost worker seen at once
  // or a liveness check on). False when it has not ended within kWaitLimit's looks.
  bool AdvanceUntilEnded(std::chrono::milliseconds step);
  // Blocks until a published note (or progress line, or "committed round N;" for a round's
  // record) contains `text`.
  bool AwaitEvent(const std::string& text);
  // The notes and progress lines published, one per line.
  std::string Events();

  v1::Job Stored();
  std::vector<v1::RoundRecord> Rounds();
  // The report of `worker` in `record`, or an empty one with outcome "absent".
  static v1::WorkerRoundReport ReportOf(const v1::RoundRecord& record, const std::string& worker);

  ManualClock clock_;
  ManualClock registry_clock_;
  MemoryStateStore store_;
  WorkerRegistry registry_;
  RendezvousStore rendezvous_;
  JobRunnerOptions options_;

 private:
  std::mutex mu_;  // guards runner_
  std::shared_ptr<JobRunner> runner_;
  std::vector<std::shared_ptr<FakeWorker>> workers_;

  std::mutex events_mu_;
  std::condition_variable events_cv_;
  std::vector<std::string> events_;
  bool ended_ = false;
};

}  // namespace tessera::server
