// The job spec as it travels (v1::JobSpec) mapped onto core's configurations. Used by the
// coordinator (initial model, evaluation) and the worker (partition, local training) so that
// both read the spec the same way.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "core/data/dataset_source.h"
#include "core/data/partition.h"
#include "core/data/idx.h"
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "core/update_codec.h"
#include "tessera/v1/job.pb.h"

namespace tessera::wire {

ModelConfig ToModelConfig(const v1::JobSpec& spec);
// The model a worker trains for `round` and `party`: ToModelConfig's, seeded as the round's
// shuffle (ToTrainOptions), so that dropout's masks, drawn from the model's seed and step,
// differ between parties and rounds and repeat on a rerun. (Its weights come from the global
// model, not from the seed.)
ModelConfig ToTrainingModelConfig(const v1::JobSpec& spec, uint32_t round, uint32_t party);
// An external trainer's name as a job spec and `tessera-worker --trainer` give it:
// 1 to 64 characters from [a-z0-9._-].
bool IsTrainerName(std::string_view name);
Result<PartitionConfig> ToPartitionConfig(const v1::JobSpec& spec);
// Local training options for `round` (the seed varies with the round and the party so that
// shuffles differ between rounds but repeat exactly on a rerun).
// FedProx's proximal_mu is set for strategy "fedprox"; SCAFFOLD's control variates are the
// worker's to fill in (they come with the model download).
TrainOptions ToTrainOptions(const v1::JobSpec& spec, uint32_t round, uint32_t party);
// The dataset directory the spec names, or the default one.
std::string DatasetDirectory(const v1::JobSpec& spec);
// Whether the job trains on Fashion-MNIST (data.dataset "" or "fashion-mnist"), read by the
// IDX loader with its own statistics; any other dataset goes through core/data/dataset_source.h.
bool IsFashionMnist(const v1::JobSpec& spec);
// Fashion-MNIST's pixel normalisation for `spec`: its own statistics, or the job's data.mean /
// data.std (one value each) when it gives them.
PixelNormalisation FashionNormalisation(const v1::JobSpec& spec);
// The classes the job's model predicts: data.input_shape's, else Fashion-MNIST's 10.
int DatasetClasses(const v1::JobSpec& spec);
// How to read the job's dataset from `dir` (format, label column, normalisation).
Result<DataSource> ToDataSource(const v1::JobSpec& spec, std::string dir);
// A dataset's name as job specs and `tessera-coordinator --dataset` give it: 1 to 64 of
// [a-z0-9._-], not starting with '.' or '-'.
bool IsDatasetName(std::string_view name);
// The [data] checks of ValidateJobSpec, on their own.
Status ValidateDataSpec(const v1::DataSpec& data);

// "pending", "running", "succeeded", "failed", "cancelled": a job's state as every message,
// table and metric label shows it.
std::string JobStateName(v1::JobState state);
// Succeeded, failed or cancelled: a state a job never leaves.
inline bool JobEnded(v1::JobState state) {
  return state == v1::JOB_SUCCEEDED || state == v1::JOB_FAILED || state == v1::JOB_CANCELLED;
}

// The indices of the training set each party holds: `labels` (the whole training split's,
// in file order) cut to spec.data.max_train_samples, then split by the spec's partition. The
// coordinator and the workers compute it alike. Not for PARTITION_LOCAL_FILES.
Result<std::vector<std::vector<int64_t>>> PartitionTrainingSet(const v1::JobSpec& spec, std::vector<uint8_t> labels);

// Upper bounds of a job spec's numbers. Generous for real jobs on Fashion-MNIST; their point
// is that no field makes the coordinator or a worker allocate, loop or wait without limit.
inline constexpr uint32_t kMaxRounds = 100000;
inline constexpr uint32_t kMaxParties = 10000;            // also bounds clients_per_round
inline constexpr uint32_t kMaxRoundDeadlineMs = 7u * 24 * 3600 * 1000;  // a week
inline constexpr uint32_t kMaxLocalEpochs = 1000;
inline constexpr uint32_t kMaxBatchSize = 8192;
inline constexpr uint32_t kMaxRoundAttempts = 100;
inline constexpr uint32_t kMaxSamplesCut = 100000000;     // data.max_train_samples, max_test_samples
inline constexpr uint32_t kMaxClasses = 256;               // data.classes: labels are bytes
inline constexpr int kMaxNormalisationChannels = 65536;   // data.mean, data.std
inline constexpr uint32_t kMaxCropPadding = 16;            // data.augment.crop_padding
inline constexpr uint32_t kMaxInputDim = 65536;            // data.input_shape's channels, rows, cols
inline constexpr uint64_t kMaxSampleValues = 1u << 24;     // channels x rows x cols
inline constexpr double kMaxLearningRate = 100;           // optimizer.learning_rate
inline constexpr double kMaxWeightDecay = 1;
inline constexpr double kMaxBeta = 1e4;                   // data.partition.beta
inline constexpr uint64_t kMaxPartyLabels = 100000;       // data.partition.party_labels: labels in all
inline constexpr uint32_t kMaxLabelsPerParty = 256;       // at most the dataset's classes (checked with them)
inline constexpr int kMaxHiddenLayers = 16;               // model.hidden's length
inline constexpr uint32_t kMaxHiddenWidth = 65536;        // each of model.hidden
// The most samples an update may claim when workers bring their own files (the coordinator
// cannot know their size); with a shared partition, the party's size is the bound. With at
// most kMaxParties clients a round's weight sum stays far below 2^64.
inline constexpr uint64_t kMaxLocalFilesSamples = 1000000000;
// The coordinator holds a job's model several times over: the evaluation model's parameters
// and gradients, the committed model and its encoded chunks, the round's double-precision
// sums (two floats' worth), the next model, its encoding, and a strategy's state and its next
// value. A model's estimated memory is parameters x 4 bytes x this.
inline constexpr int64_t kCoordinatorModelCopies = 10;
// SCAFFOLD keeps a control variate per party besides the server's, and each round encodes a
// download per participant (model, c and its c_i, with their chunks): per party its variate
// and the next one, one round's change of it, and six for a download. Of the server's c: c,
// its next value, and the copy a round's aggregate bounds the clients' changes with.
inline constexpr int64_t kScaffoldModelCopiesPerParty = 9;
inline constexpr int64_t kScaffoldServerModelCopies = 3;
// proximal_mu (FedProx): the largest value a spec may set.
inline constexpr double kMaxProximalMu = 1000;
// SCAFFOLD bounds a client's control-variate change by its delta's norm over the learning rate
// (server/strategy/scaffold.cc): below this rate that bound could pass values a float cannot
// hold (max_update_norm 1e9 / 1e-6 is 1e15 per round, against float's 3.4e38).
inline constexpr double kMinScaffoldLearningRate = 1e-6;
inline constexpr int64_t kMaxModelMemoryBytes = int64_t{2} << 30;  // 2 GiB per job
// max_update_norm: the default, and the largest value a spec may set. Measured L2 norms of
// real Fashion-MNIST updates (a party of 6000 IID samples unless said): the demo
// (examples/fmnist-fedavg.toml, SimpleCNN, 2 epochs, lr 0.01) 3.3 in round 1 and 1.7 in
// round 2; NIID-Bench's IID baseline (10 epochs) 6.2; its Dirichlet(0.5) split 4.7 to 5.8;
// an MLP 200x200 with lr 0.1 for 5 epochs 20; the integration tests' small MLP jobs below 1.
// The default is 50 times the largest of these.
inline constexpr double kDefaultMaxUpdateNorm = 1000;
inline constexpr double kMaxUpdateNormLimit = 1e9;

// The update norm bound a job uses: spec.max_update_norm, or the default when it is 0.
double MaxUpdateNorm(const v1::JobSpec& spec);
// Whether an update beyond that bound is scaled down to it (update_norm_policy "clip")
// rather than refused.
bool ClipsToUpdateNorm(const v1::JobSpec& spec);

// The strategies a spec may name (each a server optimiser, server/strategy/), for messages.
inline constexpr char kStrategyNames[] = "fedavg, fedavgm, fedadam, fedyogi, fedadagrad, fedprox, fednova, scaffold";
// Their options' defaults (spec.server) and bounds. The adaptive optimisers' learning rates
// and tau were measured on Fashion-MNIST with SimpleCNN (docs/jobs/algorithms.md gives the runs): Flower's
// eta 0.1 with tau 1e-9 collapses the demo's job to chance; these train as well as FedAvg.
inline constexpr double kDefaultFedAvgMLearningRate = 1.0;
inline constexpr double kDefaultAdamLearningRate = 0.03;     // fedadam, fedyogi
inline constexpr double kDefaultAdagradLearningRate = 0.3;   // fedadagrad: v only grows
inline constexpr double kDefaultBeta1 = 0.9;
inline constexpr double kDefaultBeta2 = 0.99;
inline constexpr double kDefaultTau = 1e-3;
inline constexpr double kMaxServerLearningRate = 1000;
inline constexpr double kMaxTau = 1;
// spec.server.learning_rate's default for `strategy`; 0 for one without a server optimiser.
double DefaultServerLearningRate(const std::string& strategy);
// The aggregation rules (spec.aggregation.rule) and trimmed-mean's default cut per side.
inline constexpr char kAggregationRuleNames[] = "\"mean\", \"median\", \"trimmed-mean\" or \"krum\"";
inline constexpr double kDefaultTrimFraction = 0.2;
// The robust rules (median, trimmed-mean, krum) hold a copy of every accepted update until the
// round closes: clients_per_round x parameters x 4 bytes must fit within this, per job.
// SimpleCNN's 44,426 parameters (174 KiB) allow about 6000 clients a round.
inline constexpr int64_t kMaxRetainedUpdateBytes = int64_t{1} << 30;

// Client selection (spec.selection): the policies, and the share of extra clients a round may
// select beyond clients_per_round (Bonawitz et al. 2019 select 130% of the target).
inline constexpr char kSelectionPolicyNames[] = "\"random\", \"deadline\" or \"utility\"";
inline constexpr double kDefaultGuidedOverSelection = 0.3;  // "deadline" and "utility"
inline constexpr double kMaxOverSelection = 1;
// "utility": alpha of Oort's penalty on clients slower than the deadline (Lai et al. 2021 use 2).
inline constexpr double kDefaultStragglerPenalty = 2;
inline constexpr double kMaxStragglerPenalty = 10;
// spec.selection.policy, "random" when empty.
std::string SelectionPolicy(const v1::JobSpec& spec);
// spec.selection.over_selection, or the policy's default when unset: 0 for "random",
// kDefaultGuidedOverSelection for "deadline" and "utility".
double OverSelection(const v1::JobSpec& spec);
// spec.selection.straggler_penalty, or kDefaultStragglerPenalty when unset.
double StragglerPenalty(const v1::JobSpec& spec);
// How many of `candidates` ready clients a round selects: ceil(clients_per_round x (1 +
// OverSelection(spec))), at most `candidates`.
uint32_t SelectionCount(const v1::JobSpec& spec, size_t candidates);
// Asynchronous jobs (spec.async set; job.toml mode = "async"): FedBuff's options, their
// defaults and bounds (docs/jobs/algorithms.md). buffer_size defaults to min(10, concurrency),
// concurrency to clients_per_round.
inline constexpr uint32_t kDefaultAsyncBufferSize = 10;
inline constexpr uint32_t kDefaultMaxStaleness = 10;
inline constexpr double kDefaultStalenessExponent = 0.5;
inline constexpr double kMaxStalenessExponent = 10;
inline constexpr char kStalenessWeightingNames[] = "\"polynomial\" or \"constant\"";
bool IsAsync(const v1::JobSpec& spec);

// The number of model-sized copies the coordinator holds for `spec`: kCoordinatorModelCopies,
// plus kScaffoldModelCopiesPerParty per party and kScaffoldServerModelCopies for scaffold.
int64_t CoordinatorModelCopies(const v1::JobSpec& spec);

// The coordinator's estimated memory for the model `spec` names (parameters x 4 bytes x
// CoordinatorModelCopies), computed without building it. Errors as CountParameters.
Result<int64_t> EstimateModelMemoryBytes(const v1::JobSpec& spec);

// How the job's workers encode their delta (spec.compression; unset: float32), and top-k's
// fraction (0 for another encoding). Read on both sides: the worker encodes with them, the
// coordinator refuses a "delta" set in any other encoding and sizes top-k's pairs by the
// fraction. The spec must have passed ValidateJobSpec.
UpdateEncoding JobUpdateEncoding(const v1::JobSpec& spec);
double TopKFraction(const v1::JobSpec& spec);
// How the coordinator encodes the job's model versions for the workers
// (spec.compression.download; unset: float32): float32, float16, bfloat16 or int8. The spec
// must have passed ValidateJobSpec.
UpdateEncoding JobDownloadEncoding(const v1::JobSpec& spec);
// The encodings a spec may name, for messages.
inline constexpr char kEncodingNames[] = "\"float32\", \"float16\", \"bfloat16\", \"int8\" or \"topk\"";

// Semantic checks of a spec however it arrived (the CLI checks the TOML; the coordinator
// checks again, since any client may call it): every number within its range above, names
// from their lists, strings bounded, the model's estimated memory within
// kMaxModelMemoryBytes, options only where they apply (a server option of another strategy,
// an aggregation option of another rule), Krum only where n > 2f + 2 holds for a round of
// min_clients updates, a robust rule's retained updates within kMaxRetainedUpdateBytes, a
// compression that applies (top-k's fraction in (0, 1] and set for top-k alone; no compression
// with scaffold, of updates or downloads; no top-k with a robust rule; downloads dense), and the selection policy one of
// kSelectionPolicyNames with over_selection in [0, kMaxOverSelection] and straggler_penalty (for
// "utility" only) in [0, kMaxStragglerPenalty]. An asynchronous spec's options are in range and
// its strategy and rule fold a buffered mean (not fednova, scaffold or a robust rule; random
// selection, float32 updates, no federated evaluation). Errors name the field and say what was expected: "spec.rounds:
// expected ..., got ..."; strings from the spec appear escaped and cut.
Status ValidateJobSpec(const v1::JobSpec& spec);

}  // namespace tessera::wire
