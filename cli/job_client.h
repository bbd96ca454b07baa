// The `tessera` command line's subcommands, each a function over a JobService stub so that
// tests can run them against an in-process coordinator. Output goes to `out`; errors come
// back as a Status that names the job, file or field.
//
// With `json`, every command prints the coordinator's reply in the proto3 JSON mapping of
// proto/tessera/v1 (field names as in the .proto files): one object for a listing, one
// object per line for `watch`.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "tessera/v1/job_service.grpc.pb.h"

namespace tessera::cli {

struct PrintOptions {
  bool json = false;
};

Status SubmitCommand(v1::JobService::StubInterface& stub, const std::string& spec_path, std::ostream& out,
                     const PrintOptions& print = {});
Status JobsCommand(v1::JobService::StubInterface& stub, std::ostream& out, const PrintOptions& print = {});
Status StatusCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::ostream& out,
                     const PrintOptions& print = {});
Status CancelCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::ostream& out,
                     const PrintOptions& print = {});
// Deletes an ended job for good: its record, round records and kept checkpoints.
Status DeleteCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::ostream& out,
                     const PrintOptions& print = {});

// Every worker of each committed round (or of round `round` alone): its outcome, samples,
// download, compute and upload times, its update's and model's bytes, the slowest reporting worker marked as the round's
// critical path.
Status RoundsCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::optional<uint32_t> round,
                     std::ostream& out, const PrintOptions& print = {});

// The job's committed rounds (or round `round` alone) as a Chrome / Perfetto trace (JSON, the
// Trace Event Format): a track for the coordinator's phases and one per worker with its
// download, data loading, compute and upload, on the coordinator's clock.
Status TraceCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::optional<uint32_t> round,
                    std::ostream& out);

// TraceCommand's trace written to `path` whole or not at all (base/whole_file.h): into a
// temporary beside it, then renamed over it, so that a failed write leaves what was at `path`
// as it was and a link at `path` is replaced, never followed. Says on `note` how many bytes it
// wrote where.
Status TraceToFile(v1::JobService::StubInterface& stub, const std::string& job_id, std::optional<uint32_t> round,
                   const std::string& path, std::ostream& note);

struct WatchOptions {
  PrintOptions print;
  // While the coordinator is unreachable, try again for this long (it may be restarting:
  // a restarted coordinator resumes the job) before giving up. It is back once a stream shows
  // a new round or a new note, or sends events and stays open for steady_for: a coordinator
  // that sends events (a replay of what was shown) and closes each stream at once does not
  // start the time again.
  std::chrono::milliseconds reconnect_for{std::chrono::minutes(5)};
  std::chrono::milliseconds steady_for{std::chrono::minutes(1)};
  // Progress while a round waits ("7/10 reported, waiting on ...") rewrites one line of a
  // terminal; otherwise each is a line of its own.
  bool live = false;
};
// Streams the job's rounds as a table until the job ends; then prints the latency summary.
// Reconnects when the coordinator goes away, printing each round once; a first connection
// that fails is returned at once. Returns an error
// when the job ended failed or cancelled.
Status WatchCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::ostream& out,
                    const WatchOptions& options = {});

// The workers alive now; with `all`, also those that stopped sending heartbeats.
Status WorkersCommand(v1::JobService::StubInterface& stub, std::ostream& out, bool all = false,
                      const PrintOptions& print = {});

// Forgets a worker that is gone for good (the coordinator refuses one that is alive): it no
// longer counts toward --max-workers, and its name is unbound from its join token.
Status ForgetWorkerCommand(v1::JobService::StubInterface& stub, const std::string& name, std::ostream& out,
                           const PrintOptions& print = {});

// Median and maximum of every latency phase over `rounds`, as a table.
std::string LatencySummary(const std::vector<v1::RoundRecord>& rounds);
// What LatencySummary needs of each round, kept round by round: twelve numbers a round,
// whatever else the round's record holds (its workers' reports and their strings).
class PhaseLatencies {
 public:
  static constexpr size_t kPhaseCount = 12;
  void Add(const v1::PhaseLatency& latency);
  size_t rounds() const { return rounds_.size(); }
  // LatencySummary of the rounds added.
  std::string Summary() const;

 private:
  std::vector<std::array<double, kPhaseCount>> rounds_;
};
std::string RoundRow(const v1::RoundRecord& round);
std::string RoundHeader();
// An asynchronous job's server steps (RoundRecord.async_step set): updates folded of the
// tasks that ended, refused ones, staleness mean and max, and the step's latency.
std::string AsyncStepRow(const v1::RoundRecord& step);
std::string AsyncStepHeader();
// "succeeded", "failed", ...: a job state as every message shows it.
std::string StateName(v1::JobState state);

// `status`'s message with a hint when no coordinator answered at `address` (`source` says
// where the address came from: "--coordinator", "$TESSERA_COORDINATOR" or "the default").
std::string DescribeFailure(const Status& status, const std::string& address, const std::string& source);

}  // namespace tessera::cli
