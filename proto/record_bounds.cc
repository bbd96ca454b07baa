#include "proto/record_bounds.h"

#include <algorithm>
#include <cstdint>

#include "base/escape.h"

namespace tessera::wire {
namespace {

void BoundString(std::string* text, size_t max_bytes) {
  std::string bounded = BoundedText(*text, max_bytes);
  if (bounded != *text) *text = std::move(bounded);
}

}  // namespace

std::string BoundedText(std::string_view text, size_t max_bytes) {
  static constexpr std::string_view kEllipsis = "\xE2\x80\xA6";  // U+2026
  // Every byte as it was, or a 3-byte replacement for a byte that is not UTF-8.
  std::string valid = ValidUtf8(text, text.size() * 3);
  if (valid.size() <= max_bytes) return valid;
  const size_t kept = max_bytes >= kEllipsis.size() ? max_bytes - kEllipsis.size() : 0;
  return ValidUtf8(valid, kept) + std::string(kEllipsis);
}

void BoundReport(v1::WorkerRoundReport* report) {
  if (report->member_count() < static_cast<uint32_t>(report->members_size())) {
    report->set_member_count(static_cast<uint32_t>(report->members_size()));
  }
  if (static_cast<size_t>(report->members_size()) > kMaxListedMembers) {
    report->mutable_members()->DeleteSubrange(static_cast<int>(kMaxListedMembers),
                                              report->members_size() - static_cast<int>(kMaxListedMembers));
  }
  for (std::string& member : *report->mutable_members()) BoundString(&member, kMaxNameBytes);
  BoundString(report->mutable_worker_id(), kMaxNameBytes);
  BoundString(report->mutable_cohort(), kMaxNameBytes);
  BoundString(report->mutable_collective_backend(), kMaxNameBytes);
  BoundString(report->mutable_outcome(), kMaxOutcomeBytes);
}

void BoundRoundRecord(v1::RoundRecord* record) {
  if (static_cast<size_t>(record->workers_size()) > kMaxRoundReports) {
    record->mutable_workers()->DeleteSubrange(static_cast<int>(kMaxRoundReports),
                                              record->workers_size() - static_cast<int>(kMaxRoundReports));
  }
  for (v1::WorkerRoundReport& report : *record->mutable_workers()) BoundReport(&report);
  BoundString(record->mutable_job_id(), kMaxNameBytes);
  BoundString(record->mutable_model_sha256(), kMaxNameBytes);
  if (record->has_latency()) BoundString(record->mutable_latency()->mutable_critical_worker(), kMaxNameBytes);
}

void BoundJob(v1::Job* job) {
  BoundString(job->mutable_id(), kMaxNameBytes);
  BoundString(job->mutable_error(), kMaxJobErrorBytes);
  if (job->has_last_round()) BoundRoundRecord(job->mutable_last_round());
}

void BoundJobEvent(v1::JobEvent* event) {
  if (event->has_job()) {
    if (event->job().has_last_round()) event->mutable_job()->mutable_last_round()->clear_workers();
    BoundJob(event->mutable_job());
  }
  if (event->has_round()) BoundRoundRecord(event->mutable_round());
  BoundString(event->mutable_message(), kMaxNoteBytes);
  if (event->has_progress()) {
    v1::RoundProgress* progress = event->mutable_progress();
    if (static_cast<size_t>(progress->waiting_on_size()) > kMaxProgressWaitingOn) {
      const int extra = progress->waiting_on_size() - static_cast<int>(kMaxProgressWaitingOn);
      progress->mutable_waiting_on()->DeleteSubrange(static_cast<int>(kMaxProgressWaitingOn), extra);
      const uint64_t more = uint64_t{progress->waiting_more()} + static_cast<uint64_t>(extra);
      progress->set_waiting_more(static_cast<uint32_t>(std::min<uint64_t>(more, UINT32_MAX)));
    }
    for (std::string& name : *progress->mutable_waiting_on()) BoundString(&name, kMaxNameBytes);
  }
}

grpc::ChannelArguments OperatorChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(kOperatorMaxReceiveBytes));
  return args;
}

}  // namespace tessera::wire
