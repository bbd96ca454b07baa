// tessera-coordinator: the coordinator daemon.
#include <absl/synchronization/mutex.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#ifdef __GLIBC__
#include <malloc.h>  // mallopt
#endif
#include <iostream>
#include <thread>

#include "base/escape.h"
#include "base/flags.h"
#include "base/host_port.h"
#include "base/http_limit_flags.h"
#include "base/logging.h"
#include "base/metrics.h"
#include "base/open_files.h"
#include "base/shutdown_signal.h"
#include "device/registry.h"
#include "server/coordinator.h"
#include "server/monitoring/monitoring.h"
#include "tessera/config.h"

namespace {

// Descriptors the coordinator keeps for itself beside its workers' connections and its
// metrics port's (--metrics-max-connections): its state store, checkpoints being written,
// listening sockets.
constexpr uint64_t kReservedDescriptors = 1024;

const char kUsage[] = R"(tessera-coordinator: schedules federated rounds for the workers that join it.

It keeps jobs, rounds and workers' seats in SQLite under --state-dir, with the global model's
checkpoints beside it, and resumes every running job from its last committed round when it
starts again on the same directory, which it locks (one coordinator per directory). Workers
dial in (they may sit behind NAT); the coordinator never dials a worker.

It evaluates every job's model on the test split of the operator's copy of the job's dataset:
--data-dir for Fashion-MNIST (default /usr/share/datasets/fashion-mnist, Debian's
dataset-fashion-mnist), --dataset NAME=DIR for any other (idx, cifar10, npz or csv; a job's
sample shape and classes are read from it at submit). A job spec's data.path only tells the
workers where theirs is.

It serves TLS (--tls-cert and --tls-key, or --tls-dir with the directory `tessera provision`
made for it); with a client CA (--tls-client-ca, or --tls-dir) it is mutual TLS and every
caller shows a certificate whose role is its OU: workers join under their certificate's name,
operators call the job service. A revoked certificate (`tessera provision --revoke`; the list in
--tls-crl, or crl.pem in --tls-dir, reread when it changes) is refused at every call. Workers
may also (or instead, without mutual TLS) need a join token (--join-token-file: one per line,
LABEL TOKEN per site); operators without certificates need the admin token
(--admin-token-file). Plaintext is only with --insecure, on loopback.

Each connected worker takes a file descriptor or two: at start the coordinator raises its soft
open-file limit to the hard one and logs a warning where that is below the 16,384 streams it
serves at once plus 1,024 for itself, plus --metrics-max-connections with --metrics-listen
(raise LimitNOFILE or `ulimit -Hn`).

Usage: tessera-coordinator --state-dir DIR (--tls-dir DIR | --tls-cert FILE --tls-key FILE ...) [flags]

Examples:
  tessera provision --out ./pki --coordinator-host coordinator.example.org --workers a,b,c --operators ops
  tessera-coordinator --listen 0.0.0.0:7070 --state-dir ./var --tls-dir ./pki/coordinator
  tessera-coordinator --listen 127.0.0.1:7070 --state-dir ./var --insecure \
      --join-token-file ./var/join-token --admin-token-file ./var/admin-token

Flags:
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  // Debian's Abseil checks every gRPC-internal mutex acquisition for lock-order cycles, a
  // debugging aid that costs a tenth of the CPU of an idle federation's heartbeats.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#ifdef __GLIBC__
  // Two malloc arenas, not eight per core: gRPC's threads allocate transfer buffers on one
  // thread and free them on another, and many arenas hold hundreds of MB of freed pages at 100
  // workers' uploads (docs/benchmarks/round-overhead-history-2026-12-01-02.md).
  // MALLOC_ARENA_MAX still decides.
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 2);
#endif
  server::CoordinatorOptions options;
  std::string token_file;
  std::string admin_token_file;
  wire::TlsFlags tls_flags;
  int64_t heartbeat_timeout_ms = options.registry.heartbeat_timeout_ms;
  int64_t heartbeat_interval_ms = options.registry.heartbeat_interval_ms;
  int64_t max_workers = static_cast<int64_t>(options.registry.max_workers);
  int64_t worker_wait_s = options.runner.worker_wait_timeout.count() / 1000;
  int64_t commit_retry_s = options.runner.commit_retry_limit.count() / 1000;
  std::string log_level = "info";
  std::string log_format = "text";
  std::string metrics_listen;
  int64_t stream_window_kib = options.stream_window_kib;
  int64_t upload_buffer_mib = static_cast<int64_t>(options.upload_buffer_bytes >> 20);
  int64_t retention_days = 0;
  int64_t evaluation_threads = options.runner.evaluation_threads;
  int64_t inline_model_kib = static_cast<int64_t>(options.runner.inline_model_bytes >> 10);
  int64_t upload_connection_kib = static_cast<int64_t>(options.upload_connection_min_bytes >> 10);
  int64_t inline_update_kib = static_cast<int64_t>(options.inline_update_max_bytes >> 10);
  bool help = false;
  bool version = false;
  FlagSet flags;
  flags.String("listen", &options.listen_address, "address to listen on (host:port; port 0 picks one)");
  flags.String("state-dir", &options.state_dir, "directory of the coordinator's database and checkpoints");
  flags.String("data-dir", &options.runner.data_dir,
               "the operator's Fashion-MNIST directory (IDX files): the coordinator evaluates every job on its test "
               "split and reads its training labels for the parties' sizes; a job's data.path only tells workers "
               "where their data is");
  std::vector<std::string> dataset_flags;
  flags.StringList("dataset", &dataset_flags,
                   "NAME=DIR: the operator's copy of dataset NAME (both splits, in the format jobs give in "
                   "data.format) for jobs whose data.dataset is NAME: their shapes are read from it at submit, "
                   "their rounds evaluated on its test split");
  flags.String("join-token", &options.join_token, "a token workers must present to join (visible in ps: prefer the file)");
  flags.String("join-token-file", &token_file, "join tokens, one per line: TOKEN, or LABEL TOKEN per site (a worker's name is bound to the label it first joins with)");
  flags.String("admin-token-file", &admin_token_file, "the admin token operators without a certificate present (its first line)");
  wire::DeclareTlsFlags(flags, &tls_flags, wire::TlsSide::kServer);
  flags.Int("heartbeat-interval-ms", &heartbeat_interval_ms, "how often workers send heartbeats", IntRange{50, 60000});
  flags.Int("heartbeat-timeout-ms", &heartbeat_timeout_ms, "a worker silent this long is dropped from its round",
            IntRange{100, 3600000});
  flags.Int("max-workers", &max_workers,
            "worker names the coordinator knows at most (joined, lost or from before a restart); a join under a "
            "new name past it is refused, a known name still rejoins",
            IntRange{1, 10000000});
  flags.Int("worker-wait-s", &worker_wait_s, "how long a round waits for min_clients workers before the attempt fails",
            IntRange{1, 7 * 24 * 3600});
  flags.Int("commit-retry-s", &commit_retry_s,
            "how long a round whose checkpoint or record cannot be written (a full disk, an I/O error) is tried "
            "again, the same model, waiting 1 s, then twice as long each time up to 30 s, before its job fails; "
            "the round is not committed meanwhile. 0: the job fails at the first such error",
            IntRange{0, 7 * 24 * 3600});
  flags.Choice("log-level", &log_level, LogLevelChoices(), "what to log");
  flags.Choice("log-format", &log_format, LogFormatChoices(), "one line per event: text, or a JSON object");
  flags.Int("stream-window-kib", &stream_window_kib,
            "the HTTP/2 receive window per stream in KiB; each upload moves at most this much per round trip "
            "(1 MiB: 10 MB/s at 100 ms). 0: gRPC's window, grown by probing the link, faster over long links "
            "and far more memory with many uploads",
            IntRange{0, 65536});
  flags.Int("upload-buffer-mib", &upload_buffer_mib,
            "memory for updates being received at once, in MiB; more wait their turn in the workers (one update "
            "is always let through, whatever its size). Raise it for many workers on slow links",
            IntRange{16, 65536});
  flags.Int("ended-job-retention-days", &retention_days,
            "delete a job that ended (succeeded, failed or cancelled) once its end is this many days old: its "
            "checkpoints, record, rounds and seats, swept at start and hourly (the newest job is always kept). 0: "
            "ended jobs are kept for good",
            IntRange{0, 36500});
  flags.Int("inline-model-kib", &inline_model_kib,
            "a model of at most this many KiB travels inside each worker's task instead of by a download call "
            "(workers that take it; a round then costs each worker one call less). 0: always downloaded",
            IntRange{0, static_cast<int64_t>(server::ModelVersion::kMaxInlineBytes >> 10)});
  flags.Int("upload-connection-kib", &upload_connection_kib,
            "workers send an update of at least this many KiB on a connection of its own, closed after the "
            "upload: gRPC keeps a connection's read buffers as large as its largest transfer, so large updates "
            "on the workers' long-lived connections would hold memory here for every worker; each such upload "
            "costs a new connection (under TLS a handshake, about as much CPU here as receiving 1 MB). 0: every "
            "upload on the worker's connection",
            IntRange{0, int64_t{1} << 30});
  flags.Int("inline-update-kib", &inline_update_kib,
            "workers hold their task channel as a two-way session and send an update of at most this many KiB "
            "inside it, with no upload call (a small model's round then costs each worker no call beyond the "
            "session); larger updates go by an upload call. 0: no sessions, every update by an upload call",
            IntRange{0, static_cast<int64_t>(server::CoordinatorOptions::kMaxInlineUpdateBytes >> 10)});
  flags.Bool("trained-weights", &options.runner.take_trained_weights,
             "let workers send a float32 update as their trained model and subtract the round's model here "
             "(the same delta; a worker then keeps no copy of the global model while it trains; costs the "
             "coordinator a write of each delta; not for a job whose model travels compressed). On by default; "
             "--trained-weights=false: every update is a delta");
  flags.Int("eval-threads", &evaluation_threads,
            "OpenBLAS threads for evaluating each round's model (0: OpenBLAS's default, every core); idle "
            "OpenBLAS threads spin between rounds and take CPU from the transfers",
            IntRange{0, 256});
  flags.String("eval-device", &options.runner.evaluation_device,
               "device to evaluate each round's model on: cpu, or cuda for a GPU beside the coordinator (any "
               "device tessera devices lists); checked at start, an unknown or unusable one is an error");
  flags.String("metrics-listen", &metrics_listen,
               "HOST:PORT for /metrics (Prometheus) and the dashboard, served like the gRPC port (TLS; "
               "operators only); unset: not served");
  HttpLimitFlags metrics_limits;
  DeclareHttpLimitFlags(flags, "metrics", &metrics_limits);
  flags.Bool("version", &version, "print the version of this build");
  flags.Bool("help", &help, "show this help");
  if (Status s = flags.ParseFlagsOnly(argc, argv); !s.ok()) {
    std::cerr << "tessera-coordinator: " << s.message() << "\n";
    return 2;
  }
  if (help) {
    std::cout << kUsage << flags.Usage();
    return 0;
  }
  if (version) {
    std::cout << "tessera-coordinator " << TESSERA_VERSION << "\n";
    return 0;
  }
  if (heartbeat_timeout_ms <= heartbeat_interval_ms) {
    std::cerr << "tessera-coordinator: flag --heartbeat-timeout-ms: expected more than --heartbeat-interval-ms ("
              << heartbeat_interval_ms << "), got " << heartbeat_timeout_ms << "\n";
    return 2;
  }
  {
    server::DatasetDirs dirs;
    for (const std::string& flag : dataset_flags) {
      if (Status s = server::AddDatasetFlag(flag, &dirs); !s.ok()) {
        std::cerr << "tessera-coordinator: " << s.message() << "\n";
        return 2;
      }
    }
    options.runner.datasets = std::move(dirs.by_name);
  }
  // Not given, Debian's directory may be missing on a coordinator that evaluates other datasets.
  if (flags.WasGiven("data-dir")) {
    const std::string& dir = options.runner.data_dir;
    if (Status s = CheckDirectory("--data-dir " + QuoteUntrusted(dir, 256), dir); !s.ok()) {
      std::cerr << "tessera-coordinator: " << s.message() << "\n";
      return 2;
    }
  }
  if (Status s = CheckDeviceName("--eval-device", options.runner.evaluation_device); !s.ok()) {
    std::cerr << "tessera-coordinator: " << s.message() << "\n";
    return 2;
  }
  auto listen = ParseHostPort("--listen", options.listen_address, PortZero::kAllowed);
  if (!listen.ok()) {
    std::cerr << "tessera-coordinator: " << listen.status().message() << "\n";
    return 2;
  }
  if (!metrics_listen.empty()) {
    if (auto parsed = ParseHostPort("--metrics-listen", metrics_listen, PortZero::kAllowed); !parsed.ok()) {
      std::cerr << "tessera-coordinator: " << parsed.status().message() << "\n";
      return 2;
    }
  }
  if (Status s = CheckHttpLimitFlags(flags, "metrics", metrics_limits); !s.ok()) {
    std::cerr << "tessera-coordinator: " << s.message() << "\n";
    return 2;
  }
  auto tls = wire::LoadServerTls(tls_flags, *listen);
  if (!tls.ok()) {
    std::cerr << "tessera-coordinator: " << tls.status().message() << "\n";
    return 2;
  }
  options.tls = *tls;
  if (Status s = ConfigureLogging("coordinator", log_level, log_format); !s.ok()) {
    std::cerr << "tessera-coordinator: " << s.message() << "\n";
    return 2;
  }
  if (!token_file.empty()) {
    auto tokens = server::ReadJoinTokenFile(token_file);
    if (!tokens.ok()) {
      std::cerr << "tessera-coordinator: " << tokens.status().message() << "\n";
      return 2;
    }
    options.join_tokens = *tokens;
  }
  if (!admin_token_file.empty()) {
    auto token = ReadSecretFile("admin-token-file", admin_token_file);
    if (!token.ok()) {
      std::cerr << "tessera-coordinator: " << token.status().message() << "\n";
      return 2;
    }
    options.admin_token = *token;
  }
  options.registry.heartbeat_interval_ms = static_cast<uint32_t>(heartbeat_interval_ms);
  options.registry.heartbeat_timeout_ms = static_cast<uint32_t>(heartbeat_timeout_ms);
  options.registry.max_workers = static_cast<size_t>(max_workers);
  options.runner.worker_wait_timeout = std::chrono::seconds(worker_wait_s);
  options.runner.commit_retry_limit = std::chrono::seconds(commit_retry_s);
  options.stream_window_kib = static_cast<uint32_t>(stream_window_kib);
  options.upload_buffer_bytes = static_cast<uint64_t>(upload_buffer_mib) << 20;
  options.ended_job_retention = std::chrono::hours(retention_days * 24);
  options.runner.evaluation_threads = static_cast<int>(evaluation_threads);
  if (options.runner.evaluation_device != "cpu") {
    // Made once here, so that a GPU that is missing stops the coordinator at start rather than
    // every job at its first evaluation.
    auto device = CreateDevice(options.runner.evaluation_device);
    if (!device.ok()) {
      std::cerr << "tessera-coordinator: --eval-device " << QuoteUntrusted(options.runner.evaluation_device)
                << " cannot be used here: " << device.status().message() << "\n";
      return 1;
    }
  }
  options.runner.inline_model_bytes = static_cast<uint64_t>(inline_model_kib) << 10;
  options.upload_connection_min_bytes = static_cast<uint64_t>(upload_connection_kib) << 10;
  options.inline_update_max_bytes = static_cast<uint64_t>(inline_update_kib) << 10;

  // Every connected worker holds a connection (two while it sends a large update) and at least
  // one stream; open streams are bounded by options.streams.max_streams. The soft open-file
  // limit goes up to the hard one, and a hard limit below the streams the coordinator serves
  // (plus room for its own files) is said at start rather than found at the worker past it.
  if (auto limit = RaiseOpenFileLimit(); !limit.ok()) {
    spdlog::warn("{}", limit.status().message());
  } else if (auto shortfall = OpenFileShortfall(
                 *limit,
                 uint64_t{options.streams.max_streams} + kReservedDescriptors +
                     (metrics_listen.empty() ? 0 : static_cast<uint64_t>(metrics_limits.max_connections)),
                 metrics_listen.empty() ? "the workers connected at once (about one descriptor each)"
                                        : "the workers connected at once (about one descriptor each) and the "
                                          "metrics port's connections (--metrics-max-connections)")) {
    spdlog::warn("{}", *shortfall);
  }

  // SIGINT and SIGTERM drain and exit 0, whichever thread takes them (OpenBLAS's threads,
  // started before main(), included); the coordinator's own threads leave them to the waiter.
  if (Status s = InstallShutdownSignalHandlers(); !s.ok()) {
    std::cerr << "tessera-coordinator: " << s.message() << "\n";
    return 1;
  }
  BlockShutdownSignals();

  auto coordinator = server::Coordinator::Start(options);
  if (!coordinator.ok()) {
    std::cerr << "tessera-coordinator: " << coordinator.status().ToString() << "\n";
    // Options that do not fit together (no credential for workers or operators, a token
    // labelled twice) are a bad command line, as a bad flag is: exit 2, which its service unit
    // does not restart. A held lock or a busy port may clear: exit 1.
    return coordinator.status().code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::printf("tessera-coordinator listening on port %d\n", (*coordinator)->port());
  std::unique_ptr<server::MonitoringServer> monitoring;
  if (!metrics_listen.empty()) {
    metrics::RegisterProcessMetrics(metrics::Global());
    server::MonitoringOptions monitoring_options;
    monitoring_options.listen = metrics_listen;
    monitoring_options.tls = options.tls;
    monitoring_options.max_connections = static_cast<int>(metrics_limits.max_connections);
    monitoring_options.max_connections_per_address = static_cast<int>(metrics_limits.max_connections_per_address);
    auto started = server::MonitoringServer::Start(coordinator->get(), monitoring_options);
    if (!started.ok()) {
      std::cerr << "tessera-coordinator: " << started.status().message() << "\n";
      (*coordinator)->Shutdown();
      return 2;
    }
    monitoring = std::move(started).value();
    std::printf("dashboard and metrics at %s/ and %s/metrics\n", monitoring->url().c_str(), monitoring->url().c_str());
  }
  std::fflush(stdout);
  std::thread waiter([&] {
    const int signal = WaitForShutdownSignal();
    spdlog::info("signal {}: shutting down", signal);
    (*coordinator)->Shutdown();
  });
  (*coordinator)->Wait();
  waiter.join();
  if (monitoring) monitoring->Stop();
  return 0;
}
