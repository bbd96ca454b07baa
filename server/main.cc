// tessera-coordinator: the coordinator daemon.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <iostream>
#include <thread>

#include "base/flags.h"
#include "base/host_port.h"
#include "base/logging.h"
#include "base/shutdown_signal.h"
#include "server/coordinator.h"

namespace {

const char kUsage[] = R"(tessera-coordinator: schedules federated rounds for the workers that join it.

It keeps jobs, rounds and workers' seats in SQLite under --state-dir, with the global model's
checkpoints beside it, and resumes every running job from its last committed round when it
starts again on the same directory. Workers dial in (they may sit behind NAT); the
coordinator never dials a worker.

Usage: tessera-coordinator [flags]

Example:
  tessera-coordinator --listen 127.0.0.1:7070 --state-dir ./var --join-token-file ./var/join-token

Flags:
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  server::CoordinatorOptions options;
  std::string token_file;
  int64_t heartbeat_timeout_ms = options.registry.heartbeat_timeout_ms;
  int64_t heartbeat_interval_ms = options.registry.heartbeat_interval_ms;
  int64_t worker_wait_s = options.runner.worker_wait_timeout.count() / 1000;
  std::string log_level = "info";
  std::string log_format = "text";
  bool help = false;
  FlagSet flags;
  flags.String("listen", &options.listen_address, "address to listen on (host:port; port 0 picks one)");
  flags.String("state-dir", &options.state_dir, "directory of the coordinator's database and checkpoints");
  flags.String("join-token", &options.join_token, "the token workers must present to join");
  flags.String("join-token-file", &token_file, "read the join token from this file instead");
  flags.Int("heartbeat-interval-ms", &heartbeat_interval_ms, "how often workers send heartbeats", IntRange{50, 60000});
  flags.Int("heartbeat-timeout-ms", &heartbeat_timeout_ms, "a worker silent this long is dropped from its round",
            IntRange{100, 3600000});
  flags.Int("worker-wait-s", &worker_wait_s, "how long a round waits for min_clients workers before the attempt fails",
            IntRange{1, 7 * 24 * 3600});
  flags.Choice("log-level", &log_level, LogLevelChoices(), "what to log");
  flags.Choice("log-format", &log_format, LogFormatChoices(), "one line per event: text, or a JSON object");
  flags.Bool("help", &help, "show this help");
  if (Status s = flags.Parse(argc, argv); !s.ok()) {
    std::cerr << "tessera-coordinator: " << s.message() << "\n";
    return 2;
  }
  if (help) {
    std::cout << kUsage << flags.Usage();
    return 0;
  }
  if (heartbeat_timeout_ms <= heartbeat_interval_ms) {
    std::cerr << "tessera-coordinator: flag --heartbeat-timeout-ms: expected more than --heartbeat-interval-ms ("
              << heartbeat_interval_ms << "), got " << heartbeat_timeout_ms << "\n";
    return 2;
  }
  if (auto listen = ParseHostPort("--listen", options.listen_address, PortZero::kAllowed); !listen.ok()) {
    std::cerr << "tessera-coordinator: " << listen.status().message() << "\n";
    return 2;
  }
  if (Status s = ConfigureLogging("coordinator", log_level, log_format); !s.ok()) {
    std::cerr << "tessera-coordinator: " << s.message() << "\n";
    return 2;
  }
  if (!token_file.empty()) {
    auto token = ReadSecretFile("join-token-file", token_file);
    if (!token.ok()) {
      std::cerr << "tessera-coordinator: " << token.status().message() << "\n";
      return 2;
    }
    options.join_token = *token;
  }
  options.registry.heartbeat_interval_ms = static_cast<uint32_t>(heartbeat_interval_ms);
  options.registry.heartbeat_timeout_ms = static_cast<uint32_t>(heartbeat_timeout_ms);
  options.runner.worker_wait_timeout = std::chrono::seconds(worker_wait_s);

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
    return 1;
  }
  std::printf("tessera-coordinator listening on port %d\n", (*coordinator)->port());
  std::fflush(stdout);
  std::thread waiter([&] {
    const int signal = WaitForShutdownSignal();
    spdlog::info("signal {}: shutting down", signal);
    (*coordinator)->Shutdown();
  });
  (*coordinator)->Wait();
  waiter.join();
  return 0;
}
