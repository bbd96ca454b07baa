// The dashboard's view of one job (/api/job): the job and a page of its committed rounds, as
// JSON, bounded whatever the rounds hold.
//
// A round's record is bounded in protobuf (proto/record_bounds.h: up to 20,000 reports, about
// 30.5 MiB), but its JSON is larger: every field is named, zeros included, and a string's
// control character is a 6-character escape. A page of the store's records
// (Coordinator::JobWithRounds, about kDashboardPageBytes) is cut further for the page: at most
// kDashboardRoundsPerPage rounds and kDashboardReportsPerPage reports in all; a round of more
// reports than that (only ever the page's first) keeps its first ones, the critical path's
// among them, and the reply says how many it left out. So the rounds' JSON is at most
// kDashboardRoundsJsonBytes, beside the job's own JSON (its spec, as submitted).
#pragma once

#include <cstddef>
#include <string>

#include "tessera/v1/job_service.pb.h"

namespace tessera::server {

// The records read from the store for one page, in protobuf bytes (the first round always).
inline constexpr size_t kDashboardPageBytes = size_t{1} << 20;
inline constexpr size_t kDashboardRoundsPerPage = 250;
inline constexpr size_t kDashboardReportsPerPage = 500;
// A round's JSON without its reports is under 4 KiB at its largest, a report's under 10 KiB
// (seven names of 128 bytes and an outcome of 512, each byte escaped as 6 characters, and the
// field names): 250 x 4 KiB + 500 x 10 KiB, with room to spare.
inline constexpr size_t kDashboardRoundsJsonBytes = size_t{8} << 20;

// `page` cut to the bounds above, as JSON: GetJobResponse's proto3 JSON (next_round set to the
// first round left for the next page) with one more field, "reports_left_out": for each round
// whose reports were cut, {"round": R, "count": N}, N being the reports not in the reply.
std::string DashboardJobJson(v1::GetJobResponse page);

}  // namespace tessera::server
