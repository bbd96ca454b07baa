// tessera: the command line for federated jobs.
#include <google/protobuf/struct.pb.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "base/escape.h"
#include "tessera/config.h"

#include "base/flags.h"
#include "base/format.h"
#include "base/host_port.h"
#include "base/names.h"
#include "cli/devices_command.h"
#include "collectives/benchmark.h"
#include "cli/export_command.h"
#include "cli/job_client.h"
#include "cli/job_spec.h"
#include "cli/provision.h"
#include "proto/json.h"
#include "proto/record_bounds.h"
#include "proto/transport_security.h"

namespace {

const char kUsage[] = R"(tessera: launch federated jobs on a Tessera coordinator and watch their rounds.

Usage: tessera [--coordinator HOST:PORT] COMMAND [ARGS] [--json]
       tessera help COMMAND      (or tessera COMMAND --help): one command's use and flags

Commands:
)";

const char kUsageEnd[] = R"(
The coordinator's address comes from --coordinator, else $TESSERA_COORDINATOR, else
127.0.0.1:7070. The coordinator is verified over TLS (--tls-ca, or --tls-dir with an operator's
directory from `tessera provision`); the command line proves it is an operator with its
certificate (mutual TLS) or the admin token (--admin-token-file). Plaintext only with
--insecure, to a coordinator on loopback. --json prints the coordinator's replies as JSON
(proto3's JSON mapping of proto/tessera/v1; one object per line for watch).

Examples:
  tessera provision --out ./pki --coordinator-host coordinator.example.org --workers a,b,c --operators ops
  tessera provision --out ./pki --revoke b
  tessera --tls-dir ./pki/operators/ops submit examples/fmnist-fedavg.toml
  tessera watch job-1-3fa9c2
  tessera rounds job-1-3fa9c2 --round 3
  tessera workers --all
  tessera workers forget old-host-7
  tessera devices --model simplecnn
  tessera devices --model examples/declared-cnn.toml
  tessera align --model simplecnn --a cpu --b emu:ascend-910b
  tessera bench collectives --backends p2p,gloo --ranks 2,4 --max-bytes 16777216

Flags:
)";

// The flags every command that speaks to the coordinator takes.
const std::vector<std::string> kConnectionFlags = {"coordinator", "tls-dir", "tls-ca", "tls-cert", "tls-key",
                                                   "tls-server-name", "insecure", "insecure-force",
                                                   "admin-token-file"};

struct Command {
  const char* name;
  const char* synopsis;  // after "tessera NAME"
  const char* summary;   // one line or a few, for the command list
  std::vector<std::string> flags;
  bool remote;  // speaks to the coordinator
};

const std::vector<Command>& Commands() {
  static const std::vector<Command> commands = {
      {"submit", "JOB.toml", "check a job spec and submit it; prints the job's id", {"json"}, true},
      {"check", "JOB.toml", "check a job spec and print it as the coordinator will read it", {"json"}, false},
      {"jobs", "", "list jobs with their state, rounds and accuracy", {"json"}, true},
      {"status", "JOB", "one job: state, update encoding, every committed round (latency by\n"
                        "phase, update and model KiB on the wire)", {"json"}, true},
      {"rounds", "JOB", "every worker of each committed round (--round R: one round): outcome,\n"
                        "samples, download, compute and upload, update and model KiB; the slowest\n"
                        "worker named as the round's critical path, dropped stragglers marked", {"round", "json"}, true},
      {"trace", "JOB -o FILE", "the committed rounds (--round R: one round) as a Chrome / Perfetto trace:\n"
                               "a track for the coordinator and one per worker, spans per phase, on\n"
                               "the coordinator's clock (open it in ui.perfetto.dev or chrome://tracing)",
       {"round", "o"}, true},
      {"export", "JOB -o FILE.npz|FILE.onnx", "the job's global model (--round R: that round's, if its checkpoint is kept;\n"
                                    "0: the initial model) as a NumPy .npz keyed by parameter names, which\n"
                                    "are PyTorch's state_dict keys for the built-in models, or as an ONNX\n"
                                    "graph (opset 13) of the job's model",
       {"round", "o", "json"}, true},
      {"watch", "JOB", "follow a job live: one line per round (accuracy, loss, clients, latency\n"
                       "by phase, KiB on the wire), notes as they happen, then the final accuracy and a latency\n"
                       "summary; reconnects while the coordinator restarts, giving up after 5 minutes in\n"
                       "which no stream brought a new round or note, or answered and stayed open a minute;\n"
                       "exits 0 once the job has succeeded, 1 when it failed or was cancelled or the\n"
                       "coordinator did not come back",
       {"json"}, true},
      {"cancel", "JOB", "cancel a running job", {"json"}, true},
      {"delete", "JOB", "delete an ended job for good: its record, its rounds and its kept models\n"
                        "(the newest job is kept, so that job numbers are never given twice)", {"json"}, true},
      {"workers", "[forget NAME]", "the workers sending heartbeats: state, when last seen, rounds, device\n"
                      "(--all: also those that stopped). `forget NAME` forgets a worker gone for\n"
                      "good: it no longer counts toward the coordinator's --max-workers and its\n"
                      "name is unbound from its join token, so that the name joins again as a\n"
                      "new worker, with any token; refused while the worker is alive", {"all", "json"}, true},
      {"devices", "", "this node's devices, viable or not and why, with measured GEMM throughput\n"
                      "and bandwidth beside each profile's figures; with --model M, the\n"
                      "migration risk list of M on each device", {"model", "device", "json"}, false},
      {"bench", "collectives [FLAGS]", "allreduce time, algbw and busbw over message sizes and rank counts,\n"
                                       "ranks as processes on loopback, every result checked (its own flags:\n"
                                       "tessera bench collectives --help)", {}, false},
      {"align", "", "the same samples through two devices (--a, --b) with the same weights:\n"
                    "per-sample MAE, top-1 agreement, the worst 5%",
       {"model", "a", "b", "samples", "data-dir", "threshold", "json"}, false},
      {"provision", "", "the certificates of a deployment: a CA, the coordinator's certificate,\n"
                        "one per worker and per operator, each in a directory for --tls-dir;\n"
                        "--revoke NAME revokes one (see docs/SECURITY.md)", {"out", "coordinator-host", "workers", "operators", "revoke", "days", "json"}, false},
      {"help", "[COMMAND]", "this text, or one command's", {}, false},
      {"version", "", "the version of this build (also --version)", {}, false},
  };
  return commands;
}

const Command* FindCommand(const std::string& name) {
  for (const auto& c : Commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

std::string CommandList() {
  std::string out;
  for (const auto& c : Commands()) {
    std::string left = std::string("  ") + c.name + (*c.synopsis ? std::string(" ") + c.synopsis : "");
    if (left.size() < 21) left.resize(21, ' ');
    else left += "\n" + std::string(21, ' ');
    std::string summary = c.summary;
    for (size_t at = summary.find('\n'); at != std::string::npos; at = summary.find('\n', at + 1)) {
      summary.insert(at + 1, std::string(21, ' '));
    }
    out += left + summary + "\n";
  }
  return out;
}

std::string CommandUsage(const Command& c, const tessera::FlagSet& flags) {
  std::string out = std::string("Usage: tessera ") + c.name + (*c.synopsis ? std::string(" ") + c.synopsis : "") +
                    (c.flags.empty() ? "" : " [flags]") + "\n\n" + c.summary + "\n";
  if (!c.flags.empty()) out += "\nFlags:\n" + flags.Usage(c.flags);
  if (c.remote) out += "\nConnection flags:\n" + flags.Usage(kConnectionFlags);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  const char* from_environment = std::getenv("TESSERA_COORDINATOR");
  std::string coordinator = from_environment != nullptr ? from_environment : "127.0.0.1:7070";
  // `tessera bench collectives ...` hands the rest of the line to the benchmark's own flags;
  // `tessera bench --help` (a flag where the benchmark goes) is parsed as any command's.
  if (argc >= 3 && std::string(argv[1]) == "bench" && argv[2][0] != '-') {
    if (std::string(argv[2]) != "collectives") {
      std::cerr << "tessera bench: unknown benchmark '" << EscapeUntrusted(argv[2]) << "' (known: collectives)\n";
      return 2;
    }
    return collectives::CollectivesBenchmarkMain(argc - 2, argv + 2);
  }
  bool help = false;
  bool version = false;
  bool json = false;
  bool all = false;
  int64_t round = -1;
  DevicesOptions devices;
  AlignOptions align;
  std::string extra_devices;
  int64_t samples = align.samples;
  wire::TlsFlags tls_flags;
  std::string admin_token_file;
  cli::ProvisionOptions provision;
  std::string provision_hosts, provision_workers, provision_operators, provision_revoke;
  FlagSet flags;
  flags.String("coordinator", &coordinator, "the coordinator's address (HOST:PORT)");
  wire::DeclareTlsFlags(flags, &tls_flags, wire::TlsSide::kClient);
  flags.String("admin-token-file", &admin_token_file, "the coordinator's admin token, for an operator without a certificate");
  flags.Bool("json", &json, "print JSON: the coordinator's replies (one object per line for watch), or this node's report");
  flags.Bool("all", &all, "workers: also the workers that stopped sending heartbeats");
  flags.Int("round", &round, "rounds, trace: only this round; export: this round's model", IntRange{0, UINT32_MAX});
  std::string trace_file;  // -o: trace and export
  flags.String("o", &trace_file, "the file to write: trace (- for standard output), export (FILE.npz or FILE.onnx)");
  flags.String("model", &devices.model,
               "devices, align: a built-in model (simplecnn, mlp, mcmahan-cnn, resnet8) or a job file (.toml) "
               "whose model, declared layers included, is built for its data's shape");
  flags.String("device", &extra_devices, "devices: more device names to list, comma-separated (emu:FILE.toml)");
  flags.String("a", &align.device_a, "align: the reference device");
  flags.String("b", &align.device_b, "align: the device compared with it");
  flags.Int("samples", &samples, "align: how many test samples to compare", IntRange{1, 10000});
  flags.String("data-dir", &align.data_dir, "align: Fashion-MNIST directory (default: Debian's)");
  flags.Double("threshold", &align.divergence_threshold, "align: relative MAE past which a layer has diverged");
  flags.String("out", &provision.out_dir, "provision: the directory to write the deployment's certificates into");
  flags.String("coordinator-host", &provision_hosts, "provision: the coordinator's DNS names or IP addresses, comma-separated (localhost, 127.0.0.1 and ::1 are added)");
  flags.String("workers", &provision_workers, "provision: the workers' names, comma-separated (each certificate's CN)");
  flags.String("operators", &provision_operators, "provision: the operators' names, comma-separated");
  flags.String("revoke", &provision_revoke,
               "provision: workers or operators whose certificates to revoke, comma-separated (written to "
               "OUT/coordinator/crl.pem, which the coordinator rereads)");
  flags.Int("days", &provision.days, "provision: how long the certificates issued now are valid, in days (no longer than a kept CA)", IntRange{1, 3650});
  flags.Bool("version", &version, "print the version of this build");
  flags.Bool("help", &help, "show this help (with a command: that command's)");
  if (Status s = flags.Parse(argc, argv); !s.ok()) {
    std::cerr << "tessera: " << s.message() << "\n";
    return 2;
  }
  const auto& args = flags.positional();
  // "tessera version --help" is the command's help, as for every command.
  if (version || (!args.empty() && args[0] == "version" && !help)) {
    if (args.size() > (version ? 0u : 1u) || flags.Given().size() > (version ? 1u : 0u)) {
      std::cerr << "tessera: version takes no arguments or other flags\n";
      return 2;
    }
    std::cout << "tessera " << TESSERA_VERSION << "\n";
    return 0;
  }
  if (args.empty() || (args[0] == "help" && args.size() == 1)) {
    std::cout << kUsage << CommandList() << kUsageEnd << flags.Usage();
    return help || !args.empty() ? 0 : 2;
  }
  const bool help_command = args[0] == "help";
  if (help_command && args.size() > 2) {
    std::cerr << "tessera help: expected at most one command, got " << args.size() - 1 << "\n";
    return 2;
  }
  const std::string command = help_command ? args[1] : args[0];
  const Command* known = FindCommand(command);
  if (known == nullptr) {
    std::cerr << "tessera: unknown command '" << EscapeUntrusted(command, 64) << "' (tessera help lists them)\n";
    return 2;
  }
  if (help || help_command) {
    std::cout << CommandUsage(*known, flags);
    return 0;
  }
  // A flag the command does not read is refused, not ignored.
  for (const std::string& flag : flags.Given()) {
    const auto in = [&flag](const std::vector<std::string>& names) {
      return std::find(names.begin(), names.end(), flag) != names.end();
    };
    if (in(known->flags) || (known->remote && in(kConnectionFlags))) continue;
    std::cerr << "tessera " << command << ": --" << flag << " does not apply (tessera help " << command << ")\n";
    return 2;
  }
  auto need_arguments = [&](size_t n, const char* what) -> bool {
    if (args.size() != n + 1) {
      std::cerr << "tessera " << command << ": expected " << (n == 0 ? "no arguments" : what) << ", got "
                << args.size() - 1 << " (tessera help " << command << ")\n";
      return false;
    }
    return true;
  };
  // A job id or a worker's name is a name (base/names.h), as the coordinator takes it: anything
  // else is a typo, refused here rather than echoed back.
  auto need_name = [&](size_t at, const char* what, size_t max_bytes) -> bool {
    if (IsName(args[at], max_bytes)) return true;
    std::cerr << "tessera " << command << ": " << what << " " << QuoteUntrusted(args[at]) << ": expected 1 to "
              << max_bytes << " letters, digits, '-', '_' or '.'" << (max_bytes == kMaxJobIdBytes ? " (a job id such as job-1-3fa9c2)" : "")
              << "\n";
    return false;
  };
  const cli::PrintOptions print{json};
  if (command == "check") {
    if (!need_arguments(1, "one argument, the job spec file")) return 2;
    auto spec = ParseJobSpecFile(args[1]);
    if (!spec.ok()) {
      std::cerr << "tessera: " << spec.status().message() << "\n";
      return 1;
    }
    if (json) {
      std::cout << wire::ToJson(*spec) << "\n";
    } else {
      std::cout << JobSpecToToml(*spec);
    }
    return 0;
  }
  if (command == "provision") {
    if (!need_arguments(0, "")) return 2;
    for (const auto& [flag, text, list] :
         {std::tuple{"--coordinator-host", &provision_hosts, &provision.coordinator_hosts},
          std::tuple{"--workers", &provision_workers, &provision.workers},
          std::tuple{"--operators", &provision_operators, &provision.operators},
          std::tuple{"--revoke", &provision_revoke, &provision.revoke}}) {
      auto split = cli::SplitList(flag, *text);
      if (!split.ok()) {
        std::cerr << "tessera provision: " << split.status().message() << "\n";
        return 2;
      }
      *list = *split;
    }
    if (Status usage = cli::CheckProvisionOptions(provision); !usage.ok()) {
      std::cerr << "tessera provision: " << usage.message() << "\n";
      return 2;
    }
    auto report = cli::ProvisionIdentities(provision);
    if (!report.ok()) {
      std::cerr << "tessera provision: " << report.status().message() << "\n";
      return 1;
    }
    if (!json) {
      std::cout << report->Text();
      return 0;
    }
    // One object per identity.
    for (const cli::ProvisionedIdentity& entry : report->identities) {
      google::protobuf::Struct identity;
      auto& f = *identity.mutable_fields();
      f["identity"].set_string_value(entry.identity);
      f["dir"].set_string_value(entry.dir);
      f["made"].set_bool_value(entry.made);
      f["note"].set_string_value(entry.note);
      std::cout << wire::ToJson(identity) << "\n";
    }
    return 0;
  }
  if (command == "devices" || command == "align") {
    if (!need_arguments(0, "")) return 2;
    Status local;
    if (command == "devices") {
      auto extra = cli::SplitList("--device", extra_devices);  // an empty name is a typo
      if (!extra.ok()) {
        std::cerr << "tessera devices: " << extra.status().message() << "\n";
        return 2;
      }
      devices.extra_devices = *extra;
      devices.json = json;
      if (Status usage = CheckDevicesOptions(devices); !usage.ok()) {
        std::cerr << "tessera devices: " << usage.message() << "\n";
        return 2;
      }
      local = DevicesCommand(devices, std::cout);
    } else {
      if (!(align.divergence_threshold > 0) || !std::isfinite(align.divergence_threshold)) {  // a usage error
        std::cerr << "tessera align: --threshold: expected a positive finite number, got "
                  << FormatNumber(align.divergence_threshold) << "\n";
        return 2;
      }
      if (!devices.model.empty()) align.model = devices.model;
      align.samples = static_cast<int>(samples);
      align.json = json;
      local = AlignCommand(align, std::cout);
    }
    if (!local.ok()) {
      std::cerr << "tessera " << command << ": " << local.message() << "\n";
      return 1;
    }
    return 0;
  }
  if (command == "bench") {
    std::cerr << "tessera bench: expected a benchmark: tessera bench collectives [flags]\n";
    return 2;
  }
  if (command == "workers" && args.size() >= 2 && args[1] == "forget" && all) {
    std::cerr << "tessera workers forget: --all applies to the list (tessera workers --all); forget takes one "
                 "worker's name\n";
    return 2;
  }
  // The arguments of a command that speaks to the coordinator are checked before the
  // connection's settings: a usage error is said as one (exit 2), whatever else is missing.
  const bool forget = command == "workers" && args.size() >= 2 && args[1] == "forget";
  if (command == "submit") {
    if (!need_arguments(1, "one argument, the job spec file")) return 2;
  } else if (command == "jobs" || (command == "workers" && !forget)) {
    if (!need_arguments(0, "")) return 2;
  } else if (forget) {
    if (!need_arguments(2, "forget and one argument, the worker's name")) return 2;
    if (!need_name(2, "worker", kMaxNameBytes)) return 2;
  } else {  // status, rounds, trace, export, watch, cancel, delete: one job
    if (!need_arguments(1, "one argument, the job id")) return 2;
    if (!need_name(1, "job", kMaxJobIdBytes)) return 2;
  }
  if (command == "trace" && trace_file.empty()) {
    std::cerr << "tessera trace: give the file to write with -o FILE (- for standard output)\n";
    return 2;
  }
  if (command == "export") {
    if (trace_file.empty() || trace_file == "-") {
      std::cerr << "tessera export: give the file to write with -o FILE.npz or -o FILE.onnx\n";
      return 2;
    }
    if (Status path = cli::CheckExportPath(trace_file); !path.ok()) {
      std::cerr << "tessera export: " << path.message() << "\n";
      return 2;
    }
  }
  std::optional<uint32_t> only;  // --round, for rounds, trace and export
  if (round >= 0) only = static_cast<uint32_t>(round);
  const std::string source = from_environment != nullptr && coordinator == from_environment ? "$TESSERA_COORDINATOR"
                             : coordinator == "127.0.0.1:7070"                             ? "the default"
                                                                                           : "--coordinator";
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
  // A receive limit that takes the largest round's record whole (proto/record_bounds.h).
  auto channel = wire::MakeChannel(coordinator, *tls, wire::OperatorChannelArguments());
  if (!channel.ok()) {
    std::cerr << "tessera: " << channel.status().message() << "\n";
    return 2;
  }
  auto stub = v1::JobService::NewStub(*channel);
  Status result;
  if (command == "submit") {
    result = cli::SubmitCommand(*stub, args[1], std::cout, print);
  } else if (command == "jobs") {
    result = cli::JobsCommand(*stub, std::cout, print);
  } else if (command == "status") {
    result = cli::StatusCommand(*stub, args[1], std::cout, print);
  } else if (command == "rounds") {
    result = cli::RoundsCommand(*stub, args[1], only, std::cout, print);
  } else if (command == "trace") {
    if (trace_file == "-") {
      result = cli::TraceCommand(*stub, args[1], only, std::cout);
    } else {
      result = cli::TraceToFile(*stub, args[1], only, trace_file, std::cerr);
    }
  } else if (command == "export") {
    cli::ExportOptions export_options;
    export_options.job_id = args[1];
    export_options.round = only;
    export_options.path = trace_file;
    export_options.json = json;
    result = cli::ExportCommand(*stub, export_options, std::cout);
  } else if (command == "watch") {
    cli::WatchOptions watch;
    watch.print = print;
    watch.live = !json && ::isatty(STDOUT_FILENO);
    result = cli::WatchCommand(*stub, args[1], std::cout, watch);
  } else if (command == "cancel") {
    result = cli::CancelCommand(*stub, args[1], std::cout, print);
  } else if (command == "delete") {
    result = cli::DeleteCommand(*stub, args[1], std::cout, print);
  } else if (forget) {
    result = cli::ForgetWorkerCommand(*stub, args[2], std::cout, print);
  } else if (command == "workers") {
    result = cli::WorkersCommand(*stub, std::cout, all, print);
  }
  if (!result.ok()) {
    std::cerr << "tessera: " << cli::DescribeFailure(result, coordinator, source) << "\n";
    return 1;
  }
  return 0;
}
