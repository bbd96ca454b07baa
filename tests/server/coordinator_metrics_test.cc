// The coordinator's Prometheus metrics over a long life: jobs that ended make room for the ones
// that run now, so that a family's bound (2,000 series, twelve phases a job) does not fold
// every job after the 166th into "other", where no rule or alert finds it.
#include "server/monitoring/coordinator_metrics.h"

#include <gtest/gtest.h>

#include "base/metrics.h"

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

}  // namespace
}  // namespace tessera::server
