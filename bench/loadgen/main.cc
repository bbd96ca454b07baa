// tessera-loadgen: many simulated workers in one process against a real coordinator.
#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "base/flags.h"
#include "base/open_files.h"
#include "bench/loadgen/client_fleet.h"
#include "bench/loadgen/job_report.h"
#include "bench/loadgen/process_stats.h"
#include "proto/job_rounds.h"
#include "tessera/v1/job_service.grpc.pb.h"

namespace {

using namespace tessera;
using namespace tessera::loadgen;
using Clock = std::chrono::steady_clock;

const char kUsage[] = R"(tessera-loadgen: many simulated workers in one process against a real tessera-coordinator.

Each simulated client does on the wire what tessera-worker does: it joins with the join token,
heartbeats at the interval the coordinator returns, holds its task channel open, and for each
task takes the model inside the task (a small one) or downloads it (checked against its
manifest either way) and uploads an update of the model's
exact layout (all zeros, or small random values), without training. CancelTask and verdicts
are handled as the worker handles them. Each client has its own gRPC channel (TCP connection)
as a real worker has, or they share --channels of them; all of them share gRPC's callback
threads: a thousand clients need neither a thousand threads nor a thousand processes.

It submits a job whose rounds take every client (clients_per_round = min_clients = parties),
waits for it to end, and prints every round's phases from the coordinator's round records,
their medians after the warm-up, what the clients saw, and its own CPU use. With --idle-s it
submits nothing: the clients only join and heartbeat for that long. With --clients 0 it only
submits the job and reports on it (real workers do the rounds).

Exit status: 0 when every round committed on its first attempt with every client accepted
and no client was refused, dropped or failed (--idle-s: every client joined and every
heartbeat was answered); 1 otherwise; 2 for a usage error.

Usage: tessera-loadgen --coordinator HOST:PORT --join-token-file FILE [flags]

Examples:
  tessera-loadgen --coordinator 127.0.0.1:7070 --join-token-file var/join-token --clients 100
  tessera-loadgen --coordinator 127.0.0.1:7070 --join-token-file var/join-token --clients 50 \
      --model mlp --hidden 3297 --update random --rounds 7
  tessera-loadgen --coordinator 127.0.0.1:7070 --join-token-file var/join-token --clients 1000 --idle-s 20

Flags:
)";

struct Settings {
  std::string coordinator = "127.0.0.1:7070";
  std::string join_token;
  std::string join_token_file;
  std::string admin_token;  // the job service's operator credential (a plaintext coordinator)
  std::string admin_token_file;
  int64_t clients = 10;
  int64_t channels = 0;
  int64_t join_window = 64;
  std::string name_prefix = "loadgen";
  std::string update = "zero";
  int64_t random_variants = 4;
  int64_t chunk_kib = wire::kDefaultUploadChunkBytes / 1024;
  int64_t stream_window_kib = 0;
  bool verify_downloads = false;
  bool always_download = false;
  bool always_upload_call = false;
  bool trained_weights = false;
  std::string download = "float32";
  int64_t compute_ms = 0;
  int64_t samples = 1;
  int64_t seed = 1;
  std::string model = "simplecnn";
  std::string hidden;
  int64_t rounds = 7;
  int64_t job_clients = -1;
  std::string partition = "iid";
  int64_t max_train_samples = 0;
  int64_t max_test_samples = 100;
  int64_t local_epochs = 1;
  int64_t batch_size = 1;
  double round_deadline_s = 120;
  std::string job;
  int64_t warmup = 2;
  double idle_s = 0;
  double join_timeout_s = 120;
  double timeout_s = 600;
  int64_t coordinator_pid = 0;
};

Status CheckRange(const std::string& flag, int64_t value, int64_t low, int64_t high) {
  if (value < low || value > high) {
    return InvalidArgumentError("--" + flag + ": expected " + std::to_string(low) + " to " + std::to_string(high) +
                                ", got " + std::to_string(value));
  }
  return Status::Ok();
}

Result<std::vector<uint32_t>> ParseWidths(const std::string& text) {
  std::vector<uint32_t> widths;
  if (text.empty()) return widths;
  ASSIGN_OR_RETURN(const std::vector<int64_t> parsed, ParseIntListFlag("hidden", text, IntRange{1, 1000000}));
  for (const int64_t width : parsed) widths.push_back(static_cast<uint32_t>(width));
  return widths;
}

Status Validate(Settings& s, std::vector<uint32_t>* hidden) {
  if (s.coordinator.empty() || s.coordinator.find(':') == std::string::npos) {
    return InvalidArgumentError("--coordinator: expected HOST:PORT, got '" + s.coordinator + "'");
  }
  if (!s.join_token_file.empty()) {
    if (!s.join_token.empty()) return InvalidArgumentError("--join-token and --join-token-file: give one, not both");
    ASSIGN_OR_RETURN(s.join_token, ReadSecretFile("join-token-file", s.join_token_file));
  }
  if (!s.admin_token_file.empty()) {
    ASSIGN_OR_RETURN(s.admin_token, ReadSecretFile("admin-token-file", s.admin_token_file));
  }
  if (s.clients > 0 && s.join_token.empty()) {
    return InvalidArgumentError("a join token is required for simulated clients (--join-token-file or --join-token)");
  }
  if (s.name_prefix.empty() || s.name_prefix.size() > 100) {
    return InvalidArgumentError("--name-prefix: expected 1 to 100 characters, got " + std::to_string(s.name_prefix.size()));
  }
  if (s.update != "zero" && s.update != "random") {
    return InvalidArgumentError("--update: expected zero or random, got '" + s.update + "'");
  }
  if (s.download != "float32" && s.download != "float16" && s.download != "bfloat16" && s.download != "int8") {
    return InvalidArgumentError("--download: expected float32, float16, bfloat16 or int8, got '" + s.download + "'");
  }
  if (s.model != "simplecnn" && s.model != "mlp") {
    return InvalidArgumentError("--model: expected simplecnn or mlp, got '" + s.model + "'");
  }
  ASSIGN_OR_RETURN(*hidden, ParseWidths(s.hidden));
  if (!hidden->empty() && s.model != "mlp") return InvalidArgumentError("--hidden: only for --model mlp");
  if (s.job_clients < 0) s.job_clients = s.clients;
  RETURN_IF_ERROR(CheckRange("job-clients", s.job_clients, 1, 100000));
  if (s.partition != "iid" && s.partition != "local-files") {
    return InvalidArgumentError("--partition: expected iid or local-files, got '" + s.partition + "'");
  }
  if (s.partition == "iid" && s.max_train_samples > 0 && s.max_train_samples < s.job_clients) {
    return InvalidArgumentError("--max-train-samples: expected at least --job-clients (" +
                                std::to_string(s.job_clients) + "), got " + std::to_string(s.max_train_samples));
  }
  if (s.partition == "iid" && s.job_clients > 60000) {
    return InvalidArgumentError("--job-clients: an iid partition of Fashion-MNIST has at most 60000 parties");
  }
  if (s.idle_s == 0 && s.job.empty() && s.warmup >= s.rounds) {
    return InvalidArgumentError("--warmup " + std::to_string(s.warmup) + " leaves none of the " +
                                std::to_string(s.rounds) + " rounds (--rounds) to measure: expected fewer");
  }
  if (s.idle_s > 0 && s.clients == 0) return InvalidArgumentError("--idle-s: needs --clients of at least 1");
  if (s.idle_s > 0 && !s.job.empty()) return InvalidArgumentError("--idle-s and --job: an idle run follows no job");
  if (s.coordinator_pid > 0 && !ProcessCpuTime(static_cast<pid_t>(s.coordinator_pid)).ok()) {
    return InvalidArgumentError("--coordinator-pid: no process " + std::to_string(s.coordinator_pid) + " here");
  }
  return Status::Ok();
}

// CPU use of this process and, when given, of the coordinator, over a window.
class CpuWindow {
 public:
  explicit CpuWindow(pid_t coordinator) : coordinator_(coordinator) { Restart(); }
  void Restart() {
    start_ = Clock::now();
    self_ = SelfCpuTime();
    if (coordinator_ > 0) {
      auto t = ProcessCpuTime(coordinator_);
      coordinator_start_ = t.ok() ? std::optional<CpuTime>(*t) : std::nullopt;
    }
  }
  double wall_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  // "cpu_user_s=.. cpu_sys_s=.. wall_s=.. cpu_pct=.." (percent of one core).
  std::string SelfLine() const {
    const CpuTime now = SelfCpuTime();
    const double wall = wall_s();
    char line[200];
    std::snprintf(line, sizeof(line), "cpu_user_s=%.2f cpu_sys_s=%.2f wall_s=%.2f cpu_pct=%.1f",
                  now.user_s - self_.user_s, now.system_s - self_.system_s, wall,
                  wall > 0 ? 100.0 * (now.total() - self_.total()) / wall : 0.0);
    return line;
  }
  // Percent of one core the coordinator used in the window, or a negative number.
  double CoordinatorPercent() const {
    if (coordinator_ <= 0 || !coordinator_start_) return -1;
    auto now = ProcessCpuTime(coordinator_);
    const double wall = wall_s();
    if (!now.ok() || wall <= 0) return -1;
    return 100.0 * (now->total() - coordinator_start_->total()) / wall;
  }

 private:
  pid_t coordinator_;
  Clock::time_point start_;
  CpuTime self_;
  std::optional<CpuTime> coordinator_start_;
};

void PrintFleet(const ClientFleet& fleet) {
  std::cout << "clients:";
  for (size_t i = 0; i < static_cast<size_t>(Counter::kNumCounters); ++i) {
    std::cout << " " << CounterName(static_cast<Counter>(i)) << "=" << fleet.Get(static_cast<Counter>(i));
  }
  std::cout << "\n";
  for (size_t i = 0; i < static_cast<size_t>(Latency::kNumLatencies); ++i) {
    const LatencySummary s = fleet.Summarize(static_cast<Latency>(i));
    char line[200];
    std::snprintf(line, sizeof(line), "client %s: count=%zu median_ms=%.1f p99_ms=%.1f max_ms=%.1f\n",
                  LatencyName(static_cast<Latency>(i)), s.count, s.median_ms, s.p99_ms, s.max_ms);
    std::cout << line;
  }
  for (const std::string& error : fleet.errors()) std::cout << "client error: " << error << "\n";
}

// No refusal, drop or failure on the clients' side.
std::string FleetProblem(const ClientFleet& fleet) {
  for (Counter c : {Counter::kJoinRefusals, Counter::kHeartbeatFailures, Counter::kChannelDrops,
                    Counter::kVerdictsRefused, Counter::kDownloadFailures, Counter::kUploadsRefused,
                    Counter::kUploadFailures, Counter::kUploadsSkipped, Counter::kFailuresReported}) {
    if (fleet.Get(c) > 0) return std::string(CounterName(c)) + "=" + std::to_string(fleet.Get(c));
  }
  return "";
}

int Run(Settings& s, const std::vector<uint32_t>& hidden) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.timeout_s));
  const pid_t coordinator_pid = static_cast<pid_t>(s.coordinator_pid);
  CpuWindow whole_run(coordinator_pid);

  std::unique_ptr<ClientFleet> fleet;
  if (s.clients > 0) {
    FleetOptions options;
    options.coordinator = s.coordinator;
    options.join_token = s.join_token;
    options.name_prefix = s.name_prefix;
    options.clients = static_cast<uint32_t>(s.clients);
    options.channels = static_cast<uint32_t>(s.channels == 0 ? s.clients : std::min(s.channels, s.clients));
    options.join_window = static_cast<uint32_t>(s.join_window);
    options.update = s.update == "random" ? UpdateKind::kRandom : UpdateKind::kZero;
    options.chunk_bytes = static_cast<uint32_t>(s.chunk_kib * 1024);
    options.stream_window_bytes = static_cast<uint32_t>(s.stream_window_kib * 1024);
    options.random_variants = static_cast<uint32_t>(s.random_variants);
    options.seed = static_cast<uint64_t>(s.seed);
    options.verify_downloads = s.verify_downloads;
    options.always_download = s.always_download;
    options.always_upload_call = s.always_upload_call;
    options.trained_weights = s.trained_weights;
    options.compute_ms = static_cast<uint32_t>(s.compute_ms);
    options.samples = static_cast<uint64_t>(s.samples);
    fleet = std::make_unique<ClientFleet>(options);
    const auto join_start = Clock::now();
    fleet->Start();
    const auto join_limit = std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                                  std::chrono::duration<double>(s.join_timeout_s)));
    const bool ready = fleet->WaitReady(std::chrono::duration_cast<std::chrono::milliseconds>(join_limit - Clock::now()));
    const double join_s = std::chrono::duration<double>(Clock::now() - join_start).count();
    std::printf("ready: %zu of %lld clients joined with their task channel open in %.2f s over %lld channel(s); "
                "loadgen threads=%d\n",
                fleet->ready(), static_cast<long long>(s.clients), join_s,
                static_cast<long long>(s.channels == 0 ? s.clients : std::min(s.channels, s.clients)),
                SelfThreadCount());
    std::fflush(stdout);
    if (!ready) {
      if (fleet->Get(Counter::kJoinRefusals) > 0) {
        std::printf("FAILED: the coordinator refused %llu join(s)\n",
                    static_cast<unsigned long long>(fleet->Get(Counter::kJoinRefusals)));
      } else {
        std::printf("FAILED: not every client joined within %.0f s\n", s.join_timeout_s);
      }
      fleet->Stop(std::chrono::seconds(10));
      PrintFleet(*fleet);
      return 1;
    }
  }

  if (s.idle_s > 0 && fleet) {
    const uint64_t beats_before = fleet->Get(Counter::kHeartbeats);
    fleet->ResetLatencies();
    CpuWindow idle(coordinator_pid);
    const auto until = std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                             std::chrono::duration<double>(s.idle_s)));
    std::this_thread::sleep_until(until);
    const double coordinator_pct = idle.CoordinatorPercent();
    const uint64_t beats = fleet->Get(Counter::kHeartbeats) - beats_before;
    const std::string self = idle.SelfLine();
    const int threads = SelfThreadCount();
    const bool stopped = fleet->Stop(std::chrono::seconds(20));
    std::printf("idle: clients=%lld heartbeats=%llu heartbeats_per_s=%.1f coordinator_cpu_pct=%.1f\n",
                static_cast<long long>(s.clients), static_cast<unsigned long long>(beats), beats / idle.wall_s(),
                coordinator_pct);
    std::printf("loadgen (idle window): %s threads=%d\n", self.c_str(), threads);
    PrintFleet(*fleet);
    const std::string problem = FleetProblem(*fleet);
    if (!stopped) std::printf("FAILED: calls still open 20 s after the clients were stopped\n");
    if (!problem.empty()) std::printf("FAILED: %s\n", problem.c_str());
    return stopped && problem.empty() ? 0 : 1;
  }

  auto channel = grpc::CreateChannel(s.coordinator, grpc::InsecureChannelCredentials());
  auto jobs = v1::JobService::NewStub(channel);
  std::string job_id = s.job;
  uint32_t expected_clients = static_cast<uint32_t>(s.job_clients);
  CpuWindow job_window(coordinator_pid);
  if (job_id.empty()) {
    JobSettings js;
    js.name = "loadgen-" + s.model + "-" + std::to_string(s.job_clients);
    js.model = s.model;
    js.hidden = hidden;
    js.rounds = static_cast<uint32_t>(s.rounds);
    js.clients = static_cast<uint32_t>(s.job_clients);
    js.partition = s.partition;
    js.max_train_samples = static_cast<uint32_t>(s.max_train_samples);
    js.max_test_samples = static_cast<uint32_t>(s.max_test_samples);
    js.local_epochs = static_cast<uint32_t>(s.local_epochs);
    js.batch_size = static_cast<uint32_t>(s.batch_size);
    js.round_deadline_ms = static_cast<uint32_t>(s.round_deadline_s * 1000);
    js.seed = static_cast<uint64_t>(s.seed);
    js.download = s.download == "float16"    ? v1::ENCODING_FLOAT16
                  : s.download == "bfloat16" ? v1::ENCODING_BFLOAT16
                  : s.download == "int8"     ? v1::ENCODING_INT8
                                             : v1::ENCODING_FLOAT32;
    v1::SubmitJobRequest request;
    *request.mutable_spec() = MakeJobSpec(js);
    auto parameters = ModelParameters(request.spec());
    grpc::ClientContext ctx;
    if (!s.admin_token.empty()) ctx.AddMetadata("authorization", "Bearer " + s.admin_token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::SubmitJobResponse response;
    job_window.Restart();
    grpc::Status submitted = jobs->SubmitJob(&ctx, request, &response);
    if (!submitted.ok()) {
      std::printf("FAILED: SubmitJob: %s\n", submitted.error_message().c_str());
      return 1;
    }
    job_id = response.job().id();
    std::printf("job %s submitted: model %s%s%s, %lld parameters (%lld bytes), %lld rounds of %lld clients, "
                "update %s, %lld test samples\n",
                job_id.c_str(), s.model.c_str(), s.hidden.empty() ? "" : " hidden ", s.hidden.c_str(),
                static_cast<long long>(parameters.ok() ? *parameters : -1),
                static_cast<long long>(parameters.ok() ? *parameters * 4 : -1), static_cast<long long>(s.rounds),
                static_cast<long long>(s.job_clients), s.update.c_str(), static_cast<long long>(s.max_test_samples));
    std::fflush(stdout);
  }

  // Follow the job until it ends, the overall timeout passes, or the clients fail for good.
  v1::GetJobResponse view;
  bool ended = false;
  while (Clock::now() < deadline) {
    grpc::ClientContext ctx;
    if (!s.admin_token.empty()) ctx.AddMetadata("authorization", "Bearer " + s.admin_token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    view.Clear();
    grpc::Status got = jobs->GetJob(&ctx, request, &view);
    if (got.ok() && view.job().state() != v1::JOB_PENDING && view.job().state() != v1::JOB_RUNNING) {
      ended = true;
      break;
    }
    if (!got.ok() && got.error_code() != grpc::StatusCode::UNAVAILABLE) {
      std::printf("FAILED: GetJob %s: %s\n", job_id.c_str(), got.error_message().c_str());
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string job_cpu = job_window.SelfLine();
  const double coordinator_pct = job_window.CoordinatorPercent();
  const int threads = SelfThreadCount();
  if (!ended) {
    std::printf("FAILED: job %s did not end within --timeout-s %.0f; cancelling it\n", job_id.c_str(), s.timeout_s);
    grpc::ClientContext ctx;
    if (!s.admin_token.empty()) ctx.AddMetadata("authorization", "Bearer " + s.admin_token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::CancelJobRequest cancel;
    cancel.set_job_id(job_id);
    v1::CancelJobResponse cancelled;
    jobs->CancelJob(&ctx, cancel, &cancelled);
  }
  {
    const auto prepare = [&](grpc::ClientContext* ctx) {
      if (!s.admin_token.empty()) ctx->AddMetadata("authorization", "Bearer " + s.admin_token);
      ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    };
    if (grpc::Status got = wire::GetJobWithRounds(*jobs, job_id, prepare, &view); !got.ok()) {
      std::printf("FAILED: GetJob %s with its rounds: %s\n", job_id.c_str(), got.error_message().c_str());
    }
  }
  bool stopped = true;
  if (fleet) stopped = fleet->Stop(std::chrono::seconds(20));

  PrintRounds(std::cout, view);
  const JobSummary summary = SummarizeJob(view, static_cast<uint32_t>(s.warmup), expected_clients);
  const RoundMedians& m = summary.medians;
  std::printf("summary: job=%s state=%s rounds=%zu measured=%zu clients=%u round_ms=%.1f interval_ms=%.1f "
              "selection_ms=%.1f distribution_ms=%.1f compute_ms=%.1f upload_ms=%.1f straggler_ms=%.1f "
              "aggregation_ms=%.1f evaluation_ms=%.1f commit_ms=%.1f all_accepted=%s\n",
              job_id.c_str(), v1::JobState_Name(view.job().state()).c_str(), summary.rounds_committed,
              summary.rounds_measured, expected_clients, m.total, m.interval, m.selection, m.distribution, m.compute,
              m.upload, m.straggler, m.aggregation, m.evaluation, m.commit, summary.all_accepted ? "yes" : "no");
  std::printf("loadgen (job window): %s threads=%d\n", job_cpu.c_str(), threads);
  if (coordinator_pid > 0) {
    auto peak = ProcessPeakRssBytes(coordinator_pid);
    std::printf("coordinator: pid=%d cpu_pct=%.1f (job window) vmhwm_mib=%.1f\n", coordinator_pid, coordinator_pct,
                peak.ok() ? static_cast<double>(*peak) / (1 << 20) : -1.0);
  }
  std::string problem = summary.problem;
  if (fleet) {
    PrintFleet(*fleet);
    if (problem.empty()) problem = FleetProblem(*fleet);
    if (problem.empty() && !stopped) problem = "calls still open 20 s after the clients were stopped";
  }
  if (!problem.empty()) std::printf("FAILED: %s\n", problem.c_str());
  return problem.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef __GLIBC__
  // A thousand clients' tasks and updates (178 KB each for SimpleCNN) are freed and allocated
  // again every round: kept in the heap instead of trimmed back to the kernel and faulted in
  // again (about 35 brk calls and 1,200 page faults a round at 1,000 clients before), CPU this
  // process would take from the coordinator it measures on a shared machine.
  mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 256 * 1024 * 1024);
#endif
  Settings s;
  bool help = false;
  FlagSet flags;
  flags.String("coordinator", &s.coordinator, "the coordinator's address");
  flags.String("join-token-file", &s.join_token_file, "read the join token from this file");
  flags.String("admin-token-file", &s.admin_token_file,
               "read the operator's admin token (for submitting and reading the job) from this file");
  flags.String("join-token", &s.join_token, "the join token itself");
  flags.Int("clients", &s.clients, "simulated clients (0: only submit the job and report on it)", IntRange{0, 100000});
  flags.Int("channels", &s.channels, "gRPC channels (TCP connections) the clients share, round-robin; 0: one per client, as real workers",
            IntRange{0, 100000});
  flags.Int("join-window", &s.join_window, "first joins in flight at once", IntRange{1, 100000});
  flags.String("name-prefix", &s.name_prefix, "clients are named PREFIX-0, PREFIX-1, ...");
  flags.String("update", &s.update, "the update each client uploads: zero (unchanged model) or random (small values)");
  flags.Int("random-variants", &s.random_variants, "different random updates, shared among the clients",
            IntRange{1, 64});
  flags.Int("chunk-kib", &s.chunk_kib, "upload chunk size in KiB, as tessera-worker --chunk-kib", IntRange{1, 1024});
  flags.Int("stream-window-kib", &s.stream_window_kib,
            "a fixed HTTP/2 receive window per stream in KiB, without gRPC's bandwidth-delay probing, as "
            "tessera-coordinator --stream-window-kib does on its side; 0: gRPC's probing, as tessera-worker",
            IntRange{0, 65536});
  flags.Bool("verify-downloads", &s.verify_downloads, "check every downloaded tensor's checksum as the worker does (XXH3-128 where the manifest gives it, else SHA-256)");
  flags.Bool("always-download", &s.always_download,
             "download every model, as workers did before small models travelled inside their tasks");
  flags.Bool("always-upload-call", &s.always_upload_call,
             "hold a task channel and send every update by an upload call, never inside a task session "
             "(as workers did before sessions)");
  flags.Bool("trained-weights", &s.trained_weights,
             "send each update as the trained model where the task offers it, as tessera-worker does (the "
             "coordinator subtracts its model on arrival); the bytes stay the --update values");
  flags.String("download", &s.download,
               "how the submitted job's model travels to the clients ([compression] download): float32, "
               "float16, bfloat16 or int8");
  flags.Int("compute-ms", &s.compute_ms, "simulated local compute between download and upload", IntRange{0, 3600000});
  flags.Int("samples", &s.samples, "the sample count each update reports", IntRange{1, int64_t{1} << 40});
  flags.Int("seed", &s.seed, "seeds the job and the random updates", IntRange{0, INT64_MAX});
  flags.String("model", &s.model, "the job's model: simplecnn (44,426 parameters) or mlp");
  flags.String("hidden", &s.hidden, "mlp hidden widths, comma-separated (3297: 2,621,125 parameters, 10 MiB)");
  flags.Int("rounds", &s.rounds, "the job's rounds", IntRange{1, 100000});
  flags.Int("job-clients", &s.job_clients, "clients per round, min clients and parties; -1: as many as --clients");
  flags.String("partition", &s.partition, "iid, or local-files (real workers with their own --data-dir)");
  flags.Int("max-train-samples", &s.max_train_samples, "training images the job uses (0: one per party)",
            IntRange{0, 60000});
  flags.Int("max-test-samples", &s.max_test_samples, "test images the coordinator evaluates on after each round (0: all 10000)",
            IntRange{0, 10000});
  flags.Int("local-epochs", &s.local_epochs, "the job's local epochs (real workers)", IntRange{1, 1000});
  flags.Int("batch-size", &s.batch_size, "the job's batch size (real workers)", IntRange{1, 60000});
  flags.Double("round-deadline-s", &s.round_deadline_s, "the job's round deadline", DoubleRange{0.001, 86400});
  flags.String("job", &s.job, "follow this job instead of submitting one");
  flags.Int("warmup", &s.warmup, "rounds left out of the medians", IntRange{0, 1000});
  flags.Double("idle-s", &s.idle_s, "submit no job: join, heartbeat for this long, and report the heartbeat cost",
               DoubleRange{0, 86400});
  flags.Double("join-timeout-s", &s.join_timeout_s, "how long every client may take to join", DoubleRange{0.1, 86400});
  flags.Double("timeout-s", &s.timeout_s, "the whole run's limit; the job is cancelled past it",
               DoubleRange{1, 86400});
  flags.Int("coordinator-pid", &s.coordinator_pid, "the coordinator's pid on this machine: report its CPU use and peak RSS",
            IntRange{0, INT32_MAX});
  flags.Bool("help", &help, "show this help");
  if (Status st = flags.ParseFlagsOnly(argc, argv); !st.ok()) {
    std::cerr << "tessera-loadgen: " << st.message() << "\n";
    return 2;
  }
  if (help) {
    std::cout << kUsage << flags.Usage();
    return 0;
  }
  if (!flags.positional().empty()) {
    std::cerr << "tessera-loadgen: unexpected argument '" << flags.positional().front() << "' (see --help)\n";
    return 2;
  }
  std::vector<uint32_t> hidden;
  if (Status st = Validate(s, &hidden); !st.ok()) {
    std::cerr << "tessera-loadgen: " << st.message() << "\n";
    return 2;
  }
  // One connection per channel: a shell's soft open-file limit (often 1,024) goes up to the
  // hard one, and a run that still would not fit is refused here rather than failing at the
  // first client past it.
  const uint64_t connections = static_cast<uint64_t>(s.channels == 0 ? s.clients : std::min(s.channels, s.clients));
  if (auto limit = RaiseOpenFileLimit(); !limit.ok()) {
    std::cerr << "tessera-loadgen: " << limit.status().message() << "\n";
  } else if (auto shortfall = OpenFileShortfall(*limit, connections + 256, "--clients / --channels connections")) {
    std::cerr << "tessera-loadgen: " << *shortfall << "\n";
    return 2;
  }
  // Debian's Abseil is built with mutex deadlock detection on, so every lock gRPC takes
  // updates a process-wide lock graph: about a tenth of this process's CPU with 1,000
  // clients. This process's own locks are std::mutex; leave gRPC's unchecked here.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const int code = Run(s, hidden);
  std::fflush(stdout);
  return code;
}
