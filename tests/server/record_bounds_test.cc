// A round's record is bounded (proto/record_bounds.h): its text is cut when the record is made
// and when a stored one is served, and the bound computed from the largest report holds.
#include "proto/record_bounds.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "base/escape.h"
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

}  // namespace
}  // namespace tessera::wire
