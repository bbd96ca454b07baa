// The `tessera` command line's subcommands, each a function over a JobService stub so that
// tests can run them against an in-process coordinator. Output goes to `out`; errors come
// back as a Status that names the job, file or field.
#pragma once

#include <iosfwd>
#include <memory>
#include <string>

#include "base/status.h"
#include "tessera/v1/job_service.grpc.pb.h"

namespace tessera::cli {

Status SubmitCommand(v1::JobService::StubInterface& stub, const std::string& spec_path, std::ostream& out);
Status JobsCommand(v1::JobService::StubInterface& stub, std::ostream& out);
Status StatusCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::ostream& out);
Status CancelCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::ostream& out);
// Streams the job's rounds as a table until the job ends; then prints the latency summary.
// Returns an error when the job ended FAILED or CANCELLED.
Status WatchCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::ostream& out);
Status WorkersCommand(v1::JobService::StubInterface& stub, std::ostream& out);

// Median and maximum of every latency phase over `rounds`, as a table.
std::string LatencySummary(const std::vector<v1::RoundRecord>& rounds);
std::string RoundRow(const v1::RoundRecord& round);
std::string RoundHeader();

}  // namespace tessera::cli
