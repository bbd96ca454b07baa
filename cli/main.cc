// tessera: the command line for federated jobs.
#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <iostream>
#include <tuple>

#include "base/flags.h"
#include "base/host_port.h"
#include "cli/devices_command.h"
#include "collectives/benchmark.h"
#include "cli/job_client.h"
#include "cli/job_spec.h"
#include "cli/provision.h"
#include "proto/transport_security.h"

namespace {

const char kUsage[] = R"(tessera: launch federated jobs on a Tessera coordinator and watch their rounds.

Usage: tessera [--coordinator HOST:PORT] COMMAND [ARGS]

Commands:
  submit JOB.toml    check a job spec and submit it; prints the job's id
  check JOB.toml     check a job spec and print it as the coordinator will read it
  jobs               list jobs with their state, rounds and accuracy
  status JOB         one job: state, every committed round, latency by phase
  watch JOB          follow a job live: one line per round (accuracy, loss, clients,
                     latency by phase), then the final accuracy and a latency summary
  cancel JOB         cancel a running job
  workers            list the workers: alive or not, state, rounds, device
  devices            this node's devices, viable or not and why, with measured GEMM
                     throughput and bandwidth beside each profile's figures; with
                     --model M, the migration risk list of M on each device
  bench collectives  allreduce time, algbw and busbw over message sizes and rank counts,
                     ranks as processes on loopback, every result checked (flags after
                     `collectives`: --backends p2p,gloo --ranks 2,4 --min-bytes N
                     --max-bytes N --repeat N --tcp-ceiling)
  align              the same samples through two devices (--a, --b) with the same
                     weights: per-sample MAE, top-1 agreement, the worst 5%
  provision          the certificates of a deployment (flags: --out DIR
                     --coordinator-host HOST[,HOST] --workers a,b,c --operators ops
                     [--days N]): a CA, the coordinator's certificate, one per worker and
                     per operator, each in a directory for --tls-dir (see docs/SECURITY.md)

The coordinator's address comes from --coordinator, else $TESSERA_COORDINATOR, else
127.0.0.1:7070. The coordinator is verified over TLS (--tls-ca, or --tls-dir with an operator's
directory from `tessera provision`); the command line proves it is an operator with its
certificate (mutual TLS) or the admin token (--admin-token-file). Plaintext only with
--insecure, to a coordinator on loopback.

Examples:
  tessera provision --out ./pki --coordinator-host coordinator.example.org --workers a,b,c --operators ops
  tessera --tls-dir ./pki/operators/ops submit examples/fmnist-fedavg.toml
  tessera watch job-1-3fa9c2
  tessera workers
  tessera devices --model simplecnn
  tessera align --model simplecnn --a cpu --b emu:ascend-910b
  tessera bench collectives --backends p2p,gloo --ranks 2,4 --max-bytes 16777216

Flags:
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  std::string coordinator = std::getenv("TESSERA_COORDINATOR") ? std::getenv("TESSERA_COORDINATOR") : "127.0.0.1:7070";
  // `tessera bench collectives ...` hands the rest of the line to the benchmark's own flags.
  if (argc >= 3 && std::string(argv[1]) == "bench") {
    if (std::string(argv[2]) != "collectives") {
      std::cerr << "tessera bench: unknown benchmark '" << argv[2] << "' (known: collectives)\n";
      return 2;
    }
    return collectives::CollectivesBenchmarkMain(argc - 2, argv + 2);
  }
  bool help = false;
  DevicesOptions devices;
  AlignOptions align;
  std::string extra_devices;
  int64_t samples = align.samples;
  wire::TlsFlags tls_flags;
  std::string admin_token_file;
  cli::ProvisionOptions provision;
  std::string provision_hosts, provision_workers, provision_operators;
  FlagSet flags;
  flags.String("coordinator", &coordinator, "the coordinator's address (HOST:PORT)");
  wire::DeclareTlsFlags(flags, &tls_flags, wire::TlsSide::kClient);
  flags.String("admin-token-file", &admin_token_file, "the coordinator's admin token, for an operator without a certificate");
  flags.String("model", &devices.model, "devices, align: the model (simplecnn or mlp)");
  flags.String("device", &extra_devices, "devices: more device names to list, comma-separated (emu:FILE.toml)");
  flags.String("a", &align.device_a, "align: the reference device");
  flags.String("b", &align.device_b, "align: the device compared with it");
  flags.Int("samples", &samples, "align: how many test samples to compare");
  flags.String("data-dir", &align.data_dir, "align: Fashion-MNIST directory (default: Debian's)");
  flags.Double("threshold", &align.divergence_threshold, "align: relative MAE past which a layer has diverged");
  flags.String("out", &provision.out_dir, "provision: the directory to write the deployment's certificates into");
  flags.String("coordinator-host", &provision_hosts, "provision: the coordinator's DNS names or IP addresses, comma-separated (localhost, 127.0.0.1 and ::1 are added)");
  flags.String("workers", &provision_workers, "provision: the workers' names, comma-separated (each certificate's CN)");
  flags.String("operators", &provision_operators, "provision: the operators' names, comma-separated");
  flags.Int("days", &provision.days, "provision: how long the certificates issued now are valid", IntRange{1, 3650});
  flags.Bool("help", &help, "show this help");
  if (Status s = flags.Parse(argc, argv); !s.ok()) {
    std::cerr << "tessera: " << s.message() << "\n";
    return 2;
  }
  const auto& args = flags.positional();
  if (help || args.empty()) {
    std::cout << kUsage << flags.Usage();
    return help ? 0 : 2;
  }
  const std::string& command = args[0];
  auto need_argument = [&](const char* what) -> bool {
    if (args.size() != 2) {
      std::cerr << "tessera " << command << ": expected one argument, " << what << "\n";
      return false;
    }
    return true;
  };
  if (command == "check") {
    if (!need_argument("the job spec file")) return 2;
    auto spec = ParseJobSpecFile(args[1]);
    if (!spec.ok()) {
      std::cerr << "tessera: " << spec.status().message() << "\n";
      return 1;
    }
    std::cout << JobSpecToToml(*spec);
    return 0;
  }
  if (command == "provision") {
    if (args.size() != 1) {
      std::cerr << "tessera provision: takes no arguments, only flags (see tessera --help)\n";
      return 2;
    }
    for (const auto& [flag, text, list] :
         {std::tuple{"--coordinator-host", &provision_hosts, &provision.coordinator_hosts},
          std::tuple{"--workers", &provision_workers, &provision.workers},
          std::tuple{"--operators", &provision_operators, &provision.operators}}) {
      auto split = cli::SplitList(flag, *text);
      if (!split.ok()) {
        std::cerr << "tessera provision: " << split.status().message() << "\n";
        return 2;
      }
      *list = *split;
    }
    auto report = cli::Provision(provision);
    if (!report.ok()) {
      std::cerr << "tessera provision: " << report.status().message() << "\n";
      return 1;
    }
    std::cout << *report;
    return 0;
  }
  if (command == "devices" || command == "align") {
    Status local;
    if (command == "devices") {
      for (size_t start = 0; !extra_devices.empty() && start <= extra_devices.size();) {
        size_t comma = extra_devices.find(',', start);
        if (comma == std::string::npos) comma = extra_devices.size();
        if (comma > start) devices.extra_devices.push_back(extra_devices.substr(start, comma - start));
        start = comma + 1;
      }
      local = DevicesCommand(devices, std::cout);
    } else {
      if (!devices.model.empty()) align.model = devices.model;
      align.samples = static_cast<int>(samples);
      local = AlignCommand(align, std::cout);
    }
    if (!local.ok()) {
      std::cerr << "tessera " << command << ": " << local.message() << "\n";
      return 1;
    }
    return 0;
  }
  const char* from_environment = std::getenv("TESSERA_COORDINATOR");
  const std::string source =
      from_environment != nullptr && coordinator == from_environment ? "$TESSERA_COORDINATOR" : "--coordinator";
  auto address = ParseHostPort(source, coordinator, PortZero::kRefused);
  if (!address.ok()) {
    std::cerr << "tessera: " << address.status().message() << "\n";
    return 2;
  }
  auto tls = wire::LoadClientTls(tls_flags, *address, wire::kOperatorRole);
  if (!tls.ok()) {
    std::cerr << "tessera: " << tls.status().message() << "\n";
    return 2;
  }
  if (!admin_token_file.empty()) {
    auto token = ReadSecretFile("admin-token-file", admin_token_file);
    if (!token.ok()) {
      std::cerr << "tessera: " << token.status().message() << "\n";
      return 2;
    }
    tls->admin_token = *token;
  }
  auto channel = wire::MakeChannel(coordinator, *tls);
  if (!channel.ok()) {
    std::cerr << "tessera: " << channel.status().message() << "\n";
    return 2;
  }
  auto stub = v1::JobService::NewStub(*channel);
  Status result;
  if (command == "submit") {
    if (!need_argument("the job spec file")) return 2;
    result = cli::SubmitCommand(*stub, args[1], std::cout);
  } else if (command == "jobs") {
    result = cli::JobsCommand(*stub, std::cout);
  } else if (command == "status") {
    if (!need_argument("the job id")) return 2;
    result = cli::StatusCommand(*stub, args[1], std::cout);
  } else if (command == "watch") {
    if (!need_argument("the job id")) return 2;
    result = cli::WatchCommand(*stub, args[1], std::cout);
  } else if (command == "cancel") {
    if (!need_argument("the job id")) return 2;
    result = cli::CancelCommand(*stub, args[1], std::cout);
  } else if (command == "workers") {
    result = cli::WorkersCommand(*stub, std::cout);
  } else {
    std::cerr << "tessera: unknown command '" << command << "' (see tessera --help)\n";
    return 2;
  }
  if (!result.ok()) {
    std::cerr << "tessera: " << result.message() << "\n";
    return 1;
  }
  return 0;
}
