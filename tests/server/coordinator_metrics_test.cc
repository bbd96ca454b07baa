// The coordinator's Prometheus metrics: over a long life, jobs that ended make room for the ones
// that run now, so that a family's bound (2,000 series, twelve phases a job) does not fold
// every job after the 166th into "other", where no rule or alert finds it; and each update is
// counted as what happened to it, whatever text a worker put in its report or its name.
#include "server/monitoring/coordinator_metrics.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "base/metrics.h"
#include "server/coordinator.h"
#include "tests/server/test_directory.h"

namespace tessera::server {
namespace {

v1::RoundRecord CommittedRound(const std::string& job_id) {
  v1::RoundRecord r;
  r.set_job_id(job_id);
  r.set_round(1);
  r.mutable_latency()->set_total_ms(1500);
  r.mutable_latency()->set_compute_ms_max(900);
  v1::WorkerRoundReport& w = *r.add_workers();
  w.set_worker_id("metrics-w1");
  w.set_outcome("accepted");
  w.set_compute_ms(900);
  return r;
}

TEST(CoordinatorMetricsTest, AJobAfterHundredsOfEndedOnesHasItsOwnLatencySeries) {
  for (int i = 0; i < 400; ++i) {
    const std::string id = "job-" + std::to_string(i) + "-ended";
    RecordRound(CommittedRound(id));
    RecordRetry(id);
    RetireJob(id);
  }
  RecordRound(CommittedRound("job-401-running"));
  const std::string text = metrics::Global().Render();
  const std::string job = "job=\"job-401-running\"";
  EXPECT_NE(text.find("\ntessera_round_phase_seconds_count{" + job + ",phase=\"total\"} 1\n"), std::string::npos)
      << text.substr(0, 2000);
  EXPECT_NE(text.find("\ntessera_round_phase_seconds_sum{" + job + ",phase=\"compute\"} 0.9\n"), std::string::npos);
  EXPECT_NE(text.find("\ntessera_rounds_committed_total{" + job + "} 1\n"), std::string::npos);
  EXPECT_NE(text.find("\ntessera_updates_total{" + job + ",outcome=\"accepted\",reason=\"none\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("\ntessera_rounds_retried_total{" + job + "} 0\n"), std::string::npos);
  EXPECT_EQ(text.find("job=\"other\""), std::string::npos) << "nothing was folded while ended jobs made room";
}

// What follows an outcome's prefix is partly a worker's own text: a failure is a drop with
// reason "failed" whatever it says, and a worker that left is "lost" whatever its name.
TEST(CoordinatorMetricsTest, AWorkersOwnTextDoesNotChooseHowItsUpdateIsCounted) {
  v1::RoundRecord r = CommittedRound("job-7-classes");
  r.clear_workers();
  for (const std::string& outcome :
       {std::string("failed: INTERNAL: the loss is not finite at step 3, past the round's deadline (max_update_norm)"),
        std::string("dropped: worker 'deadline-7' lost (no heartbeat, disconnected or restarted)"),
        std::string("dropped: deadline passed"),
        std::string("dropped: over-selected, the round had its 2 updates"),
        std::string("dropped: too stale to be folded (trained from version 3, 5 versions behind)"),
        std::string("rejected: update of worker 'w4' step 9: too stale: trained from model version 2, 6 versions "
                    "behind the model it would be folded into; max_staleness is 4"),
        std::string("rejected: update of worker 'w3' round 1: its delta's L2 norm 2e+09 is beyond max_update_norm 1000")}) {
    v1::WorkerRoundReport& w = *r.add_workers();
    w.set_worker_id("metrics-w2");
    w.set_outcome(outcome);
  }
  RecordRound(r);
  const std::string text = metrics::Global().Render();
  const std::string job = "job=\"job-7-classes\"";
  for (const char* series : {",outcome=\"dropped\",reason=\"failed\"} 1\n", ",outcome=\"dropped\",reason=\"lost\"} 1\n",
                             ",outcome=\"dropped\",reason=\"deadline\"} 1\n",
                             ",outcome=\"dropped\",reason=\"over_selected\"} 1\n",
                             ",outcome=\"dropped\",reason=\"stale\"} 1\n", ",outcome=\"refused\",reason=\"stale\"} 1\n",
                             ",outcome=\"refused\",reason=\"norm\"} 1\n"}) {
    EXPECT_NE(text.find("\ntessera_updates_total{" + job + series), std::string::npos) << series << "\n" << text;
  }
  EXPECT_NE(text.find("\ntessera_stragglers_total{" + job + "} 1\n"), std::string::npos)
      << "only the one dropped at the deadline is a straggler";
}

// A worker an operator forgets leaves its series to be taken by newer workers once the
// family is full, as an ended job does: it is not kept for good at the cost of a new worker's.
TEST(CoordinatorMetricsTest, AForgottenWorkersSeriesMakeRoomForNewWorkers) {
  const std::filesystem::path dir = FreshTestDirectory("tessera-metrics-forget");
  {
    auto coordinator = Coordinator::Start(LoopbackCoordinatorOptions(dir / "state", "metrics"));
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
    Coordinator& c = **coordinator;
    v1::JoinRequest join;
    join.set_name("forgotten-w1");
    ASSERT_TRUE(c.registry().Join(join).ok());
    RecordDownloadBytes("forgotten-w1", 1000);
    RecordUploadBytes("forgotten-w1", 500);
    c.registry().CloseChannel("forgotten-w1", c.registry().Generation("forgotten-w1"));  // lost: may be forgotten
    ASSERT_TRUE(c.ForgetWorker("forgotten-w1").ok());
    EXPECT_NE(metrics::Global().Render().find("worker=\"forgotten-w1\""), std::string::npos)
        << "shown until its room is needed";
    for (size_t i = 0; i < metrics::Registry::kDefaultMaxSeries; ++i) {
      const std::string worker = "later-w" + std::to_string(i);
      RecordDownloadBytes(worker, 1);
      RecordUploadBytes(worker, 1);
    }
    const std::string text = metrics::Global().Render();
    EXPECT_EQ(text.find("worker=\"forgotten-w1\""), std::string::npos) << "its room went to a newer worker";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::server
