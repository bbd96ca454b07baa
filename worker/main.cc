// tessera-worker: the worker daemon.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <iostream>
#include <thread>

#include "base/escape.h"
#include "base/flags.h"
#include "base/host_port.h"
#include "base/logging.h"
#include "base/shutdown_signal.h"
#include "device/registry.h"
#include "worker/agent.h"

namespace {

const char kUsage[] = R"(tessera-worker: joins a coordinator and trains federated rounds on this node's device.

The worker dials out to the coordinator (it may sit behind NAT), joins with a token, keeps a
heartbeat, and for each round it is given downloads the global model, trains on its share of
the data and uploads the change. It reconnects by itself when the coordinator goes away.

Usage: tessera-worker --coordinator HOST:PORT --join-token-file FILE [flags]

Example:
  tessera-worker --coordinator 127.0.0.1:7070 --join-token-file ./var/join-token --name edge-01

Flags:
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  worker::WorkerOptions options;
  std::string coordinator = "127.0.0.1:7070";
  std::string token_file;
  std::string log_level = "info";
  std::string log_format = "text";
  int64_t chunk_kib = options.chunk_bytes / 1024;
  bool help = false;
  char host[256] = "worker";
  gethostname(host, sizeof(host) - 1);
  options.name = std::string(host) + "-" + std::to_string(getpid());
  FlagSet flags;
  flags.String("coordinator", &coordinator, "the coordinator's address");
  flags.String("name", &options.name, "this worker's name, its identity at the coordinator; keep it stable to keep the worker's seat across restarts");
  flags.String("join-token", &options.join_token, "the coordinator's join token");
  flags.String("join-token-file", &token_file, "read the join token from this file instead");
  flags.String("device", &options.device, "device to train on: cpu, cuda, xrt, emu:PROFILE or emu:FILE.toml (see tessera devices); an unknown name is an error");
  flags.String("fallback-device", &options.fallback_device, "device to use when --device is known but not usable here (no GPU, no driver); empty for none");
  flags.String("data-dir", &options.data_dir, "directory of this worker's own IDX files (local-files jobs)");
  flags.String("cohort", &options.cohort, "site cohort name: workers with the same name train as one client");
  flags.String("cohort-address", &options.cohort_address, "address this worker listens on for its cohort's peers");
  flags.Int("chunk-kib", &chunk_kib, "upload chunk size in KiB", IntRange{1, 1024});
  flags.Choice("log-level", &log_level, LogLevelChoices(), "what to log");
  flags.Choice("log-format", &log_format, LogFormatChoices(), "one line per event: text, or a JSON object");
  flags.Bool("help", &help, "show this help");
  if (Status s = flags.Parse(argc, argv); !s.ok()) {
    std::cerr << "tessera-worker: " << s.message() << "\n";
    return 2;
  }
  if (help) {
    std::cout << kUsage << flags.Usage();
    return 0;
  }
  if (auto address = ParseHostPort("--coordinator", coordinator, PortZero::kRefused); !address.ok()) {
    std::cerr << "tessera-worker: " << address.status().message() << "\n";
    return 2;
  }
  bool name_ok = !options.name.empty() && options.name.size() <= 128;
  for (char c : options.name) name_ok = name_ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.');
  if (!name_ok) {
    std::cerr << "tessera-worker: flag --name: expected 1 to 128 letters, digits, '-', '_' or '.', got "
              << QuoteUntrusted(options.name) << "\n";
    return 2;
  }
  for (const auto& [flag, device] : {std::pair<std::string, std::string>{"--device", options.device},
                                     {"--fallback-device", options.fallback_device}}) {
    if (flag == "--fallback-device" && device.empty()) continue;
    if (Status s = CheckDeviceName(flag, device); !s.ok()) {
      std::cerr << "tessera-worker: " << s.message() << "\n";
      return 2;
    }
  }
  options.chunk_bytes = static_cast<uint32_t>(chunk_kib * 1024);
  if (!token_file.empty()) {
    auto token = ReadSecretFile("join-token-file", token_file);
    if (!token.ok()) {
      std::cerr << "tessera-worker: " << token.status().message() << "\n";
      return 2;
    }
    options.join_token = *token;
  }
  if (options.join_token.empty()) {
    std::cerr << "tessera-worker: a join token is required (--join-token or --join-token-file)\n";
    return 2;
  }
  if (Status s = ConfigureLogging(options.name, log_level, log_format); !s.ok()) {
    std::cerr << "tessera-worker: " << s.message() << "\n";
    return 2;
  }

  // SIGINT and SIGTERM stop the worker and exit 0, whichever thread takes them (OpenBLAS's
  // threads, started before main(), included); the worker's own threads leave them to the
  // waiter.
  if (Status s = InstallShutdownSignalHandlers(); !s.ok()) {
    std::cerr << "tessera-worker: " << s.message() << "\n";
    return 1;
  }
  BlockShutdownSignals();

  auto agent = std::make_unique<worker::WorkerAgent>(options, worker::MakeGrpcCoordinatorClient(coordinator));
  std::thread waiter([&] {
    const int signal = WaitForShutdownSignal();
    if (signal == 0) return;
    spdlog::info("signal {}: stopping", signal);
    agent->Stop();
  });
  Status s = agent->Run();
  if (!s.ok()) std::cerr << "tessera-worker: " << s.ToString() << "\n";
  WakeShutdownWaiter();
  waiter.join();
  agent.reset();  // the device and the connection close here
  // XRT 2.13 joins its scheduler thread from a static destructor whose order is undefined
  // and can hang there; everything of ours is closed, so leave without static destructors.
  spdlog::shutdown();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(s.ok() ? 0 : 1);
}
