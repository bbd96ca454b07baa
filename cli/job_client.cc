#include "cli/job_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ostream>
#include <vector>

#include "cli/job_spec.h"
#include "proto/grpc_status.h"
#include "proto/list_reply.h"

namespace tessera::cli {
namespace {

using wire::FromGrpc;

std::string Format(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Format(const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  return buffer;
}

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(15));
}

std::string StateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  if (name.rfind("JOB_", 0) == 0) name = name.substr(4);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  return name;
}

std::string JobLine(const v1::Job& job) {
  std::string accuracy = job.rounds_committed() ? Format("%.2f%%", 100 * job.last_round().test_accuracy()) : "-";
  return Format("%-18s %-10s %5u/%-5u %9s  %s", job.id().c_str(), StateName(job.state()).c_str(),
                job.rounds_committed(), job.spec().rounds(), accuracy.c_str(), job.spec().name().c_str());
}

struct Phase {
  const char* name;
  double (*get)(const v1::PhaseLatency&);
};

const Phase kPhases[] = {
    {"selection", [](const v1::PhaseLatency& l) { return l.selection_ms(); }},
    {"distribution", [](const v1::PhaseLatency& l) { return l.distribution_ms(); }},
    {"compute (median worker)", [](const v1::PhaseLatency& l) { return l.compute_ms_median(); }},
    {"compute (slowest worker)", [](const v1::PhaseLatency& l) { return l.compute_ms_max(); }},
    {"upload", [](const v1::PhaseLatency& l) { return l.upload_ms(); }},
    {"straggler wait", [](const v1::PhaseLatency& l) { return l.straggler_wait_ms(); }},
    {"aggregation", [](const v1::PhaseLatency& l) { return l.aggregation_ms(); }},
    {"evaluation", [](const v1::PhaseLatency& l) { return l.evaluation_ms(); }},
    {"commit", [](const v1::PhaseLatency& l) { return l.commit_ms(); }},
    {"round total", [](const v1::PhaseLatency& l) { return l.total_ms(); }},
};

}  // namespace

std::string RoundHeader() {
  return Format("%5s %8s %7s %7s %8s %9s %9s %8s %8s %8s %8s", "round", "accuracy", "loss", "clients", "select",
                "distrib", "compute", "upload", "wait", "eval", "total") +
         "\n" + Format("%5s %8s %7s %7s %8s %9s %9s %8s %8s %8s %8s", "", "", "", "", "ms", "ms", "ms max", "ms",
                       "ms", "ms", "ms");
}

std::string RoundRow(const v1::RoundRecord& r) {
  const auto& l = r.latency();
  return Format("%5u %7.2f%% %7.4f %3u/%-3u %8.1f %9.1f %9.1f %8.1f %8.1f %8.1f %8.1f", r.round(),
                100 * r.test_accuracy(), r.test_loss(), r.clients_reported(), r.clients_selected(), l.selection_ms(),
                l.distribution_ms(), l.compute_ms_max(), l.upload_ms(), l.straggler_wait_ms(), l.evaluation_ms(),
                l.total_ms());
}

std::string LatencySummary(const std::vector<v1::RoundRecord>& rounds) {
  std::string out = Format("%-26s %12s %12s\n", "phase", "median ms", "max ms");
  for (const Phase& phase : kPhases) {
    std::vector<double> values;
    for (const auto& r : rounds) values.push_back(phase.get(r.latency()));
    if (values.empty()) continue;
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    const double median = n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
    out += Format("%-26s %12.1f %12.1f\n", phase.name, median, values.back());
  }
  return out;
}

Status SubmitCommand(v1::JobService::StubInterface& stub, const std::string& spec_path, std::ostream& out) {
  ASSIGN_OR_RETURN(v1::JobSpec spec, ParseJobSpecFile(spec_path));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::SubmitJobResponse response;
  RETURN_IF_ERROR(FromGrpc(stub.SubmitJob(&ctx, request, &response), "submit " + spec_path));
  out << response.job().id() << "\n";
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

Status JobsCommand(v1::JobService::StubInterface& stub, std::ostream& out) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ListJobsResponse response;
  RETURN_IF_ERROR(FromGrpc(stub.ListJobs(&ctx, v1::ListJobsRequest(), &response), "list jobs"));
  out << Format("%-18s %-10s %11s %9s  %s\n", "JOB", "STATE", "ROUNDS", "ACCURACY", "NAME");
  const std::string more = MoreEntries(ctx);
  if (!more.empty()) out << "(" << more << " older jobs not shown)\n";
  for (const auto& job : response.jobs()) out << JobLine(job) << "\n";
  return Status::Ok();
}

Status StatusCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::ostream& out) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  request.set_include_rounds(true);
  v1::GetJobResponse response;
  RETURN_IF_ERROR(FromGrpc(stub.GetJob(&ctx, request, &response), "job " + job_id));
  const v1::Job& job = response.job();
  out << "job:       " << job.id() << " (" << job.spec().name() << ")\n"
      << "state:     " << StateName(job.state()) << (job.error().empty() ? "" : ": " + job.error()) << "\n"
      << "rounds:    " << job.rounds_committed() << " of " << job.spec().rounds() << " committed\n"
      << "model:     " << job.spec().model().name() << ", " << job.spec().clients_per_round()
      << " clients per round (min " << job.spec().min_clients() << ")\n";
  if (response.rounds_size() > 0) {
    out << "\n" << RoundHeader() << "\n";
    for (const auto& r : response.rounds()) out << RoundRow(r) << "\n";
    out << "\n"
        << LatencySummary(std::vector<v1::RoundRecord>(response.rounds().begin(), response.rounds().end()));
  }
  return Status::Ok();
}

Status CancelCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::ostream& out) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  v1::CancelJobResponse response;
  RETURN_IF_ERROR(FromGrpc(stub.CancelJob(&ctx, request, &response), "cancel " + job_id));
  out << "cancelling " << job_id << "\n";
  return Status::Ok();
}

Status WatchCommand(v1::JobService::StubInterface& stub, const std::string& job_id, std::ostream& out) {
  grpc::ClientContext ctx;
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  auto reader = stub.WatchJob(&ctx, request);
  v1::JobEvent event;
  std::vector<v1::RoundRecord> rounds;
  v1::Job last_job;
  bool header_done = false;
  while (reader->Read(&event)) {
    last_job = event.job();
    if (event.has_round()) {
      if (!header_done) {
        out << RoundHeader() << "\n";
        header_done = true;
      }
      out << RoundRow(event.round()) << std::endl;
      rounds.push_back(event.round());
    } else if (!event.message().empty()) {
      out << "  " << event.message() << std::endl;
    }
  }
  RETURN_IF_ERROR(FromGrpc(reader->Finish(), "watch " + job_id));
  if (!rounds.empty()) {
    out << "\nfinal test accuracy: " << Format("%.2f%%", 100 * rounds.back().test_accuracy()) << " after "
        << rounds.back().round() << " rounds\n\nround latency by phase (" << rounds.size() << " rounds):\n"
        << LatencySummary(rounds);
  }
  if (last_job.state() == v1::JOB_FAILED || last_job.state() == v1::JOB_CANCELLED) {
    return FailedPreconditionError("job " + job_id + " " + StateName(last_job.state()) +
                                   (last_job.error().empty() ? "" : ": " + last_job.error()));
  }
  if (last_job.state() != v1::JOB_SUCCEEDED) {
    return UnavailableError("job " + job_id + ": the watch ended before the job did (coordinator shut down?)");
  }
  return Status::Ok();
}

Status WorkersCommand(v1::JobService::StubInterface& stub, std::ostream& out) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ListWorkersResponse response;
  RETURN_IF_ERROR(FromGrpc(stub.ListWorkers(&ctx, v1::ListWorkersRequest(), &response), "list workers"));
  out << Format("%-20s %-6s %-12s %7s %8s %9s  %s\n", "WORKER", "ALIVE", "STATE", "ROUNDS", "REFUSED", "GFLOP/s",
                "DEVICE");
  for (const auto& w : response.workers()) {
    std::string device = w.device().name();
    if (w.device().emulated() && device.find("emulated") == std::string::npos) device += " (emulated)";
    const auto& p = w.device().properties();
    if (auto it = p.find("profile_peak_gflops"); it != p.end()) {
      device += Format(" [datasheet %.0f GFLOP/s]", std::atof(it->second.c_str()));
    }
    if (!w.cohort().empty()) device += " cohort " + w.cohort();
    out << Format("%-20s %-6s %-12s %7u %8u %9.1f  %s\n", w.worker_id().c_str(), w.alive() ? "yes" : "no",
                  w.state().c_str(), w.rounds_completed(), w.updates_rejected(), w.device().measured_gflops(),
                  device.c_str());
  }
  if (const std::string more = MoreEntries(ctx); !more.empty()) out << "(" << more << " more workers not shown)\n";
  return Status::Ok();
}

}  // namespace tessera::cli
