// tessera: the command line for federated jobs.
#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <iostream>

#include "base/flags.h"
#include "cli/job_client.h"
#include "cli/job_spec.h"

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

The coordinator's address comes from --coordinator, else $TESSERA_COORDINATOR, else
127.0.0.1:7070.

Examples:
  tessera submit examples/fmnist-fedavg.toml
  tessera watch job-1-3fa9c2
  tessera workers

Flags:
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  std::string coordinator = std::getenv("TESSERA_COORDINATOR") ? std::getenv("TESSERA_COORDINATOR") : "127.0.0.1:7070";
  bool help = false;
  FlagSet flags;
  flags.String("coordinator", &coordinator, "the coordinator's address");
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
  auto channel = grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials());
  auto stub = v1::JobService::NewStub(channel);
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
