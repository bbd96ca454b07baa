// A job's rounds read back through the job service: GetJob bounds each reply and the client
// reads page after page (proto/job_rounds.h). A thousand workers' round records pass a
// client's 4 MiB receive limit in about 50 rounds; before paging, `tessera status` and
// `tessera rounds` of such a job failed with RESOURCE_EXHAUSTED.
#include <gtest/gtest.h>

#include "proto/job_rounds.h"
#include "proto/list_reply.h"
#include "server/coordinator.h"
#include "server/state/sqlite_state_store.h"
#include "tests/integration/harness.h"

namespace tessera::testing {
namespace {

constexpr uint32_t kRounds = 80;
constexpr int kWorkersPerRound = 1000;

// A finished job of kRounds rounds of kWorkersPerRound workers each (about 69 KB a record,
// 5.5 MB in all), written to `state_dir` as a coordinator would have left it; the bytes of
// its records in *total.
void WriteFinishedJob(const std::string& state_dir, const std::string& job_id, size_t* total) {
  auto store = server::SqliteStateStore::Open(state_dir);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  v1::Job job;
  job.set_id(job_id);
  *job.mutable_spec() = SmallJob(kRounds, 1);
  job.set_state(v1::JOB_RUNNING);
  ASSERT_TRUE((*store)->InsertJob(job).ok());
  const TensorSet model = {{"w", {2}, {0.5f, -0.5f}}};
  ASSERT_TRUE((*store)->SaveInitialModel(job_id, model).ok());
  for (uint32_t round = 1; round <= kRounds; ++round) {
    v1::RoundRecord record;
    record.set_job_id(job_id);
    record.set_round(round);
    record.set_attempt(1);
    record.set_clients_selected(kWorkersPerRound);
    record.set_clients_reported(kWorkersPerRound);
    for (int w = 0; w < kWorkersPerRound; ++w) {
      v1::WorkerRoundReport* report = record.add_workers();
      report->set_worker_id("simulated-worker-" + std::to_string(w) + "-of-a-thousand");
      report->set_samples(600);
      report->set_compute_ms(1.5 + w);
      report->set_upload_ms(0.25 * round);
      report->set_outcome("accepted");
    }
    *total += record.ByteSizeLong();
    job.set_rounds_committed(round);
    if (round == kRounds) job.set_state(v1::JOB_SUCCEEDED);
    ASSERT_TRUE((*store)->CommitRound(job, record, model).ok()) << "round " << round;
  }
}

TEST(JobRoundsTest, RoundsBeyondOneReplyArriveInPagesInOrder) {
  TempDir dir("job-rounds-pages");
  const std::string job_id = "job-1-a1b2c3";
  size_t total = 0;
  WriteFinishedJob(dir.str(), job_id, &total);
  if (HasFatalFailure()) return;
  ASSERT_GT(total, size_t{4} << 20) << "the rounds must not fit one reply of the client's 4 MiB limit";
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  auto stub = JobStub((*coordinator)->port());

  // One call: a bounded reply (the job's own bytes counted) that says where it stopped, in the
  // reply and in its trailing metadata.
  grpc::ClientContext ctx;
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  request.set_include_rounds(true);
  v1::GetJobResponse page;
  grpc::Status got = stub->GetJob(&ctx, request, &page);
  ASSERT_TRUE(got.ok()) << got.error_message();
  EXPECT_EQ(page.job().state(), v1::JOB_SUCCEEDED);
  EXPECT_LE(page.ByteSizeLong(), size_t{3} << 20);
  ASSERT_GT(page.rounds_size(), 0);
  ASSERT_LT(page.rounds_size(), static_cast<int>(kRounds));
  EXPECT_EQ(page.next_round(), static_cast<uint32_t>(page.rounds_size()) + 1);
  for (int i = 0; i < page.rounds_size(); ++i) EXPECT_EQ(page.rounds(i).round(), static_cast<uint32_t>(i) + 1);
  const auto trailer = ctx.GetServerTrailingMetadata().find(wire::kNextRoundTrailer);
  ASSERT_NE(trailer, ctx.GetServerTrailingMetadata().end());
  EXPECT_EQ(std::string(trailer->second.data(), trailer->second.size()), std::to_string(page.next_round()));

  // Page after page: every round once, in order, each with its workers.
  v1::GetJobResponse all;
  got = wire::GetJobWithRounds(*stub, job_id, nullptr, &all);
  ASSERT_TRUE(got.ok()) << got.error_message();
  ASSERT_EQ(all.rounds_size(), static_cast<int>(kRounds));
  for (uint32_t i = 0; i < kRounds; ++i) {
    EXPECT_EQ(all.rounds(i).round(), i + 1);
    EXPECT_EQ(all.rounds(i).workers_size(), kWorkersPerRound);
  }
  EXPECT_EQ(all.job().rounds_committed(), kRounds);

  // From a round on, over more than one page.
  v1::GetJobResponse tail;
  ASSERT_TRUE(wire::GetJobWithRounds(*stub, job_id, nullptr, &tail, 10).ok());
  ASSERT_EQ(tail.rounds_size(), static_cast<int>(kRounds) - 9);
  for (int i = 0; i < tail.rounds_size(); ++i) EXPECT_EQ(tail.rounds(i).round(), static_cast<uint32_t>(i) + 10);

  // A job the coordinator does not know: the call's error, as it came, and nothing kept.
  got = wire::GetJobWithRounds(*stub, "job-9-ffffff", nullptr, &tail);
  EXPECT_EQ(got.error_code(), grpc::StatusCode::NOT_FOUND) << got.error_message();
  EXPECT_EQ(tail.rounds_size(), 0);
}

}  // namespace
}  // namespace tessera::testing
