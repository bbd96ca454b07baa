#include "server/monitoring/job_page.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "proto/json.h"

namespace tessera::server {
namespace {

// Keeps the first `keep` reports of `round`, the critical path's among them (it takes the last
// place kept when it came later).
void KeepFirstReports(v1::RoundRecord* round, size_t keep) {
  auto* workers = round->mutable_workers();
  const int kept = static_cast<int>(keep);
  if (workers->size() <= kept || kept == 0) {
    if (kept == 0) workers->Clear();
    return;
  }
  const std::string& critical = round->latency().critical_worker();
  if (!critical.empty()) {
    for (int i = kept; i < workers->size(); ++i) {
      if (workers->Get(i).worker_id() == critical || workers->Get(i).cohort() == critical) {
        workers->SwapElements(kept - 1, i);
        break;
      }
    }
  }
  workers->DeleteSubrange(kept, workers->size() - kept);
}

}  // namespace

std::string DashboardJobJson(v1::GetJobResponse page) {
  std::vector<std::pair<uint32_t, size_t>> left_out;  // (round, reports)
  size_t reports = 0;
  int kept = 0;
  for (; kept < page.rounds_size(); ++kept) {
    v1::RoundRecord* round = page.mutable_rounds(kept);
    const size_t count = static_cast<size_t>(round->workers_size());
    if (kept > 0 && (static_cast<size_t>(kept) == kDashboardRoundsPerPage || reports + count > kDashboardReportsPerPage)) {
      break;
    }
    if (count > kDashboardReportsPerPage) {  // the page's first round
      left_out.emplace_back(round->round(), count - kDashboardReportsPerPage);
      KeepFirstReports(round, kDashboardReportsPerPage);
    }
    reports += std::min(count, kDashboardReportsPerPage);
  }
  if (kept < page.rounds_size()) {
    page.set_next_round(page.rounds(kept).round());
    page.mutable_rounds()->DeleteSubrange(kept, page.rounds_size() - kept);
  }
  std::string json = wire::ToJson(page);  // "{...}" on one line
  std::string extra = "\"reports_left_out\":[";
  for (size_t i = 0; i < left_out.size(); ++i) {
    if (i > 0) extra += ",";
    extra += "{\"round\":" + std::to_string(left_out[i].first) + ",\"count\":" + std::to_string(left_out[i].second) + "}";
  }
  extra += "]";
  if (json.size() < 2 || json.back() != '}') return "{" + extra + "}";
  json.insert(json.size() - 1, json.size() > 2 ? "," + extra : extra);
  return json;
}

}  // namespace tessera::server
