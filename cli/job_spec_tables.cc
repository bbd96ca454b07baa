// job.toml's optional tables: [server], [aggregation], [compression], [selection], [async].
#include <algorithm>
#include <string>
#include <string_view>

#include "base/escape.h"
#include "cli/job_spec_names.h"
#include "cli/job_spec_reader.h"
#include "proto/job_mapping.h"

namespace tessera::job_spec_internal {
namespace {

using job_spec_names::kAdaptiveStrategies;
using job_spec_names::IsOneOf;

constexpr std::string_view kSelectionKeys[] = {"policy", "over_selection", "straggler_penalty"};
constexpr std::string_view kSelectionPolicies[] = {"random", "deadline", "utility"};
constexpr std::string_view kServerKeys[] = {"learning_rate", "momentum", "beta1", "beta2", "tau"};
constexpr std::string_view kAggregationKeys[] = {"rule", "trim_fraction", "byzantine_clients", "selected"};
constexpr std::string_view kCompressionKeys[] = {"encoding", "fraction", "download"};
constexpr std::string_view kAsyncKeys[] = {"buffer_size", "max_staleness", "staleness_weighting", "staleness_exponent",
                                           "concurrency"};
constexpr std::string_view kAggregationRules[] = {"mean", "median", "trimmed-mean", "krum"};
constexpr std::string_view kModes[] = {"sync", "async"};
constexpr std::string_view kStalenessWeightings[] = {"polynomial", "constant"};

}  // namespace

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
                                    "only; strategy is \"" + EscapeUntrusted(strategy) + "\"");
    }
    auto only = [&](const char* key, const std::string& strategies) -> Status {
      if (!reader.Has(*server, "server", key)) return Status::Ok();
      return reader.Error(std::string("server.") + key,
                          "applies to strategies " + strategies + " only; strategy is \"" + EscapeUntrusted(strategy) + "\"");
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
    return reader.Error("server.learning_rate", "must be in (0, " + FormatExact(wire::kMaxServerLearningRate) +
                                                    "], got " + FormatExact(learning_rate));
  }
  out->set_learning_rate(learning_rate);
  if (strategy == "fedavgm") {
    double momentum = 0.9;
    RETURN_IF_ERROR(reader.Number(*server, "server", "momentum", &momentum));
    if (!(momentum >= 0.0 && momentum < 1.0)) {
      return reader.Error("server.momentum", "must be in [0, 1), got " + FormatExact(momentum));
    }
    out->set_momentum(momentum);
    return Status::Ok();
  }
  double beta1 = wire::kDefaultBeta1, beta2 = wire::kDefaultBeta2, tau = wire::kDefaultTau;
  RETURN_IF_ERROR(reader.Number(*server, "server", "beta1", &beta1));
  if (!(beta1 >= 0.0 && beta1 < 1.0)) return reader.Error("server.beta1", "must be in [0, 1), got " + FormatExact(beta1));
  out->set_beta1(beta1);
  if (strategy != "fedadagrad") {
    RETURN_IF_ERROR(reader.Number(*server, "server", "beta2", &beta2));
    if (!(beta2 >= 0.0 && beta2 < 1.0)) return reader.Error("server.beta2", "must be in [0, 1), got " + FormatExact(beta2));
    out->set_beta2(beta2);
  }
  RETURN_IF_ERROR(reader.Number(*server, "server", "tau", &tau));
  if (!(tau > 0.0 && tau <= wire::kMaxTau)) {
    return reader.Error("server.tau", "must be > 0 and at most " + FormatExact(wire::kMaxTau) + ", got " +
                                          FormatExact(tau));
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
                        "applies to rule " + rules + " only; rule is \"" + EscapeUntrusted(rule) + "\"");
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
                          "must be > 0 and below 0.5 (the fraction cut from each side), got " + FormatExact(fraction));
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

// The encoding named under `key` of [compression] ("float32" when absent), one of `allowed`.
Result<v1::Encoding> ReadEncoding(const toml::table& table, SpecReader& reader, const std::string& key,
                                  const std::vector<std::string_view>& allowed) {
  std::string name = "float32";
  RETURN_IF_ERROR(reader.String(table, "compression", key, &name));
  name = Lowercase(name);
  RETURN_IF_ERROR(CheckOneOf(reader, "compression." + key, name, allowed));
  const auto* known = std::find_if(std::begin(job_spec_names::kEncodings), std::end(job_spec_names::kEncodings),
                                   [&](const auto& e) { return e.name == name; });
  return known->encoding;
}

// [compression]: how the workers' updates travel (`encoding`; `fraction` applies to "topk"
// alone) and how the model travels to them (`download`, a dense encoding). Where compression
// cannot apply (scaffold, top-k under a robust rule) ValidateJobSpec says so.
Status ReadCompression(const toml::table& root, SpecReader& reader, v1::JobSpec* spec) {
  ASSIGN_OR_RETURN(const toml::table* table, reader.Table(root, "", "compression"));
  if (table == nullptr) return Status::Ok();
  RETURN_IF_ERROR(reader.CheckKeys(*table, "compression", kCompressionKeys));
  std::vector<std::string_view> names, dense;
  for (const auto& known : job_spec_names::kEncodings) {
    names.push_back(known.name);
    if (known.encoding != v1::ENCODING_TOPK) dense.push_back(known.name);
  }
  v1::UpdateCompressionSpec* out = spec->mutable_compression();
  ASSIGN_OR_RETURN(const v1::Encoding download, ReadEncoding(*table, reader, "download", dense));
  if (download != v1::ENCODING_FLOAT32) out->set_download(download);
  ASSIGN_OR_RETURN(const v1::Encoding encoding, ReadEncoding(*table, reader, "encoding", names));
  out->set_encoding(encoding);
  const std::string name = UpdateEncodingName(wire::JobUpdateEncoding(*spec));
  if (encoding != v1::ENCODING_TOPK) {
    if (reader.Has(*table, "compression", "fraction")) {
      return reader.Error("compression.fraction", "applies to encoding \"topk\" only; encoding is \"" + EscapeUntrusted(name) + "\"");
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
                                                    FormatExact(fraction));
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
                                                        FormatExact(wire::kMaxOverSelection) + "], got " +
                                                        FormatExact(over_selection));
  }
  out->set_over_selection(over_selection);
  if (policy != "utility") {
    if (reader.Has(*table, "selection", "straggler_penalty")) {
      return reader.Error("selection.straggler_penalty", "applies to policy \"utility\" only; policy is \"" + EscapeUntrusted(policy) + "\"");
    }
    return Status::Ok();
  }
  double alpha = wire::kDefaultStragglerPenalty;
  RETURN_IF_ERROR(reader.Number(*table, "selection", "straggler_penalty", &alpha));
  if (!(alpha >= 0.0 && alpha <= wire::kMaxStragglerPenalty)) {
    return reader.Error("selection.straggler_penalty", "must be in [0, " +
                                                           FormatExact(wire::kMaxStragglerPenalty) + "], got " +
                                                           FormatExact(alpha));
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
    return reader.Error("async.staleness_exponent", "must be in [0, " + FormatExact(wire::kMaxStalenessExponent) +
                                                        "], got " + FormatExact(exponent));
  }
  out->set_staleness_exponent(exponent);
  return Status::Ok();
}

}  // namespace tessera::job_spec_internal
