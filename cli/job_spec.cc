#include "cli/job_spec.h"

#include <sys/stat.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "base/escape.h"
#include "cli/job_spec_names.h"
#include "cli/job_spec_reader.h"
#include "proto/job_mapping.h"

namespace tessera {
namespace {

using namespace job_spec_internal;
using job_spec_names::KindName;
using job_spec_names::kPartitionKinds;

constexpr uint64_t kMaxUint64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
// The longest TOML syntax error shown as the parser wrote it.
constexpr size_t kMaxParseErrorChars = 256;

constexpr std::string_view kTopKeys[] = {
    "name", "strategy", "rounds", "clients_per_round", "min_clients", "round_deadline_s", "seed",
    "max_round_attempts", "max_update_norm", "update_norm_policy", "device", "fallback_device", "collective_backend",
    "proximal_mu", "model", "data", "train", "server", "aggregation", "compression", "selection", "evaluation", "mode", "async"};
constexpr std::string_view kEvaluationKeys[] = {"federated"};
constexpr std::string_view kModelKeys[] = {"name", "hidden", "trainer", "layers"};
constexpr std::string_view kLayerKeys[] = {"type",        "name",    "out",      "kernel", "stride", "padding",
                                           "groups",      "bias",    "window",   "probability", "epsilon",
                                           "momentum",    "local",   "body",     "shortcut"};
constexpr std::string_view kLayerTypes[] = {"conv2d",   "linear",          "relu",       "gelu",       "tanh",
                                            "sigmoid",  "max_pool",        "avg_pool",   "global_avg_pool",
                                            "batch_norm", "layer_norm",    "dropout",    "flatten",    "residual",
                                            "softmax_cross_entropy"};
// The layer types each key of a layer applies to (docs/JOBS.md, "Declared models"); "type"
// applies to all, "body" and "shortcut" are checked where they are read.
struct LayerKeyTypes {
  std::string_view key;
  std::initializer_list<std::string_view> types;
};
const LayerKeyTypes kLayerKeyTypes[] = {
    {"name", {"conv2d", "linear", "batch_norm", "layer_norm", "residual"}},
    {"out", {"conv2d", "linear"}},
    {"kernel", {"conv2d"}},
    {"stride", {"conv2d", "max_pool", "avg_pool"}},
    {"padding", {"conv2d"}},
    {"groups", {"conv2d"}},
    {"bias", {"conv2d", "linear"}},
    {"window", {"max_pool", "avg_pool"}},
    {"probability", {"dropout"}},
    {"epsilon", {"batch_norm", "layer_norm"}},
    {"momentum", {"batch_norm"}},
    {"local", {"batch_norm"}},
};
constexpr std::string_view kDataKeys[] = {"dataset", "format", "path", "label_column", "classes", "mean", "std",
                                           "max_train_samples", "max_test_samples", "partition", "augment"};
constexpr std::string_view kAugmentKeys[] = {"horizontal_flip", "crop_padding"};
constexpr std::string_view kDataFormats[] = {"idx", "cifar10", "npz", "csv"};
constexpr std::string_view kPartitionKeys[] = {"kind", "parties", "beta", "labels_per_party", "seed",
                                                "party_labels"};
constexpr std::string_view kTrainKeys[] = {"optimizer",     "local_epochs", "batch_size",
                                                                "learning_rate", "momentum",     "weight_decay"};

constexpr std::string_view kStrategies[] = {"fedavg",     "fedavgm", "fedadam", "fedyogi",
                                             "fedadagrad", "fedprox", "fednova", "scaffold"};
constexpr std::string_view kUpdateNormPolicies[] = {"refuse", "clip"};
constexpr std::string_view kModels[] = {"simplecnn", "mlp", "mcmahan-cnn", "resnet8", "declared"};
constexpr std::string_view kBackends[] = {"auto", "gloo", "mpi", "nccl", "p2p"};
constexpr std::string_view kOptimizers[] = {"sgd"};

// Reads the array of layer tables at `table`'s `key` ([[model.layers]], or a residual's
// body = [{...}, ...]) into `out`; `depth` 0 is the model, 1 a residual's path. Values are
// type-checked and bounded here; what depends on shapes is checked when the model is built.
Status ReadLayers(SpecReader& reader, const toml::table& table, const std::string& prefix, std::string_view key,
                  int depth, int* total, google::protobuf::RepeatedPtrField<v1::LayerSpec>* out) {
  const std::string dotted = Dotted(prefix, key);
  if (!reader.Has(table, prefix, key)) return Status::Ok();
  const toml::node* node = table.get(key);
  if (!node->is_array()) return reader.Error(dotted, "expected an array of layer tables ([[model.layers]])");
  const toml::array& array = *node->as_array();
  for (size_t i = 0; i < array.size(); ++i) {
    const std::string at = dotted + "[" + std::to_string(i) + "]";
    if (++*total > kMaxDeclaredLayers) {
      return reader.Error(dotted, "a model may have at most " + std::to_string(kMaxDeclaredLayers) + " layers in all");
    }
    const toml::table* layer = array[i].as_table();
    if (layer == nullptr) return reader.Error(dotted, "element " + std::to_string(i) + " must be a table of a layer's keys");
    RETURN_IF_ERROR(reader.CheckKeys(*layer, at, kLayerKeys));
    v1::LayerSpec* spec = out->Add();
    std::string type;
    RETURN_IF_ERROR(reader.String(*layer, at, "type", &type));
    if (!reader.Present(at + ".type")) {
      return reader.Error(at + ".type", "is required: one of " + JoinQuoted(kLayerTypes));
    }
    RETURN_IF_ERROR(CheckPlainText(reader, at + ".type", type, 32));
    type = Lowercase(type);
    RETURN_IF_ERROR(CheckOneOf(reader, at + ".type", type, kLayerTypes));
    for (const auto& [key, types] : kLayerKeyTypes) {
      if (!reader.Has(*layer, at, key) || std::find(types.begin(), types.end(), type) != types.end()) continue;
      std::string listed;
      for (std::string_view t : types) listed += (listed.empty() ? "" : ", ") + std::string(t);
      return reader.Error(Dotted(at, key), "applies to " + listed + " only; this layer is \"" + EscapeUntrusted(type) + "\"");
    }
    spec->set_type(type);
    std::string name;
    RETURN_IF_ERROR(reader.String(*layer, at, "name", &name));
    RETURN_IF_ERROR(CheckPlainText(reader, at + ".name", name, 64));
    spec->set_name(name);
    uint64_t u = 0;
    for (const auto& [field, setter] :
         std::initializer_list<std::pair<std::string_view, void (v1::LayerSpec::*)(uint32_t)>>{
             {"out", &v1::LayerSpec::set_out},         {"kernel", &v1::LayerSpec::set_kernel},
             {"stride", &v1::LayerSpec::set_stride},   {"padding", &v1::LayerSpec::set_padding},
             {"groups", &v1::LayerSpec::set_groups},   {"window", &v1::LayerSpec::set_window}}) {
      if (!reader.Has(*layer, at, field)) continue;
      RETURN_IF_ERROR(reader.Unsigned(*layer, at, field, field == "padding" ? 0 : 1, kMaxLayerWidth, &u));
      (spec->*setter)(static_cast<uint32_t>(u));
    }
    double value = 0;
    if (reader.Has(*layer, at, "probability")) {
      RETURN_IF_ERROR(reader.Number(*layer, at, "probability", &value));
      if (!(value >= 0 && value < 1)) return reader.Error(at + ".probability", "must be in [0, 1), got " + FormatExact(value));
      // Used as a float: a value just below 1 would round to 1 there.
      if (!(static_cast<float>(value) < 1.0f)) {
        return reader.Error(at + ".probability", "must stay below 1 as a float (at most 0.99999994), got " + FormatExact(value));
      }
      spec->set_probability(value);
    }
    if (reader.Has(*layer, at, "epsilon")) {
      RETURN_IF_ERROR(reader.Number(*layer, at, "epsilon", &value));
      if (!(value > 0 && value <= 1)) return reader.Error(at + ".epsilon", "must be in (0, 1], got " + FormatExact(value));
      // Used as a float: a value below float's range would round to 0 there.
      if (!(static_cast<float>(value) > 0.0f)) {
        return reader.Error(at + ".epsilon", "must stay above 0 as a float (at least about 1.4e-45), got " + FormatExact(value));
      }
      spec->set_epsilon(value);
    }
    if (reader.Has(*layer, at, "momentum")) {
      RETURN_IF_ERROR(reader.Number(*layer, at, "momentum", &value));
      if (!(value >= 0 && value <= 1)) return reader.Error(at + ".momentum", "must be in [0, 1], got " + FormatExact(value));
      spec->set_momentum(value);
    }
    if (reader.Has(*layer, at, "bias")) {
      bool bias = true;
      RETURN_IF_ERROR(reader.Bool(*layer, at, "bias", &bias));
      spec->set_bias(bias);
    }
    bool local = false;
    RETURN_IF_ERROR(reader.Bool(*layer, at, "local", &local));
    spec->set_local(local);
    const bool residual = type == "residual";
    for (std::string_view path : {std::string_view("body"), std::string_view("shortcut")}) {
      if (!reader.Has(*layer, at, path)) continue;
      if (!residual) return reader.Error(Dotted(at, path), "applies to type \"residual\" only");
      if (depth > 0) return reader.Error(Dotted(at, path), "a residual block cannot hold another residual block");
      RETURN_IF_ERROR(ReadLayers(reader, *layer, at, path, depth + 1, total,
                                 path == "body" ? spec->mutable_body() : spec->mutable_shortcut()));
    }
    if (residual && spec->body_size() == 0) {
      return reader.Error(at + ".body", "is required for a residual block: an array of layer tables");
    }
  }
  return Status::Ok();
}

// The key of the file that a wire check's "spec.FIELD" stands for: FIELD itself, or its name
// in the file ([train]'s keys are the wire's optimizer fields, round_deadline_s its
// round_deadline_ms), else the nearest enclosing key the file has (aggregation.rule written as
// `aggregation = "median"`, a defaulted field of a table that is there); "" when none is.
std::string FileKey(const SpecReader& reader, std::string field) {
  static constexpr std::pair<std::string_view, std::string_view> kRenamed[] = {
      {"optimizer.name", "train.optimizer"},          {"optimizer.learning_rate", "train.learning_rate"},
      {"optimizer.momentum", "train.momentum"},       {"optimizer.weight_decay", "train.weight_decay"},
      {"local_epochs", "train.local_epochs"},         {"batch_size", "train.batch_size"},
      {"round_deadline_ms", "round_deadline_s"}};
  for (const auto& [wire_name, file_name] : kRenamed) {
    if (field == wire_name) field = file_name;
  }
  while (!field.empty() && !reader.Present(field)) {
    const size_t cut = field.find_last_of(".[");
    field.resize(cut == std::string::npos ? 0 : cut);
  }
  return field;
}

Result<v1::JobSpec> ReadSpec(const toml::table& root, SpecReader& reader) {
  v1::JobSpec spec;
  uint64_t u = 0;

  // Top level.
  RETURN_IF_ERROR(reader.CheckKeys(root, "", kTopKeys));
  std::string name;
  RETURN_IF_ERROR(reader.String(root, "", "name", &name));
  if (!reader.Present("name")) return reader.Error("name", "is required: a name for the job");
  if (name.empty()) return reader.Error("name", "must not be empty");
  RETURN_IF_ERROR(CheckPlainText(reader, "name", name, 128));
  spec.set_name(name);

  std::string strategy = "fedavg";
  RETURN_IF_ERROR(reader.String(root, "", "strategy", &strategy));
  strategy = Lowercase(strategy);
  RETURN_IF_ERROR(CheckOneOf(reader, "strategy", strategy, kStrategies));
  spec.set_strategy(strategy);

  RETURN_IF_ERROR(reader.Unsigned(root, "", "rounds", 1, wire::kMaxRounds, &u));
  if (!reader.Present("rounds")) return reader.Error("rounds", "is required: the number of rounds to train");
  spec.set_rounds(static_cast<uint32_t>(u));

  uint64_t clients_per_round = 0, min_clients = 0;
  RETURN_IF_ERROR(reader.Unsigned(root, "", "clients_per_round", 1, wire::kMaxParties, &clients_per_round));
  RETURN_IF_ERROR(reader.Unsigned(root, "", "min_clients", 1, wire::kMaxParties, &min_clients));

  double deadline_s = 300.0;
  RETURN_IF_ERROR(reader.Number(root, "", "round_deadline_s", &deadline_s));
  const double max_deadline_s = static_cast<double>(wire::kMaxRoundDeadlineMs) / 1000.0;
  if (deadline_s < 0.001 || deadline_s > max_deadline_s) {
    return reader.Error("round_deadline_s", "must be between 0.001 and " + FormatExact(max_deadline_s) +
                                                " seconds, got " + FormatExact(deadline_s));
  }
  spec.set_round_deadline_ms(static_cast<uint32_t>(std::llround(deadline_s * 1000.0)));

  u = 0;
  RETURN_IF_ERROR(reader.Unsigned(root, "", "seed", 0, kMaxUint64, &u));
  spec.set_seed(u);
  u = 3;
  RETURN_IF_ERROR(reader.Unsigned(root, "", "max_round_attempts", 1, wire::kMaxRoundAttempts, &u));
  spec.set_max_round_attempts(static_cast<uint32_t>(u));
  double max_update_norm = wire::kDefaultMaxUpdateNorm;
  RETURN_IF_ERROR(reader.Number(root, "", "max_update_norm", &max_update_norm));
  if (!(max_update_norm > 0.0 && max_update_norm <= wire::kMaxUpdateNormLimit)) {
    return reader.Error("max_update_norm", "must be > 0 and at most " + FormatExact(wire::kMaxUpdateNormLimit) +
                                               ", got " + FormatExact(max_update_norm));
  }
  spec.set_max_update_norm(max_update_norm);
  std::string norm_policy = "refuse";
  RETURN_IF_ERROR(reader.String(root, "", "update_norm_policy", &norm_policy));
  norm_policy = Lowercase(norm_policy);
  RETURN_IF_ERROR(CheckOneOf(reader, "update_norm_policy", norm_policy, kUpdateNormPolicies));
  spec.set_update_norm_policy(norm_policy);

  for (const char* key : {"device", "fallback_device"}) {
    std::string device = "cpu";
    RETURN_IF_ERROR(reader.String(root, "", key, &device));
    if (device.empty()) return reader.Error(key, "must not be empty (for example \"cpu\")");
    // The classes the coordinator's ValidateJobSpec takes (proto/job_mapping.cc).
    if (device != "cpu" && device != "cuda" && device != "xrt" && device.rfind("emu:", 0) != 0) {
      return reader.Error(key, "expected a device class (\"cpu\", \"cuda\", \"xrt\" or \"emu:PROFILE\"), found \"" +
                                   EscapeUntrusted(device) + "\"");
    }
    // "emu:" alone names no profile: a typo the coordinator would record as the job's device.
    // (A fallback is held to a built-in profile's name by wire::ValidateJobSpec, further on.)
    if (device == "emu:" && std::string_view(key) == "device") {
      return reader.Error(key, "expected emu: and a profile's name (emu:PROFILE, such as \"emu:edge-npu\"; "
                               "tessera devices lists the built-in profiles), found \"emu:\"");
    }
    if (std::string_view(key) == "device") {
      spec.set_device(device);
    } else {
      spec.set_fallback_device(device);
    }
  }

  std::string backend = "auto";
  RETURN_IF_ERROR(reader.String(root, "", "collective_backend", &backend));
  backend = Lowercase(backend);
  RETURN_IF_ERROR(CheckOneOf(reader, "collective_backend", backend, kBackends));
  spec.set_collective_backend(backend);

  // [model]
  ASSIGN_OR_RETURN(const toml::table* model, reader.Table(root, "", "model"));
  if (model == nullptr) return reader.Error("model", "is required: a [model] table with a name");
  RETURN_IF_ERROR(reader.CheckKeys(*model, "model", kModelKeys));
  std::string model_name;
  RETURN_IF_ERROR(reader.String(*model, "model", "name", &model_name));
  const bool declared = reader.Has(*model, "model", "layers");
  if (declared && !reader.Present("model.name")) model_name = "declared";
  if (!reader.Present("model.name") && !declared) {
    return reader.Error("model.name", "is required: one of " + JoinQuoted(kModels) + ", or [[model.layers]]");
  }
  model_name = Lowercase(model_name);
  if (declared && model_name != "declared") {
    return reader.Error("model.layers", "declares a model of its own: leave model.name out (or \"declared\"), not \"" +
                                            EscapeUntrusted(model_name) + "\"");
  }
  if (!declared && model_name == "declared") {
    return reader.Error("model.name", "\"declared\" needs its layers: [[model.layers]] tables");
  }
  int layer_total = 0;
  RETURN_IF_ERROR(ReadLayers(reader, *model, "model", "layers", 0, &layer_total, spec.mutable_model()->mutable_layers()));
  RETURN_IF_ERROR(CheckOneOf(reader, "model.name", model_name, kModels));
  spec.mutable_model()->set_name(model_name);
  std::vector<uint64_t> hidden;
  RETURN_IF_ERROR(reader.UnsignedArray(*model, "model", "hidden", 1, wire::kMaxHiddenWidth, &hidden));
  if (hidden.size() > static_cast<size_t>(wire::kMaxHiddenLayers)) {
    return reader.Error("model.hidden", "must have at most " + std::to_string(wire::kMaxHiddenLayers) +
                                            " hidden layers, got " + std::to_string(hidden.size()));
  }
  if (!hidden.empty() && model_name != "mlp") {
    return reader.Error("model.hidden", "applies to model \"mlp\" only, not \"" + EscapeUntrusted(model_name) + "\"");
  }
  for (uint64_t width : hidden) spec.mutable_model()->add_hidden(static_cast<uint32_t>(width));
  std::string trainer;
  RETURN_IF_ERROR(reader.String(*model, "model", "trainer", &trainer));
  spec.mutable_model()->set_trainer(trainer);  // checked with the rest by wire::ValidateJobSpec

  // [evaluation]
  ASSIGN_OR_RETURN(const toml::table* evaluation, reader.Table(root, "", "evaluation"));
  if (evaluation != nullptr) {
    RETURN_IF_ERROR(reader.CheckKeys(*evaluation, "evaluation", kEvaluationKeys));
    bool federated = false;
    RETURN_IF_ERROR(reader.Bool(*evaluation, "evaluation", "federated", &federated));
    spec.mutable_evaluation()->set_federated(federated);
  }

  // [data] and [data.partition]
  ASSIGN_OR_RETURN(const toml::table* data, reader.Table(root, "", "data"));
  const toml::table empty;
  if (data == nullptr) data = &empty;
  RETURN_IF_ERROR(reader.CheckKeys(*data, "data", kDataKeys));
  v1::DataSpec* data_spec = spec.mutable_data();
  std::string dataset = "fashion-mnist";
  RETURN_IF_ERROR(reader.String(*data, "data", "dataset", &dataset));
  dataset = Lowercase(dataset);
  const bool fashion = dataset == "fashion-mnist";
  if (!wire::IsDatasetName(dataset)) {
    return reader.Error("data.dataset", "expected \"fashion-mnist\" or the name of a dataset the coordinator has "
                                        "(1 to 64 of [a-z0-9._-])");
  }
  data_spec->set_dataset(dataset);
  std::string format;
  RETURN_IF_ERROR(reader.String(*data, "data", "format", &format));
  format = Lowercase(format);
  if (!format.empty()) RETURN_IF_ERROR(CheckOneOf(reader, "data.format", format, kDataFormats));
  if (fashion && !format.empty() && format != "idx") {
    return reader.Error("data.format", "fashion-mnist is \"idx\", found \"" + EscapeUntrusted(format) + "\"");
  }
  if (!fashion && format.empty()) {
    return reader.Error("data.format", "is required for dataset \"" + dataset + "\": one of " + JoinQuoted(kDataFormats));
  }
  data_spec->set_format(fashion ? std::string() : format);
  std::string path;
  RETURN_IF_ERROR(reader.String(*data, "data", "path", &path));
  RETURN_IF_ERROR(CheckPlainText(reader, "data.path", path, 4096));
  data_spec->set_path(path);
  std::string label_column;
  RETURN_IF_ERROR(reader.String(*data, "data", "label_column", &label_column));
  if (reader.Present("data.label_column") && format != "csv") {
    return reader.Error("data.label_column", "applies to data.format \"csv\" only");
  }
  RETURN_IF_ERROR(CheckPlainText(reader, "data.label_column", label_column, 64));
  data_spec->set_label_column(label_column);
  u = 0;
  RETURN_IF_ERROR(reader.Unsigned(*data, "data", "classes", 2, wire::kMaxClasses, &u));
  if (fashion && reader.Present("data.classes") && u != 10) {
    return reader.Error("data.classes", "fashion-mnist has 10 classes, got " + std::to_string(u));
  }
  data_spec->set_classes(fashion ? 0 : static_cast<uint32_t>(u));
  std::vector<double> mean, std_dev;
  RETURN_IF_ERROR(reader.NumberArray(*data, "data", "mean", wire::kMaxNormalisationChannels, &mean));
  RETURN_IF_ERROR(reader.NumberArray(*data, "data", "std", wire::kMaxNormalisationChannels, &std_dev));
  if (mean.size() != std_dev.size()) {
    return reader.Error(reader.Present("data.std") ? "data.std" : "data.mean",
                        "data.mean and data.std need one value each per channel (or one for all): " +
                            std::to_string(mean.size()) + " means, " + std::to_string(std_dev.size()) + " deviations");
  }
  if (fashion && mean.size() > 1) {
    return reader.Error("data.mean", "fashion-mnist has one channel: give one mean and one std (or none, for its own "
                                     "statistics), got " + std::to_string(mean.size()));
  }
  for (size_t i = 0; i < mean.size(); ++i) {
    if (!(std_dev[i] > 0)) {
      return reader.Error("data.std[" + std::to_string(i) + "]", "must be positive, got " + FormatExact(std_dev[i]));
    }
    // Stored as float: a value beyond float's range is refused here, with the value given,
    // rather than by the wire check as "inf".
    for (const auto& [key, value] : {std::pair{"data.mean", mean[i]}, std::pair{"data.std", std_dev[i]}}) {
      if (std::fabs(value) > std::numeric_limits<float>::max()) {
        return reader.Error(std::string(key) + "[" + std::to_string(i) + "]",
                            "must be within float's range (about 3.4e38), got " + FormatExact(value));
      }
    }
    // A std that is positive as a double can be subnormal or 0 as the float it is stored as,
    // and then has no finite reciprocal.
    if (!std::isnormal(static_cast<float>(std_dev[i]))) {
      return reader.Error("data.std[" + std::to_string(i) + "]",
                          "must be at least about 1.2e-38 (float's smallest normal number, so that 1/std is finite), "
                          "got " + FormatExact(std_dev[i]));
    }
    data_spec->add_mean(static_cast<float>(mean[i]));
    data_spec->add_std(static_cast<float>(std_dev[i]));
  }
  ASSIGN_OR_RETURN(const toml::table* augment, reader.Table(*data, "data", "augment"));
  if (augment != nullptr) {
    RETURN_IF_ERROR(reader.CheckKeys(*augment, "data.augment", kAugmentKeys));
    bool flip = false;
    RETURN_IF_ERROR(reader.Bool(*augment, "data.augment", "horizontal_flip", &flip));
    u = 0;
    RETURN_IF_ERROR(reader.Unsigned(*augment, "data.augment", "crop_padding", 0, wire::kMaxCropPadding, &u));
    data_spec->mutable_augment()->set_horizontal_flip(flip);
    data_spec->mutable_augment()->set_crop_padding(static_cast<uint32_t>(u));
  }
  u = 0;
  RETURN_IF_ERROR(reader.Unsigned(*data, "data", "max_train_samples", 0, wire::kMaxSamplesCut, &u));
  data_spec->set_max_train_samples(static_cast<uint32_t>(u));
  u = 0;
  RETURN_IF_ERROR(reader.Unsigned(*data, "data", "max_test_samples", 0, wire::kMaxSamplesCut, &u));
  data_spec->set_max_test_samples(static_cast<uint32_t>(u));

  ASSIGN_OR_RETURN(const toml::table* partition, reader.Table(*data, "data", "partition"));
  if (partition == nullptr) {
    return reader.Error("data.partition", "is required: a [data.partition] table with at least 'parties'");
  }
  RETURN_IF_ERROR(reader.CheckKeys(*partition, "data.partition", kPartitionKeys));
  v1::PartitionSpec* partition_spec = data_spec->mutable_partition();
  std::string kind = "iid";
  RETURN_IF_ERROR(reader.String(*partition, "data.partition", "kind", &kind));
  kind = Lowercase(kind);
  const KindName* found = std::find_if(std::begin(kPartitionKinds), std::end(kPartitionKinds),
                                       [&](const KindName& k) { return k.name == kind; });
  if (found == std::end(kPartitionKinds)) {
    return reader.Error("data.partition.kind", "expected one of \"iid\", \"dirichlet\", \"label-quantity\", "
                                               "\"quantity\", \"local-files\", found \"" + EscapeUntrusted(kind) + "\"");
  }
  partition_spec->set_kind(found->kind);
  u = 0;
  RETURN_IF_ERROR(reader.Unsigned(*partition, "data.partition", "parties", 1, wire::kMaxParties, &u));
  if (!reader.Present("data.partition.parties")) {
    return reader.Error("data.partition.parties", "is required: the number of parties the data is split among");
  }
  const uint64_t parties = u;
  partition_spec->set_parties(static_cast<uint32_t>(parties));
  // A key of one kind on another is refused, not ignored.
  if (reader.Has(*partition, "data.partition", "beta") && found->kind != v1::PARTITION_DIRICHLET &&
      found->kind != v1::PARTITION_QUANTITY) {
    return reader.Error("data.partition.beta", "applies to kinds \"dirichlet\" and \"quantity\" only, found kind \"" +
                                                   EscapeUntrusted(kind) + "\"");
  }
  if (reader.Has(*partition, "data.partition", "labels_per_party") && found->kind != v1::PARTITION_LABEL_QUANTITY) {
    return reader.Error("data.partition.labels_per_party",
                        "applies to kind \"label-quantity\" only, found kind \"" + EscapeUntrusted(kind) + "\"");
  }
  double beta = 0.5;
  RETURN_IF_ERROR(reader.Number(*partition, "data.partition", "beta", &beta));
  if (!(beta >= kMinBeta && beta <= wire::kMaxBeta)) {
    return reader.Error("data.partition.beta", "must be at least " + FormatExact(kMinBeta) +
                                                   " (no smaller beta skews more) and at most " +
                                                   FormatExact(wire::kMaxBeta) + ", got " +
                                                   FormatExact(beta));
  }
  partition_spec->set_beta(beta);
  u = 2;
  // At most the classes: Fashion-MNIST's 10, data.classes, or (inferred at submit) 256 here.
  const uint64_t classes = fashion ? 10 : (data_spec->classes() ? data_spec->classes() : wire::kMaxClasses);
  RETURN_IF_ERROR(reader.Unsigned(*partition, "data.partition", "labels_per_party", 1, classes, &u));
  partition_spec->set_labels_per_party(static_cast<uint32_t>(u));
  if (partition->contains("party_labels") && found->kind != v1::PARTITION_LABEL_QUANTITY) {
    return reader.Error("data.partition.party_labels", "is for kind \"label-quantity\" only, found kind \"" + EscapeUntrusted(kind) + "\"");
  }
  std::vector<std::vector<uint64_t>> party_labels;
  RETURN_IF_ERROR(reader.UnsignedArrays(*partition, "data.partition", "party_labels", parties, 0, classes - 1,
                                        &party_labels));
  if (reader.Present("data.partition.party_labels")) {
    if (party_labels.size() != parties) {
      return reader.Error("data.partition.party_labels", "expected one array of labels per party (" +
                                                             std::to_string(parties) + "), got " +
                                                             std::to_string(party_labels.size()));
    }
    if (!reader.Present("data.partition.labels_per_party")) {
      partition_spec->set_labels_per_party(static_cast<uint32_t>(party_labels[0].size()));
    }
    for (size_t p = 0; p < party_labels.size(); ++p) {
      const std::string field = "data.partition.party_labels[" + std::to_string(p) + "]";
      const std::vector<uint64_t>& set = party_labels[p];
      if (set.empty()) return reader.Error(field, "expected at least 1 label, got none");
      if (set.size() != partition_spec->labels_per_party()) {
        return reader.Error(field, "expected " + std::to_string(partition_spec->labels_per_party()) +
                                       " labels (labels_per_party), got " + std::to_string(set.size()));
      }
      std::vector<bool> seen(classes, false);  // labels are below classes (read above)
      for (uint64_t label : set) {
        if (seen[label]) return reader.Error(field, "label " + std::to_string(label) + " appears twice");
        seen[label] = true;
      }
      v1::LabelSet* labels = partition_spec->add_party_labels();
      for (uint64_t label : set) labels->add_labels(static_cast<uint32_t>(label));
    }
  }
  u = spec.seed();
  RETURN_IF_ERROR(reader.Unsigned(*partition, "data.partition", "seed", 0, kMaxUint64, &u));
  partition_spec->set_seed(u);
  // Each worker reads its share of a shared partition from data.path (Fashion-MNIST has a
  // default directory; "local-files" reads each worker's --data-dir).
  if (!fashion && found->kind != v1::PARTITION_LOCAL_FILES && path.empty()) {
    return reader.Error("data.path", "is required for dataset \"" + dataset + "\" with partition kind \"" + kind +
                                         "\": the workers' directory of it (only kind \"local-files\" reads each "
                                         "worker's own --data-dir instead)");
  }
  // A shared partition cuts the first max_train_samples among the parties; "local-files"
  // cuts each worker's own files to that many.
  if (found->kind != v1::PARTITION_LOCAL_FILES && data_spec->max_train_samples() != 0 &&
      data_spec->max_train_samples() < parties) {
    return reader.Error("data.max_train_samples", std::to_string(data_spec->max_train_samples()) +
                                                      " samples cannot be split among " + std::to_string(parties) +
                                                      " parties");
  }

  // Participation, now that the number of parties is known.
  if (!reader.Present("clients_per_round")) clients_per_round = parties;
  if (clients_per_round > parties) {
    return reader.Error("clients_per_round", "must be at most data.partition.parties (" + std::to_string(parties) +
                                                 "), got " + std::to_string(clients_per_round));
  }
  if (!reader.Present("min_clients")) min_clients = clients_per_round;
  if (min_clients > clients_per_round) {
    return reader.Error("min_clients", "must be at most clients_per_round (" + std::to_string(clients_per_round) +
                                           "), got " + std::to_string(min_clients));
  }
  spec.set_clients_per_round(static_cast<uint32_t>(clients_per_round));
  spec.set_min_clients(static_cast<uint32_t>(min_clients));

  // [train]
  ASSIGN_OR_RETURN(const toml::table* train, reader.Table(root, "", "train"));
  if (train == nullptr) train = &empty;
  RETURN_IF_ERROR(reader.CheckKeys(*train, "train", kTrainKeys));
  v1::OptimizerSpec* optimizer = spec.mutable_optimizer();
  std::string optimizer_name = "sgd";
  RETURN_IF_ERROR(reader.String(*train, "train", "optimizer", &optimizer_name));
  optimizer_name = Lowercase(optimizer_name);
  RETURN_IF_ERROR(CheckOneOf(reader, "train.optimizer", optimizer_name, kOptimizers));
  optimizer->set_name(optimizer_name);
  u = 1;
  RETURN_IF_ERROR(reader.Unsigned(*train, "train", "local_epochs", 1, wire::kMaxLocalEpochs, &u));
  spec.set_local_epochs(static_cast<uint32_t>(u));
  u = 64;
  RETURN_IF_ERROR(reader.Unsigned(*train, "train", "batch_size", 1, wire::kMaxBatchSize, &u));
  spec.set_batch_size(static_cast<uint32_t>(u));
  double learning_rate = 0.01, momentum = 0.9, weight_decay = 0.0;
  RETURN_IF_ERROR(reader.Number(*train, "train", "learning_rate", &learning_rate));
  if (!(learning_rate > 0.0 && learning_rate <= wire::kMaxLearningRate)) {
    return reader.Error("train.learning_rate", "must be > 0 and at most " + FormatExact(wire::kMaxLearningRate) +
                                                   ", got " + FormatExact(learning_rate));
  }
  RETURN_IF_ERROR(reader.Number(*train, "train", "momentum", &momentum));
  if (!(momentum >= 0.0 && momentum < 1.0)) {
    return reader.Error("train.momentum", "must be in [0, 1), got " + FormatExact(momentum));
  }
  // Trained with as a float: a value just below 1 would round to 1 there.
  if (!(static_cast<float>(momentum) < 1.0f)) {
    return reader.Error("train.momentum", "must stay below 1 as a float (at most 0.99999994), got " +
                                              FormatExact(momentum));
  }
  RETURN_IF_ERROR(reader.Number(*train, "train", "weight_decay", &weight_decay));
  if (!(weight_decay >= 0.0 && weight_decay <= wire::kMaxWeightDecay)) {
    return reader.Error("train.weight_decay", "must be in [0, " + FormatExact(wire::kMaxWeightDecay) +
                                                  "], got " + FormatExact(weight_decay));
  }
  optimizer->set_learning_rate(learning_rate);
  optimizer->set_momentum(momentum);
  optimizer->set_weight_decay(weight_decay);

  RETURN_IF_ERROR(ReadServer(root, reader, &spec));
  RETURN_IF_ERROR(ReadAggregation(root, reader, &spec));
  RETURN_IF_ERROR(ReadCompression(root, reader, &spec));
  RETURN_IF_ERROR(ReadSelection(root, reader, &spec));
  RETURN_IF_ERROR(ReadAsync(root, reader, &spec));
  // proximal_mu: FedProx's, and only FedProx's.
  double proximal_mu = 0.01;
  RETURN_IF_ERROR(reader.Number(root, "", "proximal_mu", &proximal_mu));
  if (spec.strategy() == "fedprox") {
    if (!(proximal_mu > 0.0 && proximal_mu <= wire::kMaxProximalMu)) {
      return reader.Error("proximal_mu", "must be > 0 and at most " + FormatExact(wire::kMaxProximalMu) +
                                             ", got " + FormatExact(proximal_mu));
    }
    spec.set_proximal_mu(proximal_mu);
  } else if (reader.Present("proximal_mu")) {
    return reader.Error("proximal_mu", "applies to strategy \"fedprox\" only; strategy is \"" + EscapeUntrusted(spec.strategy()) + "\"");
  }
  if (spec.strategy() == "scaffold" && partition_spec->kind() == v1::PARTITION_LOCAL_FILES) {
    return reader.Error("data.partition.kind", "strategy \"scaffold\" needs a shared partition (it keeps a control "
                                               "variate per party); \"local-files\" seats any number of clients");
  }
  // What the keys cannot say one by one (the model's estimated memory, ...), as the
  // coordinator will check it.
  if (Status valid = wire::ValidateJobSpec(spec); !valid.ok()) {
    const std::string& message = valid.message();
    if (message.rfind("spec.", 0) != 0 || message.find(':') == std::string::npos) {
      return InvalidArgumentError(reader.Where("") + ": " + message);
    }
    const std::string key = FileKey(reader, message.substr(5, message.find(':') - 5));
    if (key.empty()) return InvalidArgumentError(reader.Where("") + ": " + message);
    const bool same = message.compare(5, key.size() + 1, key + ":") == 0;
    return InvalidArgumentError(reader.Where(key) + ": " + (same ? "" : "key '" + key + "': ") + message);
  }
  return spec;
}

}  // namespace

Result<v1::JobSpec> ParseJobSpecString(std::string_view text, std::string_view source_name) {
  SpecReader reader(source_name);
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& error) {
    // toml++ quotes what it saw ("saw '...'", a key redefined) as it is: a character that
    // reorders or hides text, or a long key, is escaped and cut as any value in a message.
    const std::string_view description = error.description();
    return InvalidArgumentError(reader.At(error.source().begin) + ": " +
                                (description.size() <= kMaxParseErrorChars && !HasHiddenCharacters(description)
                                     ? std::string(description)
                                     : EscapeUntrusted(description, kMaxParseErrorChars)));
  }
  return ReadSpec(root, reader);
}

Result<v1::JobSpec> ParseJobSpecFile(const std::string& path) {
  // The path names the file in every error, escaped and cut as any untrusted text.
  const std::string shown = EscapeUntrusted(path, 256);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int error = errno;
    return NotFoundError("cannot read job spec " + shown + ": " + std::strerror(error));
  }
  if (!S_ISREG(st.st_mode)) return InvalidArgumentError("job spec " + shown + ": expected a regular file (a .toml)");
  const auto too_large = [&] {
    return InvalidArgumentError("job spec " + shown + ": expected at most " + std::to_string(kMaxJobSpecBytes >> 10) +
                                " KiB, got more");
  };
  if (static_cast<uint64_t>(st.st_size) > kMaxJobSpecBytes) return too_large();
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot read job spec " + shown);
  std::string text(kMaxJobSpecBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return DataLossError("error reading job spec " + shown);
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxJobSpecBytes) return too_large();  // it grew since the stat
  return ParseJobSpecString(text, shown);
}

}  // namespace tessera
