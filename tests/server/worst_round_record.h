// A round's record at its largest, for the tests of its bounds (proto/record_bounds.h).
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "proto/record_bounds.h"
#include "tessera/v1/job.pb.h"

namespace tessera::wire::testing {

// A report with every field set to its largest (`over` bytes past each text bound): with
// over = 0 as large as a bounded report can be, with more, as large as a record stored before
// the bounds held could hold it.
inline v1::WorkerRoundReport WorstReport(size_t index, size_t over = 0) {
  const std::string suffix = std::to_string(index);
  auto name = [&](char c) {
    std::string n(kMaxNameBytes + over, c);
    n.replace(n.size() - suffix.size(), suffix.size(), suffix);
    return n;
  };
  v1::WorkerRoundReport r;
  r.set_worker_id(name('w'));
  r.set_samples(std::numeric_limits<uint64_t>::max());
  r.set_compute_ms(-1.5e300);
  r.set_download_ms(-1.5e300);
  r.set_upload_ms(-1.5e300);
  r.set_train_loss(-1.5e300);
  r.set_outcome("failed: " + std::string(kMaxOutcomeBytes + over - 8, 'x'));
  r.set_cohort(name('c'));
  for (size_t m = 0; m < kMaxListedMembers + (over > 0 ? 2 : 0); ++m) r.add_members(name(static_cast<char>('a' + m)));
  r.set_member_count(std::numeric_limits<uint32_t>::max());
  r.set_collective_backend(name('b'));
  r.set_update_norm(-1.5e300);
  r.set_data_load_ms(-1.5e300);
  r.set_download_done_ms(-1.5e300);
  r.set_reported_ms(-1.5e300);
  r.set_local_test_samples(std::numeric_limits<uint64_t>::max());
  r.set_local_test_accuracy(-1.5e300);
  r.set_upload_bytes(std::numeric_limits<uint64_t>::max());
  r.set_download_bytes(std::numeric_limits<uint64_t>::max());
  r.set_dropped_ms(-1.5e300);
  r.set_staleness(std::numeric_limits<uint32_t>::max());
  r.set_staleness_weight(-1.5e300);
  return r;
}

// A round of kMaxRoundReports such reports.
inline v1::RoundRecord WorstRecord(const std::string& job_id, uint32_t round, size_t over = 0) {
  v1::RoundRecord record;
  record.set_job_id(job_id);
  record.set_round(round);
  record.set_attempt(1);
  record.set_clients_selected(static_cast<uint32_t>(kMaxRoundReports));
  record.set_model_sha256(std::string(64, 'f'));
  record.mutable_latency()->set_critical_worker(std::string(kMaxNameBytes, 'w'));
  record.mutable_latency()->set_total_ms(-1.5e300);
  record.mutable_workers()->Reserve(static_cast<int>(kMaxRoundReports));
  for (size_t i = 0; i < kMaxRoundReports; ++i) *record.add_workers() = WorstReport(i, over);
  return record;
}

}  // namespace tessera::wire::testing
