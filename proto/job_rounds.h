// Reading a job with its committed rounds. GetJob bounds each reply (a thousand workers' round
// records pass a client's 4 MiB receive limit in about 50 rounds) and says where it stopped
// (GetJobResponse.next_round); GetJobWithRounds asks page after page and merges them.
#pragma once

#include <functional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "tessera/v1/job_service.grpc.pb.h"

namespace tessera::wire {

// At most this many pages per read (a coordinator that keeps paging is an error): rounds are
// numbered in 32 bits and a page holds at least one.
inline constexpr int kMaxRoundPages = 100000;

// The job `job_id` and its committed rounds from `from_round` on, in `out` (cleared first, and
// cleared again on an error). `prepare` sets up each page's call (credentials, a deadline per
// page). A page that does not move forward is an error (INTERNAL), as is a call that fails
// (its status, unchanged); the messages do not name the job, which the caller adds. The pages
// are read one after another, not as one snapshot: the job is the last page's.
grpc::Status GetJobWithRounds(v1::JobService::StubInterface& stub, const std::string& job_id,
                              const std::function<void(grpc::ClientContext*)>& prepare, v1::GetJobResponse* out,
                              uint32_t from_round = 0);

}  // namespace tessera::wire
