#include "proto/job_mapping.h"

#include <algorithm>
#include <climits>
#include <bitset>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <tuple>

#include "base/escape.h"
#include "core/data/idx.h"
#include "proto/update_envelope.h"

namespace tessera::wire {

bool IsTrainerName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
  });
}

namespace {

int Saturated(uint32_t value) { return static_cast<int>(std::min<uint32_t>(value, INT32_MAX)); }

// A double from the wire as a float: past float's range it is an infinity (a cast would be
// undefined), which the model's checks then refuse as out of range; NaN stays NaN.
float ToFloat(double value) {
  if (value > std::numeric_limits<float>::max()) return std::numeric_limits<float>::infinity();
  if (value < -std::numeric_limits<float>::max()) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(value);
}

LayerConfig ToLayerConfig(const v1::LayerSpec& spec) {
  LayerConfig layer;
  layer.type = spec.type();
  layer.name = spec.name();
  layer.out = Saturated(spec.out());
  layer.kernel = Saturated(spec.kernel());
  layer.stride = Saturated(spec.stride());
  layer.padding = Saturated(spec.padding());
  layer.groups = spec.groups() == 0 ? 1 : Saturated(spec.groups());
  layer.bias = spec.has_bias() ? spec.bias() : true;
  layer.window = Saturated(spec.window());
  if (spec.has_probability()) layer.probability = ToFloat(spec.probability());
  if (spec.has_epsilon()) layer.epsilon = ToFloat(spec.epsilon());
  if (spec.has_momentum()) layer.momentum = ToFloat(spec.momentum());
  layer.local = spec.local();
  for (const v1::LayerSpec& sub : spec.body()) layer.body.push_back(ToLayerConfig(sub));
  for (const v1::LayerSpec& sub : spec.shortcut()) layer.shortcut.push_back(ToLayerConfig(sub));
  return layer;
}

}  // namespace

PixelNormalisation FashionNormalisation(const v1::JobSpec& spec) {
  PixelNormalisation normalisation;
  if (spec.data().mean_size() == 1 && spec.data().std_size() == 1) {
    normalisation.mean = spec.data().mean(0);
    normalisation.std = spec.data().std(0);
  }
  return normalisation;
}

ModelConfig ToModelConfig(const v1::JobSpec& spec) {
  ModelConfig config;
  // Bounded by the wire's nesting limit; CreateModel refuses more than kMaxDeclaredLayers.
  for (const v1::LayerSpec& layer : spec.model().layers()) config.layers.push_back(ToLayerConfig(layer));
  if (!spec.model().name().empty()) config.name = spec.model().name();
  if (spec.model().hidden_size() > 0) {
    config.hidden.assign(spec.model().hidden().begin(), spec.model().hidden().end());
  }
  config.seed = spec.seed();
  const v1::InputShape& shape = spec.data().input_shape();
  if (shape.channels() > 0 && shape.rows() > 0 && shape.cols() > 0 && shape.classes() > 0) {
    config.channels = static_cast<int>(shape.channels());
    config.rows = static_cast<int>(shape.rows());
    config.cols = static_cast<int>(shape.cols());
    config.classes = static_cast<int>(shape.classes());
  }
  return config;
}

Result<PartitionConfig> ToPartitionConfig(const v1::JobSpec& spec) {
  const v1::PartitionSpec& p = spec.data().partition();
  PartitionConfig config;
  switch (p.kind()) {
    case v1::PARTITION_UNSPECIFIED:
    case v1::PARTITION_IID: config.kind = PartitionConfig::kIid; break;
    case v1::PARTITION_DIRICHLET: config.kind = PartitionConfig::kDirichlet; break;
    case v1::PARTITION_LABEL_QUANTITY: config.kind = PartitionConfig::kLabelQuantity; break;
    case v1::PARTITION_QUANTITY: config.kind = PartitionConfig::kQuantity; break;
    default:
      return InvalidArgumentError("spec.data.partition.kind " + v1::PartitionKind_Name(p.kind()) +
                                  " has no shared partition");
  }
  config.parties = p.parties();
  config.beta = p.beta() > 0 ? p.beta() : 0.5;
  config.labels_per_party = p.labels_per_party() > 0 ? p.labels_per_party() : 2;
  config.seed = p.seed();
  for (const v1::LabelSet& set : p.party_labels()) {
    config.party_labels.emplace_back(set.labels().begin(), set.labels().end());
  }
  return config;
}

namespace {

uint64_t RoundSeed(const v1::JobSpec& spec, uint32_t round, uint32_t party) {
  return spec.seed() * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(round) * 7919ull + party;
}

}  // namespace

ModelConfig ToTrainingModelConfig(const v1::JobSpec& spec, uint32_t round, uint32_t party) {
  ModelConfig config = ToModelConfig(spec);
  config.seed = RoundSeed(spec, round, party);
  return config;
}

TrainOptions ToTrainOptions(const v1::JobSpec& spec, uint32_t round, uint32_t party) {
  TrainOptions options;
  options.epochs = spec.local_epochs();
  options.batch_size = spec.batch_size();
  options.learning_rate = static_cast<float>(spec.optimizer().learning_rate());
  options.momentum = static_cast<float>(spec.optimizer().momentum());
  options.weight_decay = static_cast<float>(spec.optimizer().weight_decay());
  options.seed = RoundSeed(spec, round, party);
  if (spec.strategy() == "fedprox") options.proximal_mu = static_cast<float>(spec.proximal_mu());
  options.augment.horizontal_flip = spec.data().augment().horizontal_flip();
  options.augment.crop_padding = static_cast<int>(spec.data().augment().crop_padding());
  return options;
}

bool IsFashionMnist(const v1::JobSpec& spec) {
  return spec.data().dataset().empty() || spec.data().dataset() == "fashion-mnist";
}

int DatasetClasses(const v1::JobSpec& spec) {
  const uint32_t classes = spec.data().input_shape().classes();
  return classes > 0 && classes <= kMaxClasses ? static_cast<int>(classes) : 10;
}

Result<DataSource> ToDataSource(const v1::JobSpec& spec, std::string dir) {
  DataSource source;
  source.dir = std::move(dir);
  if (!spec.data().format().empty()) {
    ASSIGN_OR_RETURN(source.format, ParseDataFormat(spec.data().format()));
  }
  if (!spec.data().label_column().empty()) source.label_column = spec.data().label_column();
  source.mean.assign(spec.data().mean().begin(), spec.data().mean().end());
  source.std.assign(spec.data().std().begin(), spec.data().std().end());
  return source;
}

bool IsDatasetName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) return false;
  }
  return name.front() != '.' && name.front() != '-';
}

std::string JobStateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  if (name.rfind("JOB_", 0) == 0) name = name.substr(4);
  for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name.empty() ? "unknown" : name;
}

std::string DatasetDirectory(const v1::JobSpec& spec) {
  return spec.data().path().empty() ? std::string(kDefaultFashionMnistDir) : spec.data().path();
}

Result<std::vector<std::vector<int64_t>>> PartitionTrainingSet(const v1::JobSpec& spec, std::vector<uint8_t> labels) {
  const uint32_t max = spec.data().max_train_samples();
  if (max > 0 && max < labels.size()) labels.resize(max);
  ASSIGN_OR_RETURN(PartitionConfig config, ToPartitionConfig(spec));
  return PartitionIndices(labels, DatasetClasses(spec), config);
}

double MaxUpdateNorm(const v1::JobSpec& spec) {
  return spec.max_update_norm() > 0 ? spec.max_update_norm() : kDefaultMaxUpdateNorm;
}

int64_t CoordinatorModelCopies(const v1::JobSpec& spec) {
  if (spec.strategy() != "scaffold") return kCoordinatorModelCopies;
  const int64_t parties = std::min<int64_t>(spec.data().partition().parties(), kMaxParties);
  return kCoordinatorModelCopies + kScaffoldServerModelCopies + kScaffoldModelCopiesPerParty * parties;
}

double DefaultServerLearningRate(const std::string& strategy) {
  if (strategy == "fedavgm") return kDefaultFedAvgMLearningRate;
  if (strategy == "fedadam" || strategy == "fedyogi") return kDefaultAdamLearningRate;
  if (strategy == "fedadagrad") return kDefaultAdagradLearningRate;
  return 0;
}

bool ClipsToUpdateNorm(const v1::JobSpec& spec) { return spec.update_norm_policy() == "clip"; }

std::string SelectionPolicy(const v1::JobSpec& spec) {
  return spec.selection().policy().empty() ? "random" : spec.selection().policy();
}

double OverSelection(const v1::JobSpec& spec) {
  if (spec.selection().has_over_selection()) return spec.selection().over_selection();
  return SelectionPolicy(spec) == "random" ? 0 : kDefaultGuidedOverSelection;
}

double StragglerPenalty(const v1::JobSpec& spec) {
  return spec.selection().has_straggler_penalty() ? spec.selection().straggler_penalty() : kDefaultStragglerPenalty;
}

uint32_t SelectionCount(const v1::JobSpec& spec, size_t candidates) {
  // clients_per_round <= kMaxParties and over_selection <= 1: the product fits a uint32_t.
  // The small epsilon keeps 10 x 1.3 at 13 despite binary fractions.
  const double wanted = std::ceil(spec.clients_per_round() * (1 + std::clamp(OverSelection(spec), 0.0, kMaxOverSelection)) - 1e-9);
  const uint64_t count = std::max<uint64_t>(spec.clients_per_round(), static_cast<uint64_t>(wanted));
  return static_cast<uint32_t>(std::min<uint64_t>(count, candidates));
}

Result<int64_t> EstimateModelMemoryBytes(const v1::JobSpec& spec) {
  ASSIGN_OR_RETURN(int64_t parameters, CountParameters(ToModelConfig(spec)));
  int64_t bytes = 0;
  if (__builtin_mul_overflow(parameters, static_cast<int64_t>(sizeof(float)) * CoordinatorModelCopies(spec), &bytes)) {
    return InvalidArgumentError("model '" + spec.model().name() + "': " + std::to_string(parameters) +
                                " parameters are too many to hold");
  }
  return bytes;
}

}  // namespace tessera::wire
