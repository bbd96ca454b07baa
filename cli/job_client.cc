#include "cli/job_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>
#include <vector>

#include "base/escape.h"
#include "base/whole_file.h"
#include "cli/client_text.h"
#include "cli/job_spec.h"
#include "proto/grpc_status.h"
#include "proto/job_mapping.h"
#include "proto/job_rounds.h"
#include "proto/json.h"
#include "proto/list_reply.h"

namespace tessera::cli {

using wire::FromGrpc;

std::string Format(const char* format, ...) {
  char buffer[512] = "";
  va_list args;
  va_start(args, format);
  va_list again;
  va_copy(again, args);
  const int length = vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  std::string out;
  if (length < 0) {
    out.clear();  // an encoding error: nothing to show
  } else if (static_cast<size_t>(length) < sizeof(buffer)) {
    out.assign(buffer, static_cast<size_t>(length));
  } else {
    out.resize(static_cast<size_t>(length) + 1);
    vsnprintf(out.data(), out.size(), format, again);
    out.resize(static_cast<size_t>(length));
  }
  va_end(again);
  return out;
}

std::string Shown(std::string_view text, size_t max_chars) {
  if (text.size() <= max_chars && !HasHiddenCharacters(text)) return std::string(text);
  return EscapeUntrusted(text, max_chars);
}

namespace {

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(15));
}

// One unary call of the job service within the command line's deadline; its failure as a
// Status prefixed with `what`.
template <typename Request, typename Response>
Status Call(v1::JobService::StubInterface& stub,
            grpc::Status (v1::JobService::StubInterface::*rpc)(grpc::ClientContext*, const Request&, Response*),
            const Request& request, Response* response, const std::string& what) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return FromGrpc((stub.*rpc)(&ctx, request, response), what);
}

// Call() with a request that names one job: `verb` and the job's id prefix a failure.
template <typename Request, typename Response>
Status CallForJob(v1::JobService::StubInterface& stub,
                  grpc::Status (v1::JobService::StubInterface::*rpc)(grpc::ClientContext*, const Request&, Response*),
                  const std::string& job_id, Response* response, const std::string& verb) {
  Request request;
  request.set_job_id(job_id);
  return Call(stub, rpc, request, response, verb + " " + job_id);
}

std::string JobLine(const v1::Job& job) {
  std::string accuracy = job.rounds_committed() ? Format("%.2f%%", 100 * job.last_round().test_accuracy()) : "-";
  return Format("%-18s %-10s %5u/%-5u %9s  %s", Shown(job.id(), kShownNameChars).c_str(), StateName(job.state()).c_str(),
                job.rounds_committed(), job.spec().rounds(), accuracy.c_str(), EscapeUntrusted(job.spec().name(), 128).c_str());
}

struct Phase {
  const char* name;
  double (*get)(const v1::PhaseLatency&);
};

const Phase kPhases[PhaseLatencies::kPhaseCount] = {
    {"selection", [](const v1::PhaseLatency& l) { return l.selection_ms(); }},
    {"distribution", [](const v1::PhaseLatency& l) { return l.distribution_ms(); }},
    {"compute (median worker)", [](const v1::PhaseLatency& l) { return l.compute_ms_median(); }},
    {"compute (slowest worker)", [](const v1::PhaseLatency& l) { return l.compute_ms_max(); }},
    {"data loading (slowest)", [](const v1::PhaseLatency& l) { return l.data_load_ms_max(); }},
    {"upload", [](const v1::PhaseLatency& l) { return l.upload_ms(); }},
    {"straggler wait", [](const v1::PhaseLatency& l) { return l.straggler_wait_ms(); }},
    {"aggregation", [](const v1::PhaseLatency& l) { return l.aggregation_ms(); }},
    {"evaluation", [](const v1::PhaseLatency& l) { return l.evaluation_ms(); }},
    {"commit", [](const v1::PhaseLatency& l) { return l.commit_ms(); }},
    {"other (not in a phase)", [](const v1::PhaseLatency& l) { return l.other_ms(); }},
    {"round total", [](const v1::PhaseLatency& l) { return l.total_ms(); }},
};

}  // namespace

std::string StateName(v1::JobState state) { return wire::JobStateName(state); }

std::string DescribeFailure(const Status& status, const std::string& address, const std::string& source) {
  std::string message = status.message();
  if (status.code() == StatusCode::kUnavailable || status.code() == StatusCode::kDeadlineExceeded) {
    message += "\n  no coordinator answered at " + address + " (from " + source +
               "): is it running there? Give its address with --coordinator HOST:PORT or "
               "TESSERA_COORDINATOR=HOST:PORT";
  }
  return message;
}

double Kibibytes(uint64_t bytes) { return static_cast<double>(bytes) / 1024.0; }

std::string RoundHeader() {
  return Format("%5s %8s %7s %7s %8s %9s %9s %8s %8s %8s %8s %9s %9s", "round", "accuracy", "loss", "clients",
                "select", "distrib", "compute", "upload", "wait", "eval", "total", "up", "down") +
         "\n" + Format("%5s %8s %7s %7s %8s %9s %9s %8s %8s %8s %8s %9s %9s", "", "", "", "", "ms", "ms", "ms max",
                       "ms", "ms", "ms", "ms", "KiB", "KiB");
}

// The round's federated evaluation, when its workers made one: "  federated 81.23% (N on K)".
std::string FederatedColumn(const v1::RoundRecord& r) {
  uint64_t samples = 0;
  int workers = 0;
  for (const auto& w : r.workers()) {
    if (w.local_test_samples() == 0 || w.outcome() != "accepted") continue;
    samples += w.local_test_samples();
    ++workers;
  }
  if (samples == 0) return "";
  return Format("  federated %.2f%% (%llu samples on %d workers)", 100 * r.federated_accuracy(),
                static_cast<unsigned long long>(samples), workers);
}

std::string RoundRow(const v1::RoundRecord& r) {
  const auto& l = r.latency();
  return Format("%5u %7.2f%% %7.4f %3u/%-3u %8.1f %9.1f %9.1f %8.1f %8.1f %8.1f %8.1f %9.1f %9.1f", r.round(),
                100 * r.test_accuracy(), r.test_loss(), r.clients_reported(), r.clients_selected(), l.selection_ms(),
                l.distribution_ms(), l.compute_ms_max(), l.upload_ms(), l.straggler_wait_ms(), l.evaluation_ms(),
                l.total_ms(), Kibibytes(r.upload_bytes()), Kibibytes(r.download_bytes())) +
         FederatedColumn(r);
}

std::string AsyncStepHeader() {
  return Format("%5s %8s %7s %7s %7s %9s %9s %8s %8s %8s", "step", "accuracy", "loss", "folded", "refused",
                "staleness", "compute", "aggreg", "eval", "total") +
         "\n" + Format("%5s %8s %7s %7s %7s %9s %9s %8s %8s %8s", "", "", "", "/ended", "", "mean/max", "ms max",
                       "ms", "ms", "ms");
}

std::string AsyncStepRow(const v1::RoundRecord& r) {
  const auto& l = r.latency();
  const auto& a = r.async_step();
  const std::string staleness = Format("%.1f/%u", a.mean_staleness(), a.max_staleness());
  return Format("%5u %7.2f%% %7.4f %3u/%-3u %7u %9s %9.1f %8.1f %8.1f %8.1f", r.round(), 100 * r.test_accuracy(),
                r.test_loss(), r.clients_reported(), r.clients_selected(), a.updates_refused(), staleness.c_str(),
                l.compute_ms_max(), l.aggregation_ms(), l.evaluation_ms(), l.total_ms());
}

void PhaseLatencies::Add(const v1::PhaseLatency& latency) {
  std::array<double, kPhaseCount> round{};
  for (size_t i = 0; i < kPhaseCount; ++i) round[i] = kPhases[i].get(latency);
  rounds_.push_back(round);
}

std::string PhaseLatencies::Summary() const {
  std::string out = Format("%-26s %12s %12s\n", "phase", "median ms", "max ms");
  if (rounds_.empty()) return out;
  std::vector<double> phase(rounds_.size());
  for (size_t i = 0; i < kPhaseCount; ++i) {
    for (size_t r = 0; r < rounds_.size(); ++r) phase[r] = rounds_[r][i];
    std::sort(phase.begin(), phase.end());
    const size_t n = phase.size();
    const double median = n % 2 ? phase[n / 2] : 0.5 * (phase[n / 2 - 1] + phase[n / 2]);
    out += Format("%-26s %12.1f %12.1f\n", kPhases[i].name, median, phase.back());
  }
  return out;
}

std::string LatencySummary(const std::vector<v1::RoundRecord>& rounds) {
  PhaseLatencies latencies;
  for (const auto& r : rounds) latencies.Add(r.latency());
  return latencies.Summary();
}

Status SubmitCommand(v1::JobService::StubInterface& stub, const std::string& spec_path, std::ostream& out,
                     const PrintOptions& print) {
  ASSIGN_OR_RETURN(v1::JobSpec spec, ParseJobSpecFile(spec_path));
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::SubmitJobResponse response;
  RETURN_IF_ERROR(Call(stub, &v1::JobService::StubInterface::SubmitJob, request, &response,
                       "submit " + QuoteUntrusted(spec_path, 256)));
  out << (print.json ? wire::ToJson(response.job()) : Shown(response.job().id(), kShownNameChars)) << "\n";
  return Status::Ok();
}

namespace {

// How many entries the coordinator left out of a list reply ("" for none).
std::string MoreEntries(const grpc::ClientContext& ctx) {
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find(wire::kMoreEntriesTrailer);
  if (it == trailers.end()) return "";
  std::string count(it->second.data(), std::min<size_t>(it->second.size(), 20));
  for (char c : count) {
    if (c < '0' || c > '9') return "";
  }
  return count;
}

}  // namespace

Status JobsCommand(v1::JobService::StubInterface& stub, std::ostream& out, const PrintOptions& print) {
  grpc::ClientContext ctx;  // its trailers count the jobs left out
  SetDeadline(&ctx);
  v1::ListJobsResponse response;
  RETURN_IF_ERROR(FromGrpc(stub.ListJobs(&ctx, v1::ListJobsRequest(), &response), "list jobs"));
  if (print.json) {
    out << wire::ToJson(response) << "\n";
    return Status::Ok();
  }
  out << Format("%-18s %-10s %11s %9s  %s\n", "JOB", "STATE", "ROUNDS", "ACCURACY", "NAME");
  const std::string more = MoreEntries(ctx);
  if (!more.empty()) out << "(" << more << " older jobs not shown)\n";
  for (const auto& job : response.jobs()) out << JobLine(job) << "\n";
  return Status::Ok();
}

Status StatusCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::ostream& out,
                     const PrintOptions& print) {
  v1::GetJobResponse response;
  RETURN_IF_ERROR(FromGrpc(wire::GetJobWithRounds(stub, job_id, SetDeadline, &response), "job " + job_id));
  if (print.json) {
    out << wire::ToJson(response) << "\n";
    return Status::Ok();
  }
  const v1::Job& job = response.job();
  const bool async = job.spec().has_async();
  out << "job:       " << Shown(job.id(), kShownNameChars) << " (" << EscapeUntrusted(job.spec().name(), 128) << ")\n"
      << "state:     " << StateName(job.state())
      << (job.cancel_requested() && (job.state() == v1::JOB_PENDING || job.state() == v1::JOB_RUNNING)
              ? " (cancel requested: it ends at its next step)"
              : "")
      << (job.error().empty() ? "" : ": " + Shown(job.error(), kShownTextChars)) << "\n";
  if (async) {
    const v1::AsyncSpec& a = job.spec().async();
    out << "steps:     " << job.rounds_committed() << " of " << job.spec().rounds()
        << " committed (asynchronous, FedBuff: a step every " << a.buffer_size() << " updates, max_staleness "
        << a.max_staleness() << ", " << Shown(a.staleness_weighting(), kShownNameChars) << " staleness weighting)\n"
        << "model:     " << Shown(job.spec().model().name(), kShownNameChars) << ", " << a.concurrency() << " clients training at once\n";
  } else {
    out << "rounds:    " << job.rounds_committed() << " of " << job.spec().rounds() << " committed\n"
        << "model:     " << Shown(job.spec().model().name(), kShownNameChars) << ", " << job.spec().clients_per_round()
        << " clients per round (min " << job.spec().min_clients() << ")\n";
  }
  out << "updates:   " << UpdateEncodingName(wire::JobUpdateEncoding(job.spec()))
      << (wire::TopKFraction(job.spec()) > 0 ? Format(" (fraction %g, with error feedback)", wire::TopKFraction(job.spec()))
                                             : std::string())
      << "\n";
  if (wire::JobDownloadEncoding(job.spec()) != UpdateEncoding::kFloat32) {
    out << "downloads: " << UpdateEncodingName(wire::JobDownloadEncoding(job.spec()))
        << " (the model as sent to the workers; kept in float32)\n";
  }
  if (response.rounds_size() > 0) {
    out << "\n" << (async ? AsyncStepHeader() : RoundHeader()) << "\n";
    for (const auto& r : response.rounds()) out << (async ? AsyncStepRow(r) : RoundRow(r)) << "\n";
    out << "\n"
        << LatencySummary(std::vector<v1::RoundRecord>(response.rounds().begin(), response.rounds().end()));
  }
  return Status::Ok();
}

Status CancelCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::ostream& out,
                     const PrintOptions& print) {
  v1::CancelJobResponse response;
  RETURN_IF_ERROR(CallForJob(stub, &v1::JobService::StubInterface::CancelJob, job_id, &response, "cancel"));
  out << (print.json ? wire::ToJson(response.job()) : "cancelling " + job_id) << "\n";
  return Status::Ok();
}

Status DeleteCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::ostream& out,
                     const PrintOptions& print) {
  v1::DeleteJobResponse response;
  RETURN_IF_ERROR(CallForJob(stub, &v1::JobService::StubInterface::DeleteJob, job_id, &response, "delete"));
  if (print.json) {
    out << wire::ToJson(response.job()) << "\n";
  } else {
    out << "deleted " << job_id << " (it had ended " << wire::JobStateName(response.job().state()) << " after "
        << response.job().rounds_committed() << " committed rounds): its record, rounds and kept models are gone\n";
  }
  return Status::Ok();
}

namespace {

// The job with its committed rounds, and those of them to show: every one, or `round` alone.
Status FetchRounds(v1::JobService::StubInterface& stub, const std::string& job_id, std::optional<uint32_t> round,
                   v1::GetJobResponse* response, std::vector<const v1::RoundRecord*>* shown) {
  if (round) {
    // One page from the round asked for holds it (a page holds at least one round).
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    request.set_include_rounds(true);
    request.set_from_round(*round);
    RETURN_IF_ERROR(Call(stub, &v1::JobService::StubInterface::GetJob, request, response, "job " + job_id));
  } else {
    RETURN_IF_ERROR(FromGrpc(wire::GetJobWithRounds(stub, job_id, SetDeadline, response), "job " + job_id));
  }
  for (const auto& r : response->rounds()) {
    if (!round || r.round() == *round) shown->push_back(&r);
  }
  return Status::Ok();
}

// A string as a JSON string literal.
// JSON text is UTF-8: each byte that is not part of a valid UTF-8 character (a worker's outcome
// need not be UTF-8) becomes U+FFFD. Control characters (C0, DEL and C1, which a terminal
// reading `trace -o -` would act on) and the characters that reorder or hide text (U+202E
// would show a worker's name backwards; base/escape.h lists them) are escaped as \uXXXX; the
// rest is the coordinator's UTF-8 as it is.
std::string JsonString(const std::string& raw) {
  const std::string text = ValidUtf8(raw, 3 * raw.size());  // U+FFFD is 3 bytes
  std::string out = "\"";
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7F) {
      out += Format("\\u%04x", c);
    } else {
      out += ch;
    }
  }
  return EscapeHiddenInJson(out + "\"");  // C1 controls and hidden characters
}

}  // namespace

Status TraceCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::optional<uint32_t> round,
                    std::ostream& out) {
  v1::GetJobResponse response;
  std::vector<const v1::RoundRecord*> shown;
  RETURN_IF_ERROR(FetchRounds(stub, job_id, round, &response, &shown));
  if (shown.empty()) {
    return NotFoundError("job " + job_id + " has no committed round" +
                         (round ? " " + std::to_string(*round) : std::string()) + " to trace (" +
                         std::to_string(response.job().rounds_committed()) + " committed)");
  }
  std::vector<std::string> events;
  std::map<std::string, int> tracks;  // worker -> thread id; the coordinator is 0
  auto track = [&](const std::string& worker) {
    auto [it, added] = tracks.emplace(worker, static_cast<int>(tracks.size()) + 1);
    return it->second;
  };
  // A span: name, track, start and length in milliseconds on the trace's clock.
  auto span = [&](const std::string& name, int tid, double start_ms, double ms, const std::string& args) {
    if (!(ms > 0)) return;
    events.push_back(Format("{\"name\":%s,\"cat\":\"round\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                            "\"args\":{%s}}",
                            JsonString(name).c_str(), tid, start_ms * 1000, ms * 1000, args.c_str()));
  };
  // Rounds start where the coordinator's clock put them: the commit time less the round's
  // time before it. The trace's zero is the first shown round's start.
  auto round_start = [](const v1::RoundRecord& r) {
    return static_cast<double>(r.committed_unix_ms()) - (r.latency().total_ms() - r.latency().commit_ms());
  };
  const double zero = round_start(*shown.front());
  for (const auto* r : shown) {
    const auto& l = r->latency();
    const double t0 = round_start(*r) - zero;
    const std::string round_args = Format("\"round\":%u,\"attempt\":%u", r->round(), r->attempt());
    span("round " + std::to_string(r->round()), 0, t0, l.total_ms(),
         round_args + Format(",\"accuracy\":%.4f,\"critical_worker\":%s", r->test_accuracy(),
                             JsonString(l.critical_worker()).c_str()));
    span("selection", 0, t0, l.selection_ms(), round_args);
    const double tasks_out = t0 + l.selection_ms();
    double last_report = 0;
    for (const auto& w : r->workers()) last_report = std::max(last_report, w.reported_ms());
    span("waiting for stragglers", 0, tasks_out + last_report, l.after_last_report_ms(), round_args);
    double at = tasks_out + last_report + l.after_last_report_ms();
    for (const auto& [name, ms] : {std::pair<const char*, double>{"aggregation", l.aggregation_ms()},
                                   {"evaluation", l.evaluation_ms()},
                                   {"commit", l.commit_ms()}}) {
      span(name, 0, at, ms, round_args);
      at += ms;
    }
    for (const auto& w : r->workers()) {
      const int tid = track(w.worker_id());
      const std::string args = round_args + ",\"outcome\":" + JsonString(w.outcome()) +
                               Format(",\"samples\":%llu", static_cast<unsigned long long>(w.samples()));
      if (w.reported_ms() > 0) {
        // Laid back from where its update arrived: upload, compute, data loading, download,
        // none before the tasks went out (the worker's own clock runs a little apart).
        double end = tasks_out + w.reported_ms();
        for (const auto& [name, ms] : {std::pair<const char*, double>{"upload", w.upload_ms()},
                                       {"compute", w.compute_ms()},
                                       {"data loading", w.data_load_ms()},
                                       {"download", w.download_ms()}}) {
          const double start = std::max(tasks_out, end - ms);
          span(name, tid, start, end - start, args);
          end = start;
        }
      } else {
        double from = tasks_out;
        if (w.download_done_ms() > 0) {
          from = tasks_out + w.download_done_ms();
          const double start = std::max(tasks_out, from - w.download_ms());
          span("download", tid, start, from - start, args);
        }
        if (w.outcome().rfind("dropped", 0) == 0) {
          span("dropped: " + ValidUtf8(w.outcome(), 80), tid, from, t0 + l.total_ms() - from, args);
        }
      }
    }
  }
  out << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"job\":" << JsonString(job_id)
      << ",\"clock\":\"the coordinator's; workers' durations laid back from where it saw them\"},\"traceEvents\":[\n";
  out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":" << JsonString("job " + job_id) << "}},\n";
  out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"coordinator\"}}";
  for (const auto& [worker, tid] : tracks) {
    out << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" << tid << ",\"args\":{\"name\":"
        << JsonString("worker " + worker) << "}}";
  }
  for (const auto& e : events) out << ",\n" << e;
  out << "\n]}\n";
  return Status::Ok();
}

Status TraceToFile(v1::JobService::StubInterface& stub, const std::string& job_id, std::optional<uint32_t> round,
                   const std::string& path, std::ostream& note) {
  std::ostringstream trace;
  RETURN_IF_ERROR(TraceCommand(stub, job_id, round, trace));
  const std::string bytes = trace.str();
  RETURN_IF_ERROR(WriteFileWhole(path, bytes));
  note << "wrote " << bytes.size() << " bytes to " << QuoteUntrusted(path, 256)
       << " (open it in ui.perfetto.dev or chrome://tracing)\n";
  return Status::Ok();
}

Status RoundsCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::optional<uint32_t> round,
                     std::ostream& out, const PrintOptions& print) {
  v1::GetJobResponse response;
  std::vector<const v1::RoundRecord*> shown;
  RETURN_IF_ERROR(FetchRounds(stub, job_id, round, &response, &shown));
  if (round && shown.empty()) {
    return NotFoundError("job " + job_id + " has no committed round " + std::to_string(*round) + " (" +
                         std::to_string(response.job().rounds_committed()) + " committed)");
  }
  if (print.json) {
    for (const auto* r : shown) out << wire::ToJson(*r) << "\n";
    return Status::Ok();
  }
  if (shown.empty()) {
    out << "job " << job_id << " (" << StateName(response.job().state()) << ") has no committed round yet\n";
    return Status::Ok();
  }
  for (const auto* r : shown) {
    const auto& l = r->latency();
    // The critical path: the accepted report that arrived last (older records: the reporting
    // worker whose download, data loading, compute and upload took longest).
    int critical = -1;
    double slowest_ms = -1;
    for (int i = 0; i < r->workers_size(); ++i) {
      const auto& w = r->workers(i);
      if (w.outcome().rfind("accepted", 0) != 0) continue;  // "accepted: clipped, ..." too
      const double ms = w.download_ms() + w.data_load_ms() + w.compute_ms() + w.upload_ms();
      if (l.critical_worker().empty() ? ms > slowest_ms : w.worker_id() == l.critical_worker()) {
        slowest_ms = ms;
        critical = i;
      }
    }
    out << Format("round %u (attempt %u): %u/%u reported, %.2f%% accuracy, %.1f ms in all; %.1f KiB of updates "
                  "accepted, %.1f KiB of models sent\n",
                  r->round(), r->attempt(), r->clients_reported(), r->clients_selected(), 100 * r->test_accuracy(),
                  l.total_ms(), Kibibytes(r->upload_bytes()), Kibibytes(r->download_bytes()));
    out << Format("  %-22s %-18s %8s %10s %10s %10s %10s %10s %9s %9s\n", "WORKER", "OUTCOME", "SAMPLES", "DOWNLOAD",
                  "LOAD", "COMPUTE", "UPLOAD", "REPORTED", "UP KiB", "DOWN KiB");
    for (int i = 0; i < r->workers_size(); ++i) {
      const auto& w = r->workers(i);
      std::string outcome = Shown(w.outcome().substr(0, 40), 40);
      std::string note = i == critical ? "  <- critical path (last report)" : "";
      if (w.outcome().rfind("dropped: over-selected", 0) == 0) {
        outcome = "over-selected";  // the note says the rest
        note = Format("  <- cancelled at %.1fms: the round had its updates (not a failure)", w.dropped_ms());
      } else if (w.outcome().rfind("dropped", 0) == 0) {
        note = "  <- straggler, dropped";
      }
      std::string name = Shown(w.cohort().empty() ? w.worker_id() : w.cohort() + " (cohort)", kShownNameChars);
      const std::string reported = w.reported_ms() > 0 ? Format("%8.1fms", w.reported_ms()) : "-";
      out << Format("  %-22s %-18s %8llu %8.1fms %8.1fms %8.1fms %8.1fms %10s %9.1f %9.1f%s\n", name.c_str(),
                    outcome.c_str(), static_cast<unsigned long long>(w.samples()), w.download_ms(), w.data_load_ms(),
                    w.compute_ms(), w.upload_ms(), reported.c_str(), Kibibytes(w.upload_bytes()),
                    Kibibytes(w.download_bytes()), note.c_str());
    }
    if (critical >= 0) {
      const auto& w = r->workers(critical);
      out << Format("  critical path: selection %.1f + %s (download %.1f, data loading %.1f, compute %.1f, upload "
                    "%.1f) + waiting after the last report %.1f + aggregation %.1f + evaluation %.1f + commit %.1f "
                    "+ other %.1f = %.1f ms\n",
                    l.selection_ms(), Shown(w.worker_id(), kShownNameChars).c_str(), w.download_ms(), w.data_load_ms(), w.compute_ms(),
                    w.upload_ms(), l.after_last_report_ms(), l.aggregation_ms(), l.evaluation_ms(), l.commit_ms(),
                    l.other_ms(), l.total_ms());
    }
    out << "\n";
  }
  return Status::Ok();
}

Status ForgetWorkerCommand(v1::JobService::StubInterface& stub, const std::string& name, std::ostream& out,
                           const PrintOptions& print) {
  v1::ForgetWorkerRequest request;
  request.set_name(name);
  v1::ForgetWorkerResponse response;
  const std::string quoted = QuoteUntrusted(name, 128);
  RETURN_IF_ERROR(
      Call(stub, &v1::JobService::StubInterface::ForgetWorker, request, &response, "forget worker " + quoted));
  out << (print.json ? wire::ToJson(response) : "forgot worker " + quoted + "; its name may join again as a new worker") << "\n";
  return Status::Ok();
}

Status WorkersCommand(v1::JobService::StubInterface& stub, std::ostream& out, bool all, const PrintOptions& print) {
  grpc::ClientContext ctx;  // its trailers count the workers left out
  SetDeadline(&ctx);
  v1::ListWorkersResponse response;
  RETURN_IF_ERROR(FromGrpc(stub.ListWorkers(&ctx, v1::ListWorkersRequest(), &response), "list workers"));
  int hidden = 0;
  if (!all) {
    auto* workers = response.mutable_workers();
    const auto gone = std::remove_if(workers->begin(), workers->end(), [](const v1::WorkerStatus& w) { return !w.alive(); });
    hidden = static_cast<int>(workers->end() - gone);
    workers->erase(gone, workers->end());
  }
  if (print.json) {
    out << wire::ToJson(response) << "\n";
    return Status::Ok();
  }
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count();
  out << Format("%-20s %-6s %-12s %9s %7s %8s %9s  %s\n", "WORKER", "ALIVE", "STATE", "LAST SEEN", "ROUNDS",
                "REFUSED", "GFLOP/s", "DEVICE");
  for (const auto& w : response.workers()) {
    // The "(emulated)" label says what the worker's `emulated` field says, whatever its name
    // holds: an emulated device's name ends with the label (the device's own, or the
    // coordinator's after its cut), which is put back after this cut too; a device that is not
    // emulated does not get to show it.
    std::string_view name = w.device().name();
    constexpr std::string_view kLabel = " (emulated)";
    while (name.size() >= kLabel.size() && name.substr(name.size() - kLabel.size()) == kLabel) {
      name.remove_suffix(kLabel.size());
    }
    std::string device = Shown(name, kShownNameChars);
    if (w.device().emulated()) device += kLabel;
    const auto& p = w.device().properties();
    if (auto it = p.find("profile_peak_gflops"); it != p.end()) {
      device += Format(" [datasheet %.0f GFLOP/s]", std::atof(it->second.c_str()));
    }
    if (!w.cohort().empty()) device += " cohort " + Shown(w.cohort(), kShownNameChars);
    std::string seen = "-";
    if (w.last_heartbeat_unix_ms() > 0) {
      const int64_t ago_s = std::max<int64_t>(0, now_ms - w.last_heartbeat_unix_ms()) / 1000;
      seen = ago_s < 120 ? Format("%llds ago", static_cast<long long>(ago_s))
             : ago_s < 7200 ? Format("%lldm ago", static_cast<long long>(ago_s / 60))
                            : Format("%lldh ago", static_cast<long long>(ago_s / 3600));
    }
    out << Format("%-20s %-6s %-12s %9s %7u %8u %9.1f  %s\n", Shown(w.worker_id(), kShownNameChars).c_str(),
                  w.alive() ? "yes" : "no", Shown(w.state(), kShownNameChars).c_str(), seen.c_str(), w.rounds_completed(), w.updates_rejected(),
                  w.device().measured_gflops(), device.c_str());
  }
  if (hidden > 0) {
    out << hidden << (hidden == 1 ? " worker" : " workers")
        << " no longer sending heartbeats not shown (tessera workers --all shows them)\n";
  }
  if (const std::string more = MoreEntries(ctx); !more.empty()) out << "(" << more << " more workers not shown)\n";
  return Status::Ok();
}

}  // namespace tessera::cli
