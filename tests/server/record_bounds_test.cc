// A round's record is bounded (proto/record_bounds.h): its text is cut when the record is made
// and when a stored one is served, and the bound computed from the largest report holds.
#include "proto/record_bounds.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/escape.h"
#include "proto/list_reply.h"
#include "tessera/v1/job_service.pb.h"
#include "tests/server/worst_round_record.h"

namespace tessera::wire {
namespace {

using testing::WorstReport;
using testing::WorstRecord;

constexpr std::string_view kEllipsis = "\xE2\x80\xA6";

bool EndsWith(const std::string& text, std::string_view end) {
  return text.size() >= end.size() && text.compare(text.size() - end.size(), end.size(), end) == 0;
}

TEST(RecordBoundsTest, TheLargestReportIsTheComputedBound) {
  v1::RoundRecord record;
  *record.add_workers() = WorstReport(7);
  EXPECT_EQ(record.ByteSizeLong(), kMaxWorkerReportBytes);
  // Bounding it changes nothing: it is within every bound already.
  v1::WorkerRoundReport bounded = WorstReport(7);
  BoundReport(&bounded);
  EXPECT_EQ(bounded.SerializeAsString(), WorstReport(7).SerializeAsString());
}

TEST(RecordBoundsTest, ALongOutcomeIsCutBetweenCharactersWithAnEllipsis) {
  std::string outcome = "failed: ";
  for (int i = 0; i < 300000; ++i) outcome += "\xC3\xA9";  // é, two bytes
  const std::string bounded = BoundedText(outcome, kMaxOutcomeBytes);
  EXPECT_LE(bounded.size(), kMaxOutcomeBytes);
  EXPECT_GE(bounded.size(), kMaxOutcomeBytes - 4);
  EXPECT_EQ(bounded.rfind("failed: \xC3\xA9", 0), 0u);
  EXPECT_TRUE(EndsWith(bounded, kEllipsis));
  EXPECT_EQ(bounded, ValidUtf8(bounded, bounded.size())) << "cut inside a character";
  // Short text, and text exactly at the bound, stay as they are.
  EXPECT_EQ(BoundedText("accepted", kMaxOutcomeBytes), "accepted");
  const std::string exact(kMaxOutcomeBytes, 'x');
  EXPECT_EQ(BoundedText(exact, kMaxOutcomeBytes), exact);
  // Bytes that are not UTF-8 (proto3 strings must be) are replaced, the bound still kept.
  const std::string bad = BoundedText(std::string(kMaxOutcomeBytes, '\xFF'), kMaxOutcomeBytes);
  EXPECT_LE(bad.size(), kMaxOutcomeBytes);
  EXPECT_EQ(bad.rfind("\xEF\xBF\xBD", 0), 0u);
}

TEST(RecordBoundsTest, AReportKeepsItsFirstMembersAndCountsThemAll) {
  v1::WorkerRoundReport report = WorstReport(3, /*over=*/1000);
  report.set_member_count(0);
  ASSERT_GT(static_cast<size_t>(report.members_size()), kMaxListedMembers);
  const int members = report.members_size();
  const std::string leader = report.members(0);
  BoundReport(&report);
  EXPECT_EQ(report.member_count(), static_cast<uint32_t>(members));
  ASSERT_EQ(static_cast<size_t>(report.members_size()), kMaxListedMembers);
  EXPECT_EQ(report.members(0), leader.substr(0, kMaxNameBytes - 3) + std::string(kEllipsis));
  EXPECT_LE(report.worker_id().size(), kMaxNameBytes);
  EXPECT_LE(report.cohort().size(), kMaxNameBytes);
  EXPECT_LE(report.collective_backend().size(), kMaxNameBytes);
  EXPECT_LE(report.outcome().size(), kMaxOutcomeBytes);
  EXPECT_TRUE(EndsWith(report.outcome(), kEllipsis));
  v1::RoundRecord record;
  *record.add_workers() = report;
  EXPECT_LE(record.ByteSizeLong(), kMaxWorkerReportBytes);
}

TEST(RecordBoundsTest, TheLargestRecordFitsItsBoundAndTheCommandLinesReceiveLimit) {
  v1::RoundRecord record = WorstRecord("job-1", 1, /*over=*/64);
  *record.add_workers() = WorstReport(0);  // one past the most a round lists
  EXPECT_GT(record.ByteSizeLong(), kMaxRoundRecordBytes);
  BoundRoundRecord(&record);
  EXPECT_EQ(static_cast<size_t>(record.workers_size()), kMaxRoundReports);
  const size_t bytes = record.ByteSizeLong();
  EXPECT_LE(bytes, kMaxRoundRecordBytes);
  EXPECT_GT(bytes, kMaxRoundRecordBytes - kMaxRecordHeaderBytes - kMaxWorkerReportBytes) << "not the worst case";
  EXPECT_GT(bytes, size_t{4} << 20) << "gRPC's default receive limit would take it";
  EXPECT_GE(kOperatorMaxReceiveBytes, bytes + kCoordinatorMaxReceiveBytes);
}

// A job at its largest: a spec of one whole submit request, an error of a megabyte (from a
// row stored before the bound), the largest round as its last; and the replies and events that
// carry it. Each is within its computed bound, and those within the command line's limit.
TEST(RecordBoundsTest, TheLargestJobAndItsRepliesFitTheirBoundsAndTheCommandLinesReceiveLimit) {
  v1::Job job;
  job.set_id(std::string(kMaxNameBytes + 10, 'j'));
  job.set_state(static_cast<v1::JobState>(-1));  // the widest enum on the wire, as a damaged row may hold
  job.set_rounds_committed(UINT32_MAX);
  job.set_created_unix_ms(INT64_MIN);
  job.set_cancel_requested(true);
  // The spec: as large as a SubmitJobRequest the coordinator accepts, then its input shape.
  v1::SubmitJobRequest submit;
  submit.mutable_spec()->set_name(std::string(kCoordinatorMaxReceiveBytes - 8, 'n'));
  while (submit.ByteSizeLong() > kCoordinatorMaxReceiveBytes) {
    submit.mutable_spec()->mutable_name()->pop_back();
  }
  ASSERT_GE(submit.ByteSizeLong(), kCoordinatorMaxReceiveBytes - 1);
  *job.mutable_spec() = submit.spec();
  v1::InputShape* shape = job.mutable_spec()->mutable_data()->mutable_input_shape();
  shape->set_channels(UINT32_MAX);
  shape->set_rows(UINT32_MAX);
  shape->set_cols(UINT32_MAX);
  shape->set_classes(UINT32_MAX);
  std::string error = "the round failed: ";
  while (error.size() < (size_t{1} << 20)) error += "\xC3\xA9";
  job.set_error(error);
  *job.mutable_last_round() = WorstRecord("job-1", 1, /*over=*/64);
  EXPECT_GT(job.ByteSizeLong(), kMaxJobBytes);
  BoundJob(&job);
  EXPECT_LE(job.error().size(), kMaxJobErrorBytes);
  EXPECT_GE(job.error().size(), kMaxJobErrorBytes - 4);
  EXPECT_TRUE(EndsWith(job.error(), kEllipsis));
  EXPECT_EQ(job.error(), ValidUtf8(job.error(), job.error().size())) << "cut inside a character";
  EXPECT_LE(job.id().size(), kMaxNameBytes);
  EXPECT_LE(job.ByteSizeLong(), kMaxJobBytes);
  EXPECT_GT(job.ByteSizeLong(), kMaxJobBytes - kMaxRecordHeaderBytes - kMaxWorkerReportBytes - 512)
      << "not the worst case";
  EXPECT_LE(kMaxJobBytes, kOperatorMaxReceiveBytes);

  // As listed: without the last round's reports; any one job fits a list reply.
  v1::Job listed = job;
  listed.mutable_last_round()->clear_workers();
  EXPECT_LE(listed.ByteSizeLong(), kMaxListedJobBytes);
  v1::ListJobsResponse list;
  *list.add_jobs() = listed;
  list.set_more(UINT64_MAX);
  EXPECT_LE(list.ByteSizeLong(), kMaxListBytes);

  // GetJob with its rounds: the job as listed and one worst round (a page's first is always sent).
  v1::GetJobResponse reply;
  *reply.mutable_job() = listed;
  *reply.add_rounds() = WorstRecord("job-1", 1);
  reply.set_next_round(UINT32_MAX);
  EXPECT_LE(reply.ByteSizeLong(), kMaxGetJobReplyBytes);
  EXPECT_LE(kMaxGetJobReplyBytes, kOperatorMaxReceiveBytes);

  // A watch's event: every part at its largest, bounded as the log bounds it.
  v1::JobEvent event;
  *event.mutable_job() = job;  // its last round's reports are dropped
  event.mutable_job()->set_error(error);
  *event.mutable_round() = WorstRecord("job-1", 1, /*over=*/64);
  event.set_message(error);
  for (int i = 0; i < 100; ++i) event.mutable_progress()->add_waiting_on(std::string(kMaxNameBytes * 2, 'w'));
  event.mutable_progress()->set_round(UINT32_MAX);
  event.mutable_progress()->set_attempt(UINT32_MAX);
  event.mutable_progress()->set_selected(UINT32_MAX);
  event.mutable_progress()->set_reported(UINT32_MAX);
  event.mutable_progress()->set_waiting_more(UINT32_MAX);
  event.mutable_progress()->set_deadline_in_ms(-1.5e300);
  BoundJobEvent(&event);
  EXPECT_EQ(event.job().last_round().workers_size(), 0);
  EXPECT_LE(event.message().size(), kMaxNoteBytes);
  EXPECT_EQ(event.progress().waiting_more(), UINT32_MAX) << "the count saturates";
  EXPECT_LE(event.ByteSizeLong(), kMaxJobEventBytes);
  EXPECT_LE(kMaxJobEventBytes, kOperatorMaxReceiveBytes);
}

}  // namespace
}  // namespace tessera::wire
