// The dashboard's /api/job reply is bounded whatever a job's rounds hold
// (server/monitoring/job_page.h): a round of 20,000 reports of hostile text, or a page of many
// small rounds, stays within the stated bound, says what it left out, and keeps the critical
// path's report.
#include "server/monitoring/job_page.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "proto/json.h"
#include "proto/record_bounds.h"
#include "tests/server/worst_round_record.h"

namespace tessera::server {
namespace {

// A report of the largest JSON: every name and the outcome at their bounds, of control
// characters (each an escape of 6 characters).
v1::WorkerRoundReport HostileReport(size_t index) {
  v1::WorkerRoundReport r = wire::testing::WorstReport(index);
  const std::string suffix = std::to_string(index);
  auto hostile = [&](size_t bytes) { return std::string(bytes - suffix.size(), '\x01') + suffix; };
  r.set_worker_id(hostile(kMaxNameBytes));
  r.set_cohort(hostile(kMaxNameBytes));
  r.set_collective_backend(hostile(kMaxNameBytes));
  for (std::string& m : *r.mutable_members()) m = hostile(kMaxNameBytes);
  r.set_outcome(hostile(wire::kMaxOutcomeBytes));
  return r;
}

v1::RoundRecord HostileRound(uint32_t round, size_t reports) {
  v1::RoundRecord record;
  record.set_round(round);
  record.set_attempt(UINT32_MAX);
  record.set_test_accuracy(-1.5e300);
  record.set_test_loss(-1.5e300);
  record.set_train_loss(-1.5e300);
  record.set_clients_selected(UINT32_MAX);
  record.set_clients_reported(UINT32_MAX);
  record.set_committed_unix_ms(INT64_MIN);
  record.set_upload_bytes(UINT64_MAX);
  record.set_download_bytes(UINT64_MAX);
  record.mutable_latency()->set_total_ms(-1.5e300);
  record.set_job_id(std::string(kMaxNameBytes, '\x02'));
  record.set_model_sha256(std::string(kMaxNameBytes, '\x03'));
  record.mutable_latency()->set_critical_worker(std::string(kMaxNameBytes, '\x04'));
  record.mutable_async_step()->set_updates_folded(UINT32_MAX);
  for (size_t i = 0; i < reports; ++i) *record.add_workers() = HostileReport(i);
  return record;
}

v1::Job SomeJob() {
  v1::Job job;
  job.set_id("job-1");
  job.set_error(std::string(wire::kMaxJobErrorBytes, '\x05'));
  return job;
}

TEST(DashboardPageTest, ARoundOfTheMostReportsIsCutToThePagesBoundAndSaysHowManyWereLeftOut) {
  v1::GetJobResponse page;
  *page.mutable_job() = SomeJob();
  v1::RoundRecord round = HostileRound(7, wire::kMaxRoundReports);
  // The critical path is a report far past the first ones kept.
  round.mutable_latency()->set_critical_worker(round.workers(15000).worker_id());
  *page.add_rounds() = round;
  *page.add_rounds() = HostileRound(8, 3);
  const size_t unbounded = wire::ToJson(page).size();
  EXPECT_GT(unbounded, size_t{60} << 20) << "the case this bounds";
  const std::string json = DashboardJobJson(page);
  EXPECT_LE(json.size(), wire::ToJson(page.job()).size() + kDashboardRoundsJsonBytes);
  EXPECT_NE(json.find("\"reports_left_out\":[{\"round\":7,\"count\":" +
                      std::to_string(wire::kMaxRoundReports - kDashboardReportsPerPage) + "}]}"),
            std::string::npos)
      << json.substr(json.size() - 200);
  EXPECT_NE(json.find("\"next_round\":8"), std::string::npos) << "round 8 is the next page's";
  EXPECT_EQ(json.find("\"round\":8,"), std::string::npos);
  // The critical path's report is among those kept.
  v1::WorkerRoundReport critical;
  critical.set_worker_id(round.workers(15000).worker_id());
  const std::string critical_json = wire::ToJson(critical);
  const std::string id_field = critical_json.substr(critical_json.find("\"worker_id\""));
  EXPECT_NE(json.find(id_field.substr(0, id_field.find(','))), std::string::npos);
}

TEST(DashboardPageTest, APageOfManyRoundsKeepsWithinTheRoundsAndReportsItMayCarry) {
  v1::GetJobResponse page;
  *page.mutable_job() = SomeJob();
  // Many rounds of two reports each: the reports' count ends the page (250 rounds would too).
  for (uint32_t r = 1; r <= 1000; ++r) *page.add_rounds() = HostileRound(r, 2);
  std::string json = DashboardJobJson(page);
  EXPECT_LE(json.size(), wire::ToJson(page.job()).size() + kDashboardRoundsJsonBytes);
  EXPECT_NE(json.find("\"next_round\":" + std::to_string(kDashboardReportsPerPage / 2 + 1)), std::string::npos);
  EXPECT_NE(json.find("\"reports_left_out\":[]"), std::string::npos);
  // Rounds without reports: the rounds' count ends it.
  for (auto& r : *page.mutable_rounds()) r.clear_workers();
  json = DashboardJobJson(page);
  EXPECT_LE(json.size(), wire::ToJson(page.job()).size() + kDashboardRoundsJsonBytes);
  EXPECT_NE(json.find("\"next_round\":" + std::to_string(kDashboardRoundsPerPage + 1)), std::string::npos);
  // A page within every bound is as it was, with nothing left out.
  page.mutable_rounds()->DeleteSubrange(3, page.rounds_size() - 3);
  json = DashboardJobJson(page);
  EXPECT_NE(json.find("\"next_round\":0"), std::string::npos);
  const std::string plain = wire::ToJson(page);
  EXPECT_EQ(json, plain.substr(0, plain.size() - 1) + ",\"reports_left_out\":[]}");
}

}  // namespace
}  // namespace tessera::server
