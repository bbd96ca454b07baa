#include "cli/job_spec.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <span>
#include <sstream>

#include "cli/job_spec_names.h"
#include "proto/job_mapping.h"

namespace tessera {
namespace {

using job_spec_names::KindName;
using job_spec_names::kPartitionKinds;
using job_spec_names::kAdaptiveStrategies;
using job_spec_names::IsOneOf;

constexpr uint64_t kMaxUint64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

constexpr std::string_view kTopKeys[] = {
    "name", "strategy", "rounds", "clients_per_round", "min_clients", "round_deadline_s", "seed",
    "max_round_attempts", "max_update_norm", "update_norm_policy", "device", "fallback_device", "collective_backend",
    "proximal_mu", "model", "data", "train", "server", "aggregation", "compression", "selection", "evaluation", "mode", "async"};
constexpr std::string_view kEvaluationKeys[] = {"federated"};
constexpr std::string_view kSelectionKeys[] = {"policy", "over_selection", "straggler_penalty"};
constexpr std::string_view kSelectionPolicies[] = {"random", "deadline", "utility"};
constexpr std::string_view kServerKeys[] = {"learning_rate", "momentum", "beta1", "beta2", "tau"};
constexpr std::string_view kAggregationKeys[] = {"rule", "trim_fraction", "byzantine_clients", "selected"};
constexpr std::string_view kCompressionKeys[] = {"encoding", "fraction"};
constexpr std::string_view kAsyncKeys[] = {"buffer_size", "max_staleness", "staleness_weighting", "staleness_exponent",
                                           "concurrency"};
constexpr std::string_view kModelKeys[] = {"name", "hidden", "trainer"};
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
constexpr std::string_view kAggregationRules[] = {"mean", "median", "trimmed-mean", "krum"};
constexpr std::string_view kUpdateNormPolicies[] = {"refuse", "clip"};
constexpr std::string_view kModels[] = {"simplecnn", "mlp", "mcmahan-cnn"};
constexpr std::string_view kBackends[] = {"auto", "gloo", "mpi", "nccl", "p2p"};
constexpr std::string_view kOptimizers[] = {"sgd"};
constexpr std::string_view kModes[] = {"sync", "async"};
constexpr std::string_view kStalenessWeightings[] = {"polynomial", "constant"};

std::string JoinQuoted(std::span<const std::string_view> names) {
  std::string out;
  for (std::string_view name : names) {
    if (!out.empty()) out += ", ";
    out += '"';
    out += name;
    out += '"';
  }
  return out;
}

std::string_view TypeName(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

std::string Dotted(std::string_view prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : std::string(prefix) + "." + std::string(key);
}

// Reads typed values out of the parsed document and remembers where each key was, so that
// checks made after reading still point at the line.
class SpecReader {
 public:
  explicit SpecReader(std::string_view source) : source_(source) {}

  // "job.toml:12:3" for a key that was read, "job.toml" for one left at its default.
  std::string Where(const std::string& dotted) const {
    auto it = positions_.find(dotted);
    if (it == positions_.end()) return source_;
    return At(it->second);
  }
  std::string At(const toml::source_position& pos) const {
    return source_ + ":" + std::to_string(pos.line) + ":" + std::to_string(pos.column);
  }
  bool Present(const std::string& dotted) const { return positions_.count(dotted) > 0; }
  // Whether `table` has `key`, remembering where it is.
  bool Has(const toml::table& table, std::string_view prefix, std::string_view key) {
    return Locate(table, prefix, key) != nullptr;
  }

  Status Error(const std::string& dotted, const std::string& message) const {
    return InvalidArgumentError(Where(dotted) + ": key '" + dotted + "': " + message);
  }

  Status CheckKeys(const toml::table& table, std::string_view prefix,
                   std::span<const std::string_view> allowed) const {
    for (auto&& [key, node] : table) {
      if (std::find(allowed.begin(), allowed.end(), key.str()) != allowed.end()) continue;
      std::string where = key.source().begin ? At(key.source().begin) : At(node.source().begin);
      std::string table_name = prefix.empty() ? "the top level" : "[" + std::string(prefix) + "]";
      std::string allowed_list;
      for (std::string_view name : allowed) allowed_list += (allowed_list.empty() ? "" : ", ") + std::string(name);
      return InvalidArgumentError(where + ": unknown key '" + Dotted(prefix, key.str()) + "'; allowed keys in " +
                                  table_name + ": " + allowed_list);
    }
    return Status::Ok();
  }

  // The sub-table `key`, nullptr when absent.
  Result<const toml::table*> Table(const toml::table& parent, std::string_view prefix, std::string_view key) {
    const toml::node* node = Locate(parent, prefix, key);
    if (node == nullptr) return static_cast<const toml::table*>(nullptr);
    if (!node->is_table()) return TypeError(prefix, key, *node, "a table");
    return node->as_table();
  }

  Status String(const toml::table& table, std::string_view prefix, std::string_view key, std::string* out) {
    const toml::node* node = Locate(table, prefix, key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_string()) return TypeError(prefix, key, *node, "a string");
    *out = node->as_string()->get();
    return Status::Ok();
  }

  // An integer in [min, max].
  Status Unsigned(const toml::table& table, std::string_view prefix, std::string_view key, uint64_t min,
                  uint64_t max, uint64_t* out) {
    const toml::node* node = Locate(table, prefix, key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_integer()) return TypeError(prefix, key, *node, "an integer");
    return CheckedUnsigned(Dotted(prefix, key), node->as_integer()->get(), min, max, out);
  }

  // A float; an integer is accepted too.
  Status Number(const toml::table& table, std::string_view prefix, std::string_view key, double* out) {
    const toml::node* node = Locate(table, prefix, key);
    if (node == nullptr) return Status::Ok();
    if (node->is_floating_point()) {
      *out = node->as_floating_point()->get();
    } else if (node->is_integer()) {
      *out = static_cast<double>(node->as_integer()->get());
    } else {
      return TypeError(prefix, key, *node, "a float");
    }
    if (!std::isfinite(*out)) return Error(Dotted(prefix, key), "expected a finite number, found " + ToText(*out));
    return Status::Ok();
  }

  Status Bool(const toml::table& table, std::string_view prefix, std::string_view key, bool* out) {
    const toml::node* node = Locate(table, prefix, key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_boolean()) return TypeError(prefix, key, *node, "true or false");
    *out = node->as_boolean()->get();
    return Status::Ok();
  }

  // An array of at most `max_size` finite numbers (integers accepted).
  Status NumberArray(const toml::table& table, std::string_view prefix, std::string_view key, size_t max_size,
                     std::vector<double>* out) {
    const toml::node* node = Locate(table, prefix, key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_array()) return TypeError(prefix, key, *node, "an array of numbers");
    const toml::array& array = *node->as_array();
    if (array.size() > max_size) {
      return Error(Dotted(prefix, key), "must have at most " + std::to_string(max_size) + " values, got " +
                                            std::to_string(array.size()));
    }
    out->clear();
    for (size_t i = 0; i < array.size(); ++i) {
      const toml::node& element = array[i];
      const std::string dotted = Dotted(prefix, key) + "[" + std::to_string(i) + "]";
      positions_[dotted] = element.source().begin;
      double value = 0;
      if (element.is_floating_point()) {
        value = element.as_floating_point()->get();
      } else if (element.is_integer()) {
        value = static_cast<double>(element.as_integer()->get());
      } else {
        return InvalidArgumentError(Where(dotted) + ": key '" + dotted + "': expected a number, found " +
                                    std::string(TypeName(element)));
      }
      if (!std::isfinite(value)) return Error(dotted, "expected a finite number, found " + ToText(value));
      out->push_back(value);
    }
    return Status::Ok();
  }

  // An array of integers, each in [min, max].
  Status UnsignedArray(const toml::table& table, std::string_view prefix, std::string_view key, uint64_t min,
                       uint64_t max, std::vector<uint64_t>* out) {
    const toml::node* node = Locate(table, prefix, key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_array()) return TypeError(prefix, key, *node, "an array of integers");
    out->clear();
    const toml::array& array = *node->as_array();
    for (size_t i = 0; i < array.size(); ++i) {
      const toml::node& element = array[i];
      const std::string dotted = Dotted(prefix, key) + "[" + std::to_string(i) + "]";
      positions_[dotted] = element.source().begin;
      if (!element.is_integer()) {
        return InvalidArgumentError(Where(dotted) + ": key '" + dotted + "': expected an integer, found " +
                                    std::string(TypeName(element)));
      }
      uint64_t value = 0;
      RETURN_IF_ERROR(CheckedUnsigned(dotted, element.as_integer()->get(), min, max, &value));
      out->push_back(value);
    }
    return Status::Ok();
  }

  // An array of at most `max_size` arrays of integers, each integer in [min, max].
  Status UnsignedArrays(const toml::table& table, std::string_view prefix, std::string_view key, size_t max_size,
                        uint64_t min, uint64_t max, std::vector<std::vector<uint64_t>>* out) {
    const toml::node* node = Locate(table, prefix, key);
    if (node == nullptr) return Status::Ok();
    if (!node->is_array()) return TypeError(prefix, key, *node, "an array of arrays of integers");
    const toml::array& array = *node->as_array();
    if (array.size() > max_size) {
      return Error(Dotted(prefix, key), "must have at most " + std::to_string(max_size) + " arrays, got " +
                                            std::to_string(array.size()));
    }
    out->assign(array.size(), {});
    for (size_t i = 0; i < array.size(); ++i) {
      const std::string dotted = Dotted(prefix, key) + "[" + std::to_string(i) + "]";
      positions_[dotted] = array[i].source().begin;
      if (!array[i].is_array()) {
        return InvalidArgumentError(Where(dotted) + ": key '" + dotted + "': expected an array of integers, found " +
                                    std::string(TypeName(array[i])));
      }
      const toml::array& inner = *array[i].as_array();
      if (inner.size() > max - min + 1) return Error(dotted, "must have at most " + std::to_string(max - min + 1) + " values");
      for (size_t j = 0; j < inner.size(); ++j) {
        const std::string element = dotted + "[" + std::to_string(j) + "]";
        positions_[element] = inner[j].source().begin;
        if (!inner[j].is_integer()) {
          return InvalidArgumentError(Where(element) + ": key '" + element + "': expected an integer, found " +
                                      std::string(TypeName(inner[j])));
        }
        uint64_t value = 0;
        RETURN_IF_ERROR(CheckedUnsigned(element, inner[j].as_integer()->get(), min, max, &value));
        (*out)[i].push_back(value);
      }
    }
    return Status::Ok();
  }

  static std::string ToText(double value) {
    std::ostringstream out;
    out << value;
    return out.str();
  }

 private:
  const toml::node* Locate(const toml::table& table, std::string_view prefix, std::string_view key) {
    const toml::node* node = table.get(key);
    if (node != nullptr) positions_[Dotted(prefix, key)] = node->source().begin;
    return node;
  }

  Status TypeError(std::string_view prefix, std::string_view key, const toml::node& node,
                   std::string_view expected) const {
    return Error(Dotted(prefix, key),
                 "expected " + std::string(expected) + ", found " + std::string(TypeName(node)));
  }

  Status CheckedUnsigned(const std::string& dotted, int64_t value, uint64_t min, uint64_t max, uint64_t* out) const {
    if (value < 0 || static_cast<uint64_t>(value) < min) {
      return Error(dotted, "must be at least " + std::to_string(min) + ", got " + std::to_string(value));
    }
    if (static_cast<uint64_t>(value) > max) {
      return Error(dotted, "must be at most " + std::to_string(max) + ", got " + std::to_string(value));
    }
    *out = static_cast<uint64_t>(value);
    return Status::Ok();
  }

  std::string source_;
  std::map<std::string, toml::source_position> positions_;
};

Status CheckOneOf(const SpecReader& reader, const std::string& dotted, const std::string& value,
                  std::span<const std::string_view> allowed) {
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return Status::Ok();
  return reader.Error(dotted, "expected one of " + JoinQuoted(allowed) + ", found \"" + value + "\"");
}

// A string key of at most `max_bytes` bytes without control characters (docs/JOBS.md), as the
// coordinator's ValidateJobSpec requires; the message shows no more than the first 64 bytes.
Status CheckPlainText(const SpecReader& reader, const std::string& dotted, const std::string& value,
                      size_t max_bytes) {
  const bool control = std::any_of(value.begin(), value.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  });
  if (value.size() <= max_bytes && !control) return Status::Ok();
  return reader.Error(dotted, "expected at most " + std::to_string(max_bytes) + " bytes without control characters, found " +
                                  (control ? "a control character" : std::to_string(value.size()) + " bytes"));
}

std::string Lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// [server]: the strategy's server-side optimiser. Each key is refused for a strategy it does
// not apply to; the defaults of those it does are filled in.
Status ReadServer(const toml::table& root, SpecReader& reader, v1::JobSpec* spec) {
  ASSIGN_OR_RETURN(const toml::table* server, reader.Table(root, "", "server"));
  const std::string& strategy = spec->strategy();
  const bool adaptive = IsOneOf(strategy, kAdaptiveStrategies);
  if (server != nullptr) {
    RETURN_IF_ERROR(reader.CheckKeys(*server, "server", kServerKeys));
    if (strategy == "fedavg" || strategy == "fedprox" || strategy == "fednova" || strategy == "scaffold") {
      return reader.Error("server", "applies to strategies \"fedavgm\", \"fedadam\", \"fedyogi\" and \"fedadagrad\" "
                                    "only; strategy is \"" + strategy + "\"");
    }
    auto only = [&](const char* key, const std::string& strategies) -> Status {
      if (!reader.Has(*server, "server", key)) return Status::Ok();
      return reader.Error(std::string("server.") + key,
                          "applies to strategies " + strategies + " only; strategy is \"" + strategy + "\"");
    };
    if (strategy != "fedavgm") RETURN_IF_ERROR(only("momentum", "\"fedavgm\""));
    if (!adaptive) {
      for (const char* key : {"beta1", "beta2", "tau"}) {
        RETURN_IF_ERROR(only(key, "\"fedadam\", \"fedyogi\" and \"fedadagrad\""));
      }
    }
    if (strategy == "fedadagrad") RETURN_IF_ERROR(only("beta2", "\"fedadam\" and \"fedyogi\""));
  }
  if (strategy == "fedavg" || strategy == "fedprox" || strategy == "fednova" || strategy == "scaffold") {
    return Status::Ok();
  }
  const toml::table empty;
  if (server == nullptr) server = &empty;
  v1::ServerOptimizerSpec* out = spec->mutable_server();
  double learning_rate = wire::DefaultServerLearningRate(strategy);
  RETURN_IF_ERROR(reader.Number(*server, "server", "learning_rate", &learning_rate));
  if (!(learning_rate > 0.0 && learning_rate <= wire::kMaxServerLearningRate)) {
    return reader.Error("server.learning_rate", "must be in (0, " + SpecReader::ToText(wire::kMaxServerLearningRate) +
                                                    "], got " + SpecReader::ToText(learning_rate));
  }
  out->set_learning_rate(learning_rate);
  if (strategy == "fedavgm") {
    double momentum = 0.9;
    RETURN_IF_ERROR(reader.Number(*server, "server", "momentum", &momentum));
    if (!(momentum >= 0.0 && momentum < 1.0)) {
      return reader.Error("server.momentum", "must be in [0, 1), got " + SpecReader::ToText(momentum));
    }
    out->set_momentum(momentum);
    return Status::Ok();
  }
  double beta1 = wire::kDefaultBeta1, beta2 = wire::kDefaultBeta2, tau = wire::kDefaultTau;
  RETURN_IF_ERROR(reader.Number(*server, "server", "beta1", &beta1));
  if (!(beta1 >= 0.0 && beta1 < 1.0)) return reader.Error("server.beta1", "must be in [0, 1), got " + SpecReader::ToText(beta1));
  out->set_beta1(beta1);
  if (strategy != "fedadagrad") {
    RETURN_IF_ERROR(reader.Number(*server, "server", "beta2", &beta2));
    if (!(beta2 >= 0.0 && beta2 < 1.0)) return reader.Error("server.beta2", "must be in [0, 1), got " + SpecReader::ToText(beta2));
    out->set_beta2(beta2);
  }
  RETURN_IF_ERROR(reader.Number(*server, "server", "tau", &tau));
  if (!(tau > 0.0 && tau <= wire::kMaxTau)) {
    return reader.Error("server.tau", "must be > 0 and at most " + SpecReader::ToText(wire::kMaxTau) + ", got " +
                                          SpecReader::ToText(tau));
  }
  out->set_tau(tau);
  return Status::Ok();
}

// `aggregation = "median"`, or an [aggregation] table with the rule and its options. What
// depends on the participation (Krum's n > 2f + 2, a cut of at least one update) is checked
// with the whole spec by ValidateJobSpec.
Status ReadAggregation(const toml::table& root, SpecReader& reader, v1::JobSpec* spec) {
  v1::RobustAggregationSpec* out = spec->mutable_aggregation();
  std::string rule = "mean";
  const toml::node* node = root.get("aggregation");
  const toml::table* table = nullptr;
  std::string rule_key = "aggregation";
  if (node != nullptr && !node->is_table()) {
    if (!node->is_string()) {
      reader.Has(root, "", "aggregation");
      return reader.Error("aggregation", "expected a rule name (a string) or an [aggregation] table, found " +
                                             std::string(TypeName(*node)));
    }
    RETURN_IF_ERROR(reader.String(root, "", "aggregation", &rule));
  } else if (node != nullptr) {
    ASSIGN_OR_RETURN(table, reader.Table(root, "", "aggregation"));
    RETURN_IF_ERROR(reader.CheckKeys(*table, "aggregation", kAggregationKeys));
    RETURN_IF_ERROR(reader.String(*table, "aggregation", "rule", &rule));
    rule_key = "aggregation.rule";
  }
  rule = Lowercase(rule);
  RETURN_IF_ERROR(CheckOneOf(reader, rule_key, rule, kAggregationRules));
  out->set_rule(rule);
  const toml::table empty;
  if (table == nullptr) table = &empty;
  auto only = [&](const char* key, const std::string& rules) -> Status {
    if (!reader.Has(*table, "aggregation", key)) return Status::Ok();
    return reader.Error(std::string("aggregation.") + key,
                        "applies to rule " + rules + " only; rule is \"" + rule + "\"");
  };
  if (rule != "trimmed-mean") RETURN_IF_ERROR(only("trim_fraction", "\"trimmed-mean\""));
  if (rule != "krum") {
    RETURN_IF_ERROR(only("byzantine_clients", "\"krum\""));
    RETURN_IF_ERROR(only("selected", "\"krum\""));
  }
  if (rule == "trimmed-mean") {
    double fraction = wire::kDefaultTrimFraction;
    RETURN_IF_ERROR(reader.Number(*table, "aggregation", "trim_fraction", &fraction));
    if (!(fraction > 0.0 && fraction < 0.5)) {
      return reader.Error("aggregation.trim_fraction",
                          "must be > 0 and below 0.5 (the fraction cut from each side), got " + SpecReader::ToText(fraction));
    }
    out->set_trim_fraction(fraction);
  }
  if (rule == "krum") {
    uint64_t f = 0, m = 1;
    RETURN_IF_ERROR(reader.Unsigned(*table, "aggregation", "byzantine_clients", 0, wire::kMaxParties, &f));
    if (!reader.Present("aggregation.byzantine_clients")) {
      return reader.Error("aggregation.byzantine_clients",
                          "is required for rule \"krum\": f, the number of Byzantine clients to tolerate "
                          "(write aggregation as a table: [aggregation] rule = \"krum\", byzantine_clients = F)");
    }
    RETURN_IF_ERROR(reader.Unsigned(*table, "aggregation", "selected", 1, wire::kMaxParties, &m));
    out->set_byzantine_clients(static_cast<uint32_t>(f));
    out->set_selected(static_cast<uint32_t>(m));
  }
  return Status::Ok();
}

// [compression]: how the workers' updates travel. `fraction` applies to "topk" alone; where
// compression cannot apply (scaffold, top-k under a robust rule) ValidateJobSpec says so.
Status ReadCompression(const toml::table& root, SpecReader& reader, v1::JobSpec* spec) {
  ASSIGN_OR_RETURN(const toml::table* table, reader.Table(root, "", "compression"));
  if (table == nullptr) return Status::Ok();
  RETURN_IF_ERROR(reader.CheckKeys(*table, "compression", kCompressionKeys));
  std::string name = "float32";
  RETURN_IF_ERROR(reader.String(*table, "compression", "encoding", &name));
  name = Lowercase(name);
  std::vector<std::string_view> names;
  for (const auto& known : job_spec_names::kEncodings) names.push_back(known.name);
  RETURN_IF_ERROR(CheckOneOf(reader, "compression.encoding", name, names));
  const auto* known = std::find_if(std::begin(job_spec_names::kEncodings), std::end(job_spec_names::kEncodings),
                                   [&](const auto& e) { return e.name == name; });
  v1::UpdateCompressionSpec* out = spec->mutable_compression();
  out->set_encoding(known->encoding);
  if (known->encoding != v1::ENCODING_TOPK) {
    if (reader.Has(*table, "compression", "fraction")) {
      return reader.Error("compression.fraction", "applies to encoding \"topk\" only; encoding is \"" + name + "\"");
    }
    return Status::Ok();
  }
  double fraction = 0;
  RETURN_IF_ERROR(reader.Number(*table, "compression", "fraction", &fraction));
  if (!reader.Present("compression.fraction")) {
    return reader.Error("compression.fraction",
                        "is required for encoding \"topk\": the share of each tensor's entries sent, in (0, 1]");
  }
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return reader.Error("compression.fraction", "must be in (0, 1] (the share of each tensor's entries sent), got " +
                                                    SpecReader::ToText(fraction));
  }
  out->set_fraction(fraction);
  return Status::Ok();
}

// [selection]: the selection policy and its over-selection. Without the table the spec says
// nothing (random selection, exactly clients_per_round); with it, the policy's default
// over-selection is written in.
Status ReadSelection(const toml::table& root, SpecReader& reader, v1::JobSpec* spec) {
  ASSIGN_OR_RETURN(const toml::table* table, reader.Table(root, "", "selection"));
  if (table == nullptr) return Status::Ok();
  RETURN_IF_ERROR(reader.CheckKeys(*table, "selection", kSelectionKeys));
  v1::SelectionSpec* out = spec->mutable_selection();
  std::string policy = "random";
  RETURN_IF_ERROR(reader.String(*table, "selection", "policy", &policy));
  policy = Lowercase(policy);
  RETURN_IF_ERROR(CheckOneOf(reader, "selection.policy", policy, kSelectionPolicies));
  out->set_policy(policy);
  double over_selection = wire::OverSelection(*spec);  // the policy's default
  RETURN_IF_ERROR(reader.Number(*table, "selection", "over_selection", &over_selection));
  if (!(over_selection >= 0.0 && over_selection <= wire::kMaxOverSelection)) {
    return reader.Error("selection.over_selection", "must be a fraction in [0, " +
                                                        SpecReader::ToText(wire::kMaxOverSelection) + "], got " +
                                                        SpecReader::ToText(over_selection));
  }
  out->set_over_selection(over_selection);
  if (policy != "utility") {
    if (reader.Has(*table, "selection", "straggler_penalty")) {
      return reader.Error("selection.straggler_penalty", "applies to policy \"utility\" only; policy is \"" + policy + "\"");
    }
    return Status::Ok();
  }
  double alpha = wire::kDefaultStragglerPenalty;
  RETURN_IF_ERROR(reader.Number(*table, "selection", "straggler_penalty", &alpha));
  if (!(alpha >= 0.0 && alpha <= wire::kMaxStragglerPenalty)) {
    return reader.Error("selection.straggler_penalty", "must be in [0, " +
                                                           SpecReader::ToText(wire::kMaxStragglerPenalty) + "], got " +
                                                           SpecReader::ToText(alpha));
  }
  out->set_straggler_penalty(alpha);
  return Status::Ok();
}

// `mode = "async"` and its [async] table: FedBuff's options, defaults filled in. The [async]
// table is refused in mode "sync", and so is min_clients in mode "async" (there are no rounds
// to fill). What depends on the strategy and the rule is checked by ValidateJobSpec.
Status ReadAsync(const toml::table& root, SpecReader& reader, v1::JobSpec* spec) {
  std::string mode = "sync";
  RETURN_IF_ERROR(reader.String(root, "", "mode", &mode));
  mode = Lowercase(mode);
  RETURN_IF_ERROR(CheckOneOf(reader, "mode", mode, kModes));
  ASSIGN_OR_RETURN(const toml::table* table, reader.Table(root, "", "async"));
  if (mode == "sync") {
    if (table != nullptr) return reader.Error("async", "applies to mode = \"async\" only; mode is \"sync\"");
    return Status::Ok();
  }
  if (reader.Present("min_clients")) {
    return reader.Error("min_clients", "applies to mode \"sync\" only (an asynchronous job has no rounds to fill; "
                                       "[async] concurrency says how many clients train at once)");
  }
  const toml::table empty;
  if (table == nullptr) table = &empty;
  RETURN_IF_ERROR(reader.CheckKeys(*table, "async", kAsyncKeys));
  v1::AsyncSpec* out = spec->mutable_async();
  uint64_t concurrency = spec->clients_per_round();
  RETURN_IF_ERROR(reader.Unsigned(*table, "async", "concurrency", 1, wire::kMaxParties, &concurrency));
  const v1::PartitionSpec& partition = spec->data().partition();
  if (partition.kind() != v1::PARTITION_LOCAL_FILES && concurrency > partition.parties()) {
    return reader.Error("async.concurrency", "must be at most data.partition.parties (" +
                                                 std::to_string(partition.parties()) + "), got " +
                                                 std::to_string(concurrency));
  }
  out->set_concurrency(static_cast<uint32_t>(concurrency));
  uint64_t buffer_size = std::min<uint64_t>(wire::kDefaultAsyncBufferSize, concurrency);
  RETURN_IF_ERROR(reader.Unsigned(*table, "async", "buffer_size", 1, wire::kMaxParties, &buffer_size));
  out->set_buffer_size(static_cast<uint32_t>(buffer_size));
  uint64_t max_staleness = wire::kDefaultMaxStaleness;
  RETURN_IF_ERROR(reader.Unsigned(*table, "async", "max_staleness", 0, wire::kMaxRounds, &max_staleness));
  out->set_max_staleness(static_cast<uint32_t>(max_staleness));
  std::string weighting = "polynomial";
  RETURN_IF_ERROR(reader.String(*table, "async", "staleness_weighting", &weighting));
  weighting = Lowercase(weighting);
  RETURN_IF_ERROR(CheckOneOf(reader, "async.staleness_weighting", weighting, kStalenessWeightings));
  out->set_staleness_weighting(weighting);
  double exponent = weighting == "polynomial" ? wire::kDefaultStalenessExponent : 0.0;
  RETURN_IF_ERROR(reader.Number(*table, "async", "staleness_exponent", &exponent));
  if (weighting == "constant" && reader.Present("async.staleness_exponent")) {
    return reader.Error("async.staleness_exponent", "applies to staleness_weighting = \"polynomial\" only");
  }
  if (!(exponent >= 0.0 && exponent <= wire::kMaxStalenessExponent)) {
    return reader.Error("async.staleness_exponent", "must be in [0, " + SpecReader::ToText(wire::kMaxStalenessExponent) +
                                                        "], got " + SpecReader::ToText(exponent));
  }
  out->set_staleness_exponent(exponent);
  return Status::Ok();
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
    return reader.Error("round_deadline_s", "must be between 0.001 and " + SpecReader::ToText(max_deadline_s) +
                                                " seconds, got " + SpecReader::ToText(deadline_s));
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
    return reader.Error("max_update_norm", "must be > 0 and at most " + SpecReader::ToText(wire::kMaxUpdateNormLimit) +
                                               ", got " + SpecReader::ToText(max_update_norm));
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
                                   device + "\"");
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
  if (!reader.Present("model.name")) return reader.Error("model.name", "is required: one of " + JoinQuoted(kModels));
  model_name = Lowercase(model_name);
  RETURN_IF_ERROR(CheckOneOf(reader, "model.name", model_name, kModels));
  spec.mutable_model()->set_name(model_name);
  std::vector<uint64_t> hidden;
  RETURN_IF_ERROR(reader.UnsignedArray(*model, "model", "hidden", 1, wire::kMaxHiddenWidth, &hidden));
  if (hidden.size() > static_cast<size_t>(wire::kMaxHiddenLayers)) {
    return reader.Error("model.hidden", "must have at most " + std::to_string(wire::kMaxHiddenLayers) +
                                            " hidden layers, got " + std::to_string(hidden.size()));
  }
  if (!hidden.empty() && model_name != "mlp") {
    return reader.Error("model.hidden", "applies to model \"mlp\" only, not \"" + model_name + "\"");
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
    return reader.Error("data.format", "fashion-mnist is \"idx\", found \"" + format + "\"");
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
  if (fashion && !mean.empty()) {
    return reader.Error("data.mean", "fashion-mnist is normalised with its own statistics; give no mean or std");
  }
  for (size_t i = 0; i < mean.size(); ++i) {
    if (!(std_dev[i] > 0)) {
      return reader.Error("data.std[" + std::to_string(i) + "]", "must be positive, got " + SpecReader::ToText(std_dev[i]));
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
                                               "\"quantity\", \"local-files\", found \"" + kind + "\"");
  }
  partition_spec->set_kind(found->kind);
  u = 0;
  RETURN_IF_ERROR(reader.Unsigned(*partition, "data.partition", "parties", 1, wire::kMaxParties, &u));
  if (!reader.Present("data.partition.parties")) {
    return reader.Error("data.partition.parties", "is required: the number of parties the data is split among");
  }
  const uint64_t parties = u;
  partition_spec->set_parties(static_cast<uint32_t>(parties));
  double beta = 0.5;
  RETURN_IF_ERROR(reader.Number(*partition, "data.partition", "beta", &beta));
  if (!(beta > 0.0 && beta <= wire::kMaxBeta)) {
    return reader.Error("data.partition.beta", "must be > 0 and at most " + SpecReader::ToText(wire::kMaxBeta) + ", got " +
                                                   SpecReader::ToText(beta));
  }
  partition_spec->set_beta(beta);
  u = 2;
  // At most the classes: Fashion-MNIST's 10, data.classes, or (inferred at submit) 256 here.
  const uint64_t classes = fashion ? 10 : (data_spec->classes() ? data_spec->classes() : wire::kMaxClasses);
  RETURN_IF_ERROR(reader.Unsigned(*partition, "data.partition", "labels_per_party", 1, classes, &u));
  partition_spec->set_labels_per_party(static_cast<uint32_t>(u));
  std::vector<std::vector<uint64_t>> party_labels;
  RETURN_IF_ERROR(reader.UnsignedArrays(*partition, "data.partition", "party_labels", parties, 0, classes - 1,
                                        &party_labels));
  if (reader.Present("data.partition.party_labels")) {
    if (found->kind != v1::PARTITION_LABEL_QUANTITY) {
      return reader.Error("data.partition.party_labels", "is for kind \"label-quantity\" only, found kind \"" + kind + "\"");
    }
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
      if (set.size() != partition_spec->labels_per_party()) {
        return reader.Error(field, "expected " + std::to_string(partition_spec->labels_per_party()) +
                                       " labels (labels_per_party), got " + std::to_string(set.size()));
      }
      for (size_t a = 0; a < set.size(); ++a) {
        if (std::find(set.begin(), set.begin() + static_cast<std::ptrdiff_t>(a), set[a]) !=
            set.begin() + static_cast<std::ptrdiff_t>(a)) {
          return reader.Error(field, "label " + std::to_string(set[a]) + " appears twice");
        }
      }
      v1::LabelSet* labels = partition_spec->add_party_labels();
      for (uint64_t label : set) labels->add_labels(static_cast<uint32_t>(label));
    }
  }
  u = spec.seed();
  RETURN_IF_ERROR(reader.Unsigned(*partition, "data.partition", "seed", 0, kMaxUint64, &u));
  partition_spec->set_seed(u);
  if (data_spec->max_train_samples() != 0 && data_spec->max_train_samples() < parties) {
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
    return reader.Error("train.learning_rate", "must be > 0 and at most " + SpecReader::ToText(wire::kMaxLearningRate) +
                                                   ", got " + SpecReader::ToText(learning_rate));
  }
  RETURN_IF_ERROR(reader.Number(*train, "train", "momentum", &momentum));
  if (!(momentum >= 0.0 && momentum < 1.0)) {
    return reader.Error("train.momentum", "must be in [0, 1), got " + SpecReader::ToText(momentum));
  }
  RETURN_IF_ERROR(reader.Number(*train, "train", "weight_decay", &weight_decay));
  if (!(weight_decay >= 0.0 && weight_decay <= wire::kMaxWeightDecay)) {
    return reader.Error("train.weight_decay", "must be in [0, " + SpecReader::ToText(wire::kMaxWeightDecay) +
                                                  "], got " + SpecReader::ToText(weight_decay));
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
      return reader.Error("proximal_mu", "must be > 0 and at most " + SpecReader::ToText(wire::kMaxProximalMu) +
                                             ", got " + SpecReader::ToText(proximal_mu));
    }
    spec.set_proximal_mu(proximal_mu);
  } else if (reader.Present("proximal_mu")) {
    return reader.Error("proximal_mu", "applies to strategy \"fedprox\" only; strategy is \"" + spec.strategy() + "\"");
  }
  if (spec.strategy() == "scaffold" && partition_spec->kind() == v1::PARTITION_LOCAL_FILES) {
    return reader.Error("data.partition.kind", "strategy \"scaffold\" needs a shared partition (it keeps a control "
                                               "variate per party); \"local-files\" seats any number of clients");
  }
  // What the keys cannot say one by one (the model's estimated memory, ...), as the
  // coordinator will check it.
  if (Status valid = wire::ValidateJobSpec(spec); !valid.ok()) {
    // "spec.FIELD: ..." points at FIELD's line when the file has that key.
    const std::string& message = valid.message();
    std::string where = reader.Where("");
    if (message.rfind("spec.", 0) == 0 && message.find(':') != std::string::npos) {
      const std::string field = message.substr(5, message.find(':') - 5);
      if (reader.Present(field)) where = reader.Where(field);
    }
    return InvalidArgumentError(where + ": " + message);
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
    return InvalidArgumentError(reader.At(error.source().begin) + ": " + std::string(error.description()));
  }
  return ReadSpec(root, reader);
}

Result<v1::JobSpec> ParseJobSpecFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot read job spec " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return DataLossError("error reading job spec " + path);
  return ParseJobSpecString(text.str(), path);
}

}  // namespace tessera
