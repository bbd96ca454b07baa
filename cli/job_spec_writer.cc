// JobSpecToToml (cli/job_spec.h): a spec written back as the job.toml the reader accepts.
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/format.h"
#include "cli/job_spec.h"
#include "cli/job_spec_names.h"

namespace tessera {
namespace {

using job_spec_names::KindName;
using job_spec_names::kPartitionKinds;
using job_spec_names::kAdaptiveStrategies;
using job_spec_names::IsOneOf;

// Shortest text that reads back as the same double, always with a '.' or an exponent.
std::string TomlFloat(double value) {
  std::string out = FormatExact(value);
  if (out.find_first_of(".eEn") == std::string::npos) out += ".0";  // 'n': nan and inf
  return out;
}

std::string TomlString(const std::string& value) {
  std::string out = "\"";
  for (unsigned char c : value) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// One layer's keys as "key = value" pairs, in the reader's order; body and shortcut as inline
// arrays of inline tables.
std::vector<std::string> LayerKeys(const v1::LayerSpec& layer) {
  std::vector<std::string> keys = {"type = " + TomlString(layer.type())};
  if (!layer.name().empty()) keys.push_back("name = " + TomlString(layer.name()));
  const std::pair<const char*, uint32_t> sizes[] = {{"out", layer.out()},         {"kernel", layer.kernel()},
                                                    {"stride", layer.stride()},   {"padding", layer.padding()},
                                                    {"groups", layer.groups()},   {"window", layer.window()}};
  for (const auto& [key, value] : sizes) {
    if (value != 0) keys.push_back(std::string(key) + " = " + std::to_string(value));
  }
  if (layer.has_bias()) keys.push_back(std::string("bias = ") + (layer.bias() ? "true" : "false"));
  if (layer.has_probability()) keys.push_back("probability = " + TomlFloat(layer.probability()));
  if (layer.has_epsilon()) keys.push_back("epsilon = " + TomlFloat(layer.epsilon()));
  if (layer.has_momentum()) keys.push_back("momentum = " + TomlFloat(layer.momentum()));
  if (layer.local()) keys.push_back("local = true");
  for (const auto& [key, path] : {std::pair<const char*, const google::protobuf::RepeatedPtrField<v1::LayerSpec>*>{
                                      "body", &layer.body()},
                                  {"shortcut", &layer.shortcut()}}) {
    if (path->empty()) continue;
    std::string array = std::string(key) + " = [";
    for (int i = 0; i < path->size(); ++i) {
      std::string inline_table;
      for (const std::string& pair : LayerKeys(path->Get(i))) inline_table += (inline_table.empty() ? "" : ", ") + pair;
      array += std::string(i ? ", " : "") + "{ " + inline_table + " }";
    }
    keys.push_back(array + "]");
  }
  return keys;
}

std::string_view PartitionKindText(v1::PartitionKind kind) {
  for (const KindName& k : kPartitionKinds) {
    if (k.kind == kind) return k.name;
  }
  return "iid";
}

std::string_view EncodingText(v1::Encoding encoding) {
  for (const auto& e : job_spec_names::kEncodings) {
    if (e.encoding == encoding) return e.name;
  }
  return "float32";
}

}  // namespace

std::string JobSpecToToml(const v1::JobSpec& spec) {
  std::ostringstream out;
  out << "name = " << TomlString(spec.name()) << "\n";
  out << "strategy = " << TomlString(spec.strategy()) << "\n";
  out << "rounds = " << spec.rounds() << "\n";
  out << "clients_per_round = " << spec.clients_per_round() << "\n";
  if (spec.has_async()) {
    out << "mode = \"async\"\n";
  } else {
    out << "min_clients = " << spec.min_clients() << "\n";
  }
  out << "round_deadline_s = " << TomlFloat(spec.round_deadline_ms() / 1000.0) << "\n";
  out << "seed = " << spec.seed() << "\n";
  out << "max_round_attempts = " << spec.max_round_attempts() << "\n";
  if (spec.max_update_norm() > 0) out << "max_update_norm = " << TomlFloat(spec.max_update_norm()) << "\n";
  if (!spec.update_norm_policy().empty()) out << "update_norm_policy = " << TomlString(spec.update_norm_policy()) << "\n";
  out << "device = " << TomlString(spec.device()) << "\n";
  out << "fallback_device = " << TomlString(spec.fallback_device()) << "\n";
  if (!spec.collective_backend().empty()) {
    out << "collective_backend = " << TomlString(spec.collective_backend()) << "\n";
  }
  if (spec.strategy() == "fedprox") out << "proximal_mu = " << TomlFloat(spec.proximal_mu()) << "\n";

  out << "\n[model]\n";
  out << "name = " << TomlString(spec.model().name()) << "\n";
  if (spec.model().hidden_size() > 0) {
    out << "hidden = [";
    for (int i = 0; i < spec.model().hidden_size(); ++i) out << (i ? ", " : "") << spec.model().hidden(i);
    out << "]\n";
  }
  if (!spec.model().trainer().empty()) out << "trainer = " << TomlString(spec.model().trainer()) << "\n";
  for (const v1::LayerSpec& layer : spec.model().layers()) {
    out << "\n[[model.layers]]\n";
    for (const std::string& pair : LayerKeys(layer)) out << pair << "\n";
  }

  const v1::DataSpec& data = spec.data();
  out << "\n[data]\n";
  out << "dataset = " << TomlString(data.dataset()) << "\n";
  if (!data.path().empty()) out << "path = " << TomlString(data.path()) << "\n";
  out << "max_train_samples = " << data.max_train_samples() << "\n";
  out << "max_test_samples = " << data.max_test_samples() << "\n";
  if (!data.format().empty()) out << "format = " << TomlString(data.format()) << "\n";
  if (!data.label_column().empty()) out << "label_column = " << TomlString(data.label_column()) << "\n";
  if (data.classes() != 0) out << "classes = " << data.classes() << "\n";
  for (const auto& [key, values] : {std::pair<const char*, const google::protobuf::RepeatedField<float>*>{"mean", &data.mean()},
                                    {"std", &data.std()}}) {
    if (values->empty()) continue;
    out << key << " = [";
    for (int i = 0; i < values->size(); ++i) out << (i ? ", " : "") << TomlFloat(values->Get(i));
    out << "]\n";
  }
  if (data.has_augment()) {
    out << "\n[data.augment]\n";
    out << "horizontal_flip = " << (data.augment().horizontal_flip() ? "true" : "false") << "\n";
    out << "crop_padding = " << data.augment().crop_padding() << "\n";
  }

  const v1::PartitionSpec& partition = data.partition();
  out << "\n[data.partition]\n";
  out << "kind = " << TomlString(std::string(PartitionKindText(partition.kind()))) << "\n";
  out << "parties = " << partition.parties() << "\n";
  // Each kind's own keys only: the reader refuses them on another kind.
  if (partition.kind() == v1::PARTITION_DIRICHLET || partition.kind() == v1::PARTITION_QUANTITY) {
    out << "beta = " << TomlFloat(partition.beta()) << "\n";
  }
  if (partition.kind() == v1::PARTITION_LABEL_QUANTITY) {
    out << "labels_per_party = " << partition.labels_per_party() << "\n";
  }
  out << "seed = " << partition.seed() << "\n";
  if (partition.party_labels_size() > 0) {
    out << "party_labels = [";
    for (int p = 0; p < partition.party_labels_size(); ++p) {
      out << (p ? ", [" : "[");
      for (int i = 0; i < partition.party_labels(p).labels_size(); ++i) {
        out << (i ? ", " : "") << partition.party_labels(p).labels(i);
      }
      out << "]";
    }
    out << "]\n";
  }

  if (spec.has_evaluation()) {
    out << "\n[evaluation]\n";
    out << "federated = " << (spec.evaluation().federated() ? "true" : "false") << "\n";
  }

  const v1::OptimizerSpec& optimizer = spec.optimizer();
  out << "\n[train]\n";
  out << "optimizer = " << TomlString(optimizer.name()) << "\n";
  out << "local_epochs = " << spec.local_epochs() << "\n";
  out << "batch_size = " << spec.batch_size() << "\n";
  out << "learning_rate = " << TomlFloat(optimizer.learning_rate()) << "\n";
  out << "momentum = " << TomlFloat(optimizer.momentum()) << "\n";
  out << "weight_decay = " << TomlFloat(optimizer.weight_decay()) << "\n";
  const v1::ServerOptimizerSpec& server = spec.server();
  if (spec.strategy() == "fedavgm") {
    out << "\n[server]\n";
    out << "learning_rate = " << TomlFloat(server.learning_rate()) << "\n";
    out << "momentum = " << TomlFloat(server.momentum()) << "\n";
  } else if (IsOneOf(spec.strategy(), kAdaptiveStrategies)) {
    out << "\n[server]\n";
    out << "learning_rate = " << TomlFloat(server.learning_rate()) << "\n";
    if (server.has_beta1()) out << "beta1 = " << TomlFloat(server.beta1()) << "\n";
    if (server.has_beta2()) out << "beta2 = " << TomlFloat(server.beta2()) << "\n";
    out << "tau = " << TomlFloat(server.tau()) << "\n";
  }
  if (spec.has_aggregation()) {
    const v1::RobustAggregationSpec& aggregation = spec.aggregation();
    out << "\n[aggregation]\n";
    out << "rule = " << TomlString(aggregation.rule()) << "\n";
    if (aggregation.trim_fraction() > 0) out << "trim_fraction = " << TomlFloat(aggregation.trim_fraction()) << "\n";
    if (aggregation.rule() == "krum") {
      out << "byzantine_clients = " << aggregation.byzantine_clients() << "\n";
      out << "selected = " << aggregation.selected() << "\n";
    }
  }
  if (spec.has_compression() && (spec.compression().encoding() != v1::ENCODING_UNSPECIFIED ||
                                 spec.compression().download() != v1::ENCODING_UNSPECIFIED)) {
    const v1::UpdateCompressionSpec& compression = spec.compression();
    out << "\n[compression]\n";
    out << "encoding = " << TomlString(std::string(EncodingText(compression.encoding()))) << "\n";
    if (compression.encoding() == v1::ENCODING_TOPK) out << "fraction = " << TomlFloat(compression.fraction()) << "\n";
    if (compression.download() != v1::ENCODING_UNSPECIFIED) {
      out << "download = " << TomlString(std::string(EncodingText(compression.download()))) << "\n";
    }
  }
  if (spec.has_selection()) {
    out << "\n[selection]\n";
    out << "policy = " << TomlString(spec.selection().policy().empty() ? "random" : spec.selection().policy()) << "\n";
    if (spec.selection().has_over_selection()) {
      out << "over_selection = " << TomlFloat(spec.selection().over_selection()) << "\n";
    }
    if (spec.selection().has_straggler_penalty()) {
      out << "straggler_penalty = " << TomlFloat(spec.selection().straggler_penalty()) << "\n";
    }
  }
  if (spec.has_async()) {
    const v1::AsyncSpec& async = spec.async();
    out << "\n[async]\n";
    out << "buffer_size = " << async.buffer_size() << "\n";
    out << "max_staleness = " << async.max_staleness() << "\n";
    out << "staleness_weighting = " << TomlString(async.staleness_weighting()) << "\n";
    if (async.staleness_weighting() != "constant") {
      out << "staleness_exponent = " << TomlFloat(async.staleness_exponent()) << "\n";
    }
    out << "concurrency = " << async.concurrency() << "\n";
  }
  return out.str();
}

}  // namespace tessera
