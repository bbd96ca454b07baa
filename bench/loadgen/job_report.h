// The job a load run drives, and what its round records say.
//
// The spec keeps everything but the coordinator's own work as small as the job spec allows:
// every party takes part in every round (clients_per_round = min_clients = parties), one
// training sample per party by default, one local epoch of batch 1, a small evaluation set,
// and a single attempt per round, so that any refused or dropped client fails the job
// instead of being retried.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "base/status.h"
#include "tessera/v1/job_service.pb.h"

namespace tessera::loadgen {

struct JobSettings {
  std::string name = "loadgen";
  std::string model = "simplecnn";  // or "mlp"
  std::vector<uint32_t> hidden;     // mlp widths
  uint32_t rounds = 7;
  uint32_t clients = 10;            // clients_per_round = min_clients = partition parties
  std::string partition = "iid";    // or "local-files" (each worker brings its own files)
  uint32_t max_train_samples = 0;   // 0: one per party
  uint32_t max_test_samples = 100;  // the coordinator's evaluation after each round
  uint32_t local_epochs = 1;
  uint32_t batch_size = 1;
  uint32_t round_deadline_ms = 120000;
  uint64_t seed = 1;
  // How the model travels to the clients (JobSpec.compression.download): float32 when
  // unspecified, or float16, bfloat16 or int8.
  v1::Encoding download = v1::ENCODING_UNSPECIFIED;
};

v1::JobSpec MakeJobSpec(const JobSettings& settings);
// The model's parameter count, from the model the spec names (built once on the CPU).
Result<int64_t> ModelParameters(const v1::JobSpec& spec);

// Medians over the measured rounds, in milliseconds.
struct RoundMedians {
  double total = 0;         // PhaseLatency.total_ms: the round's start to its commit
  double interval = 0;      // between consecutive commits (committed_unix_ms)
  double selection = 0;
  double distribution = 0;  // tasks sent to the last download finished
  double compute = 0;       // median worker's compute, as the workers reported it
  double upload = 0;        // median upload, measured by the coordinator
  double straggler = 0;     // quorum reached to the round's close
  double aggregation = 0;
  double evaluation = 0;
  double commit = 0;
};

struct JobSummary {
  size_t rounds_committed = 0;
  size_t rounds_measured = 0;  // after the warm-up
  RoundMedians medians;
  // Every round committed on its first attempt with every selected client accepted, the
  // number selected being `expected_clients`, and the job SUCCEEDED.
  bool all_accepted = false;
  std::string problem;  // why not, when not
};

// Skips the first `warmup` rounds when more than that many committed.
JobSummary SummarizeJob(const v1::GetJobResponse& job, uint32_t warmup, uint32_t expected_clients);
// One line per committed round: clients accepted and every phase.
void PrintRounds(std::ostream& out, const v1::GetJobResponse& job);

}  // namespace tessera::loadgen
