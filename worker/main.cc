// tessera-worker: the worker daemon.
#include <spdlog/spdlog.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <iostream>
#include <thread>
#include <tuple>

#include "base/escape.h"
#include "base/flags.h"
#include "base/host_port.h"
#include "base/huge_pages.h"
#include "base/http_endpoint.h"
#include "base/http_limit_flags.h"
#include "base/logging.h"
#include "base/metrics.h"
#include "base/shutdown_signal.h"
#include "device/cuda/factory.h"
#include "device/emulated/factory.h"
#include "device/registry.h"
#include "device/xrt/factory.h"
#include "proto/transport_security.h"
#include "tessera/config.h"
#include "worker/agent.h"
#include "worker/cohort.h"

namespace {

const char kUsage[] = R"(tessera-worker: joins a coordinator and trains federated rounds on this node's device.

The worker dials out to the coordinator (it may sit behind NAT), joins, keeps a heartbeat,
and for each round it is given downloads the global model, trains on its share of the data and
uploads the change. It reconnects by itself when the coordinator goes away.

It verifies the coordinator over TLS (--tls-ca, or --tls-dir with the directory `tessera
provision` made for this worker) and proves who it is with its certificate (mutual TLS: its
name is the certificate's CN) and/or the join token the coordinator asks for. Plaintext is only
with --insecure, to a coordinator on loopback.

Usage: tessera-worker --coordinator HOST:PORT (--tls-dir DIR | --tls-ca FILE ...) [flags]

Examples:
  tessera-worker --coordinator coordinator.example.org:7070 --tls-dir ./pki/workers/edge-01
  tessera-worker --coordinator coordinator.example.org:7070 --tls-ca ./ca.crt \
      --join-token-file ./site-a.token --name edge-01

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
  bool version = false;
  std::string metrics_listen;
  char host[256] = "worker";
  gethostname(host, sizeof(host) - 1);
  options.name = std::string(host) + "-" + std::to_string(getpid());
  const std::string default_name = options.name;
  wire::TlsFlags tls_flags;
  FlagSet flags;
  flags.String("coordinator", &coordinator, "the coordinator's address (HOST:PORT)");
  flags.String("name", &options.name, "this worker's name, its identity at the coordinator (with a certificate: its CN, the default); keep it stable to keep the worker's seat across restarts");
  flags.String("join-token", &options.join_token, "the coordinator's join token (visible to other users in ps: prefer the file)");
  flags.String("join-token-file", &token_file, "read the join token from this file (its first line)");
  flags.String("device", &options.device, "device to train on: cpu, cuda, xrt, emu:PROFILE, emu:FILE.toml or emu:FILE.toml#PROFILE (see tessera devices); an unknown name is an error");
  flags.String("fallback-device", &options.fallback_device,
               "device to use when --device is known but not usable here (no GPU, no driver); empty for none. A "
               "device whose own files are missing is an error at start, not a fallback: an xclbin "
               "TESSERA_XRT_XCLBIN names, a CUDA module that cannot be loaded where the driver is",
               EmptyValue::kAllowed);
  flags.String("data-dir", &options.data_dir, "directory of this worker's own dataset, in the job's data.format (local-files jobs)");
  flags.String("cohort", &options.cohort, "site cohort name: workers with the same name train as one client");
  flags.String("cohort-address", &options.cohort_address, "host (no port) this worker listens on for its cohort's peers, who dial it");
  int64_t cohort_timeout_s = options.cohort_timeout_s;
  flags.Int("cohort-timeout-s", &cohort_timeout_s,
            "seconds the cohort's rendezvous and each of its gradient allreduces wait for the other members, never "
            "past the round's deadline; raise it for members of very different speeds (a paced edge device beside "
            "a GPU)",
            IntRange{1, worker::kMaxCohortTimeoutS});
  flags.Int("chunk-kib", &chunk_kib,
            "upload chunk size in KiB; the coordinator holds about one chunk per uploading worker in gRPC's read buffers",
            IntRange{1, 1024});
  flags.Bool("pace-real-time", &options.pace_real_time,
             "with an emulated device (emu:...): sleep until each op's modelled time has passed, so a slow chip's "
             "rounds really take as long as its profile says (default: as fast as this host computes)");
  flags.Bool("keep-round-memory", &options.keep_round_memory,
             "keep a round's buffers (up to 32 MiB each) between rounds instead of handing them back to the kernel "
             "after each round: faster rounds of large models for a peak a few buffers higher; memory is handed back "
             "once the worker has been idle for 10 s (default: lean, buffers of 256 KiB or more mapped and unmapped "
             "each round)");
  bool huge_pages = true;
  flags.Bool("huge-pages", &huge_pages,
             "fault the large buffers a round maps (4 MiB or more: a large model's tensors, its download and its "
             "update) in 2 MiB transparent huge pages where the kernel gives them on request (madvise): one fault "
             "where there were 512; only the whole huge pages inside a buffer, so what is resident is unchanged "
             "(default true; off with --keep-round-memory, whose buffers stay in the heap, and refused beside it when given; "
             "false where the kernel's "
             "compaction for huge pages would stall a worker on a host short of free memory)");
  std::string trainer;
  flags.String("trainer", &trainer,
               "NAME=COMMAND: run COMMAND (split on spaces, no shell; its program, a path or a name in PATH, must be "
               "an executable file at start) as the external trainer NAME for jobs whose model.trainer is NAME; it "
               "trains each round through python/tessera_client (see docs/JOBS.md)");
  wire::DeclareTlsFlags(flags, &tls_flags, wire::TlsSide::kClient);
  flags.Choice("log-level", &log_level, LogLevelChoices(), "what to log");
  flags.Choice("log-format", &log_format, LogFormatChoices(), "one line per event: text, or a JSON object");
  flags.String("metrics-listen", &metrics_listen,
               "HOST:PORT to serve /metrics on for Prometheus (plaintext, read-only: timings and device figures); "
               "unset: not served");
  HttpLimitFlags metrics_limits;
  DeclareHttpLimitFlags(flags, "metrics", &metrics_limits);
  flags.Bool("version", &version, "print the version of this build");
  flags.Bool("help", &help, "show this help");
  if (Status s = flags.ParseFlagsOnly(argc, argv); !s.ok()) {
    std::cerr << "tessera-worker: " << s.message() << "\n";
    return 2;
  }
  if (help) {
    std::cout << kUsage << flags.Usage();
    return 0;
  }
  if (version) {
    std::cout << "tessera-worker " << TESSERA_VERSION << "\n";
    return 0;
  }
  if (options.keep_round_memory && flags.WasGiven("huge-pages") && huge_pages) {
    std::cerr << "tessera-worker: --huge-pages and --keep-round-memory: a kept round's buffers stay in the heap, "
                 "where no huge page is asked for; give one\n";
    return 2;
  }
#ifdef __GLIBC__
  if (options.keep_round_memory) {
    // Buffers of up to 32 MiB (glibc's largest threshold) come from the heap and are reused by
    // the next round: no page faults on them, no TLB flushes when they are freed.
    if (mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) != 1 || mallopt(M_TRIM_THRESHOLD, 512 * 1024 * 1024) != 1) {
      std::cerr << "tessera-worker: --keep-round-memory: this C library refused the heap settings; buffers are "
                   "handed back as without the flag\n";
      options.keep_round_memory = false;
    }
  }
  if (!options.keep_round_memory) {
    // Buffers of 256 KiB or more (a large model's tensors, its update, the download's bytes)
    // are mapped for themselves and unmapped when freed. glibc's default raises this threshold
    // to the largest block freed so far, after which a 10 MiB model's round leaves its copies
    // in the heap, free but resident (22 MB of a CPU worker's 70 MB between rounds, measured
    // with bench/worker_memory.sh). Small tensors (SimpleCNN's largest, 256 x 120, is 123 KB)
    // stay in the heap.
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    // Setting the threshold above also fixes glibc's trim threshold at 128 KiB, so every
    // round's freed task, model and update buffers (a small model's are each under 256 KiB)
    // were handed back to the kernel (madvise, brk) and faulted in again by the next round. On
    // a virtual machine each hand-back flushes the TLB of every core: a third of a worker's
    // CPU per round went there and 100 workers' rounds took 3.7x as long
    // (docs/benchmarks/round-overhead-history-2026-12-03.md). The heap keeps up to 8 MiB
    // free per arena; a large model's round still ends in malloc_trim.
    mallopt(M_TRIM_THRESHOLD, 8 * 1024 * 1024);
    // Those mappings are faulted in a page at a time, every round: 2,600 faults for a 10 MiB
    // tensor, each a trip through the hypervisor on a virtual machine. Asked for huge pages
    // before they are touched, the whole 2 MiB pages inside them come in one fault each
    // (base/huge_pages.h; 10 MiB rounds of 10 workers 25-35% shorter,
    // docs/benchmarks/round-overhead-history-2026-12-03.md).
    EnableHugePageAdvice(huge_pages);
  }
#endif
  if (flags.WasGiven("data-dir")) {
    if (Status s = CheckDirectory("--data-dir " + QuoteUntrusted(options.data_dir, 256), options.data_dir); !s.ok()) {
      std::cerr << "tessera-worker: " << s.message() << "\n";
      return 2;
    }
  }
  if (!trainer.empty()) {
    auto command = worker::ParseTrainerFlag(trainer);
    if (!command.ok()) {
      std::cerr << "tessera-worker: " << command.status().message() << "\n";
      return 2;
    }
    const char* path = std::getenv("PATH");
    if (Status s = worker::CheckTrainerProgram(*command, path != nullptr ? path : "/bin:/usr/bin"); !s.ok()) {
      std::cerr << "tessera-worker: " << s.message() << "\n";
      return 2;
    }
    options.trainers.push_back(std::move(command).value());
  }
  HttpEndpointOptions metrics_options;
  if (!metrics_listen.empty()) {
    auto listen = ParseHostPort("--metrics-listen", metrics_listen, PortZero::kAllowed);
    if (!listen.ok()) {
      std::cerr << "tessera-worker: " << listen.status().message() << "\n";
      return 2;
    }
    metrics_options.host = listen->host;
    metrics_options.port = listen->port;
  }
  if (Status s = CheckHttpLimitFlags(flags, "metrics", metrics_limits); !s.ok()) {
    std::cerr << "tessera-worker: " << s.message() << "\n";
    return 2;
  }
  ApplyHttpLimitFlags(metrics_limits, &metrics_options);
  auto address = ParseHostPort("--coordinator", coordinator, PortZero::kRefused);
  if (!address.ok()) {
    std::cerr << "tessera-worker: " << address.status().message() << "\n";
    return 2;
  }
  auto tls = wire::LoadClientTls(tls_flags, *address, wire::kWorkerRole);
  if (!tls.ok()) {
    std::cerr << "tessera-worker: " << tls.status().message() << "\n";
    return 2;
  }
  if (!tls->cert_pem.empty()) {
    // Under mutual TLS a worker joins under the name its certificate carries.
    auto certificate = wire::ReadCertificate(tls->cert_pem, "--tls-cert");
    if (!certificate.ok()) {
      std::cerr << "tessera-worker: " << certificate.status().message() << "\n";
      return 2;
    }
    if (options.name == default_name) {
      options.name = certificate->common_name;
    } else if (options.name != certificate->common_name) {
      std::cerr << "tessera-worker: --name " << QuoteUntrusted(options.name) << " differs from the certificate's name "
                << QuoteUntrusted(certificate->common_name) << " (its CN); a worker joins under its certificate's name\n";
      return 2;
    }
  }
  // Names as the coordinator takes them at the join, refused here before anything starts.
  for (const auto& [flag, value, least] : {std::tuple<const char*, const std::string*, size_t>{"name", &options.name, 1},
                                           {"cohort", &options.cohort, 0}}) {
    const bool ok = value->size() >= least && value->size() <= 128 && std::all_of(value->begin(), value->end(), [](char c) {
                      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
                    });
    if (!ok) {
      std::cerr << "tessera-worker: flag --" << flag << ": expected " << least
                << " to 128 letters, digits, '-', '_' or '.', got " << QuoteUntrusted(*value) << "\n";
      return 2;
    }
  }
  for (const auto& [flag, device] : {std::pair<std::string, std::string>{"--device", options.device},
                                     {"--fallback-device", options.fallback_device}}) {
    if (flag == "--fallback-device" && device.empty()) continue;
    if (Status s = CheckDeviceName(flag, device); !s.ok()) {
      std::cerr << "tessera-worker: " << s.message() << "\n";
      return 2;
    }
    // A profile file is read now, so that one missing or malformed stops the worker naming its
    // flag: --device's was found only as the device opened, after the metrics endpoint started,
    // and --fallback-device's only once --device turned out unusable.
    if (IsEmulatedDeviceName(device) && device.find(".toml") != std::string::npos) {
      if (auto made = CreateEmulatedDeviceByName(device); !made.ok()) {
        std::cerr << "tessera-worker: " << flag << " " << QuoteUntrusted(device, 256)
                  << " cannot be used here: " << made.status().message() << "\n";
        return 1;
      }
    }
    // So is the xclbin TESSERA_XRT_XCLBIN names: one missing is a mistake to fix, which the
    // fallback device would otherwise hide (no xclbin named, no card, no XRT: those fall back).
    if (device == "xrt") {
      if (Status s = CheckXrtXclbinVariable(); !s.ok()) {
        std::cerr << "tessera-worker: " << flag << " 'xrt' cannot be used here: " << s.message() << "\n";
        return 1;
      }
    }
    // And a CUDA module that cannot be loaded where the driver is: an install to fix (the
    // module missing, cuBLAS missing, another build's), not a GPU missing here. No driver or no
    // GPU still falls back.
    if (device == "cuda") {
      if (Status s = CheckCudaModule(); !s.ok()) {
        std::cerr << "tessera-worker: " << flag << " 'cuda' cannot be used here: " << s.message() << "\n";
        return 1;
      }
    }
  }
  if (options.pace_real_time && !IsEmulatedDeviceName(options.device)) {
    std::cerr << "tessera-worker: --pace-real-time paces an emulated device; --device " << QuoteUntrusted(options.device)
              << " is not one (expected emu:PROFILE, emu:FILE.toml or emu:FILE.toml#PROFILE)\n";
    return 2;
  }
  options.chunk_bytes = static_cast<uint32_t>(chunk_kib * 1024);
  if (flags.WasGiven("cohort-address") && options.cohort.empty()) {
    std::cerr << "tessera-worker: --cohort-address is the address for a cohort's peers; give --cohort too\n";
    return 2;
  }
  if (Status s = worker::CheckCohortAddress(options.cohort_address); !s.ok()) {
    std::cerr << "tessera-worker: " << s.message() << "\n";
    return 2;
  }
  if (flags.WasGiven("cohort-timeout-s") && options.cohort.empty()) {
    std::cerr << "tessera-worker: --cohort-timeout-s bounds the waits of a cohort's members; give --cohort too\n";
    return 2;
  }
  options.cohort_timeout_s = static_cast<uint32_t>(cohort_timeout_s);
  if (flags.WasGiven("join-token") && flags.WasGiven("join-token-file")) {
    std::cerr << "tessera-worker: --join-token and --join-token-file both give the join token; give one\n";
    return 2;
  }
  if (!token_file.empty()) {
    auto token = ReadSecretFile("join-token-file", token_file);
    if (!token.ok()) {
      std::cerr << "tessera-worker: " << token.status().message() << "\n";
      return 2;
    }
    options.join_token = *token;
  }
  if (options.join_token.empty() && tls->cert_pem.empty()) {
    std::cerr << "tessera-worker: a credential to join is required: a join token (--join-token-file) or a worker "
                 "certificate (--tls-dir, or --tls-cert and --tls-key)\n";
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

  auto client = worker::MakeGrpcCoordinatorClient(coordinator, *tls);
  if (!client.ok()) {
    std::cerr << "tessera-worker: " << client.status().message() << "\n";
    return 2;
  }
  auto agent = std::make_unique<worker::WorkerAgent>(options, std::move(client).value());
  std::unique_ptr<HttpEndpoint> metrics_endpoint;
  if (!metrics_listen.empty()) {
    metrics::RegisterProcessMetrics(metrics::Global());
    metrics_options.routes.push_back({"/metrics", [](const HttpRequest&) {
                                        return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8",
                                                            metrics::Global().Render(), {}};
                                      },
                                      nullptr});
    auto started = HttpEndpoint::Start(std::move(metrics_options));
    if (!started.ok()) {
      std::cerr << "tessera-worker: --metrics-listen: " << started.status().message() << "\n";
      return 2;
    }
    metrics_endpoint = std::move(started).value();
    std::printf("metrics at %s/metrics\n", metrics_endpoint->url().c_str());
    std::fflush(stdout);
  }
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
  if (metrics_endpoint) metrics_endpoint->Stop();
  agent.reset();  // the device and the connection close here
  // XRT 2.13 joins its scheduler thread from a static destructor whose order is undefined
  // and can hang there; everything of ours is closed, so leave without static destructors.
  spdlog::shutdown();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(s.ok() ? 0 : 1);
}
