// ValidateJobSpec and what it calls: every field of a job spec checked against its bounds before
// anything is built from it (declared in proto/job_mapping.h).
#include "proto/job_mapping.h"

#include <algorithm>
#include <bitset>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <tuple>

#include "base/escape.h"
#include "base/format.h"
#include "core/data/idx.h"
#include "proto/update_envelope.h"

namespace tessera::wire {
namespace {

// A string from the spec as an error shows it: quoted, escaped and cut.
std::string Shown(const std::string& value) { return "\"" + EscapeUntrusted(value) + "\""; }

// A number with every digit a double holds, where six would round it to what it is refused
// for being (0.99999998 shown as 1).
std::string FormatExactly(double value) {
  char text[40];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

std::string Mebibytes(int64_t bytes) { return FormatNumber(static_cast<double>(bytes) / (1 << 20)) + " MiB"; }

Status Refused(const std::string& field, const std::string& expected, const std::string& got) {
  return InvalidArgumentError("spec." + field + ": expected " + expected + ", got " + got);
}

// spec.aggregation, for a model of `parameters` parameters; the participation numbers are
// already in range.
Status ValidateAggregation(const v1::JobSpec& s, int64_t parameters) {
  const v1::RobustAggregationSpec& a = s.aggregation();
  const std::string rule = a.rule().empty() ? "mean" : a.rule();
  if (rule != "mean" && rule != "median" && rule != "trimmed-mean" && rule != "krum") {
    return Refused("aggregation.rule", kAggregationRuleNames, Shown(a.rule()));
  }
  auto not_for = [&rule](const std::string& field, const std::string& applies_to, const std::string& value) {
    return Refused(field, "no value for rule \"" + rule + "\" (it applies to " + applies_to + ")", value);
  };
  if (rule != "trimmed-mean" && a.trim_fraction() != 0) {
    return not_for("aggregation.trim_fraction", "trimmed-mean", FormatNumber(a.trim_fraction()));
  }
  if (rule != "krum" && a.byzantine_clients() != 0) {
    return not_for("aggregation.byzantine_clients", "krum", std::to_string(a.byzantine_clients()));
  }
  if (rule != "krum" && a.selected() != 0) return not_for("aggregation.selected", "krum", std::to_string(a.selected()));
  if (rule == "mean") return Status::Ok();

  const uint32_t clients = s.clients_per_round();
  const uint32_t least = s.min_clients();  // the fewest updates a round may close with
  if (rule == "trimmed-mean") {
    if (!(a.trim_fraction() >= 0 && a.trim_fraction() < 0.5)) {
      return Refused("aggregation.trim_fraction",
                     "a fraction in [0, 0.5) (0: the default, " + FormatNumber(kDefaultTrimFraction) + ")",
                     FormatNumber(a.trim_fraction()));
    }
    const double fraction = a.trim_fraction() > 0 ? a.trim_fraction() : kDefaultTrimFraction;
    if (std::floor(fraction * clients + 1e-9) < 1) {
      return Refused("aggregation.trim_fraction",
                     "a fraction that cuts at least one update from each side of a round of clients_per_round (" +
                         std::to_string(clients) + ") updates, at least 1/" + std::to_string(clients),
                     FormatNumber(fraction));
    }
  }
  if (rule == "krum") {
    const uint64_t f = a.byzantine_clients();
    if (least < 3) {
      return Refused("min_clients", "at least 3 for rule \"krum\" (it needs more than 2f + 2 updates)",
                     std::to_string(least));
    }
    if (uint64_t{least} <= 2 * f + 2) {
      return Refused("aggregation.byzantine_clients",
                     "f with min_clients (" + std::to_string(least) +
                         ") > 2f + 2, Krum's condition (Blanchard et al. 2017): at most " + std::to_string((least - 3) / 2),
                     std::to_string(f));
    }
    const uint64_t m = a.selected() > 0 ? a.selected() : 1;
    if (m > least - f) {
      return Refused("aggregation.selected",
                     "at most min_clients - byzantine_clients (" + std::to_string(least - f) + ")", std::to_string(m));
    }
  }
  // Every accepted update is held until the round closes: with over-selection, the updates of
  // every selected client may be in hand by then (those folding when clients_per_round were
  // accepted count too), and Krum adds its matrix of distances between them.
  const uint32_t held = SelectionCount(s, std::numeric_limits<uint32_t>::max());
  double bytes = static_cast<double>(held) * static_cast<double>(parameters) * sizeof(float);
  if (rule == "krum") bytes += static_cast<double>(held) * held * sizeof(double);
  if (bytes > static_cast<double>(kMaxRetainedUpdateBytes)) {
    const std::string selected =
        held == clients ? std::to_string(held) + " clients" : std::to_string(held) + " clients selected (clients_per_round " +
                                                                 std::to_string(clients) + " with over_selection)";
    return Refused("aggregation.rule",
                   "a round the coordinator can hold: rule \"" + rule +
                       "\" keeps every update until the round closes, the selected clients x parameters x 4 bytes" +
                       (rule == "krum" ? " (and Krum's distances, clients^2 x 8 bytes)" : "") + " within " +
                       Mebibytes(kMaxRetainedUpdateBytes),
                   selected + " x " + std::to_string(parameters) + " parameters (" + FormatNumber(bytes / (1 << 20)) +
                       " MiB)");
  }
  return Status::Ok();
}

// spec.compression: a known encoding, top-k's fraction where it applies, and no compression
// where it cannot apply (docs/JOBS.md, "[compression]").
Status ValidateCompression(const v1::JobSpec& s) {
  const auto& c = s.compression();
  auto bad = [](const std::string& field, const std::string& expected, const std::string& got) {
    return InvalidArgumentError("spec.compression." + field + ": expected " + expected + ", got " + got);
  };
  const std::string strategy = s.strategy().empty() ? "fedavg" : s.strategy();
  auto download = ToUpdateEncoding(c.download());
  if (!download.ok() || *download == UpdateEncoding::kTopK) {
    return bad("download", "one of \"float32\", \"float16\", \"bfloat16\" or \"int8\" (a dense encoding of the model)",
               download.ok() ? std::string("\"topk\"") : std::to_string(c.download()));
  }
  if (*download != UpdateEncoding::kFloat32 && strategy == "scaffold") {
    return bad("download", "\"float32\" for strategy \"scaffold\" (each participant downloads its own control variates "
               "beside the model, in float32)", std::string("\"") + UpdateEncodingName(*download) + "\"");
  }
  auto encoding = ToUpdateEncoding(c.encoding());
  if (!encoding.ok()) return bad("encoding", std::string("one of ") + kEncodingNames, std::to_string(c.encoding()));
  if (*encoding == UpdateEncoding::kTopK) {
    if (!(c.fraction() > 0 && c.fraction() <= 1)) {
      return bad("fraction", "a number in (0, 1] for encoding \"topk\" (the share of each tensor sent)",
                 FormatNumber(c.fraction()));
    }
  } else if (c.fraction() != 0) {
    return bad("fraction", std::string("no value for encoding \"") + UpdateEncodingName(*encoding) +
                               "\" (it applies to topk)",
               FormatNumber(c.fraction()));
  }
  if (*encoding == UpdateEncoding::kFloat32) return Status::Ok();
  if (strategy == "scaffold") {
    return bad("encoding", "\"float32\" for strategy \"scaffold\" (its control variates need the exact delta)",
               std::string("\"") + UpdateEncodingName(*encoding) + "\"");
  }
  const std::string& rule = s.aggregation().rule();
  if (*encoding == UpdateEncoding::kTopK && !rule.empty() && rule != "mean") {
    return bad("encoding", "a dense encoding with aggregation rule " + Shown(rule) +
                               " (a robust rule over sparse updates reads the entries a client did not send as 0)",
               "\"topk\"");
  }
  return Status::Ok();
}

// spec.async: FedBuff's options, and what cannot apply with them.
Status ValidateAsync(const v1::JobSpec& s) {
  auto bad = [](const std::string& field, const std::string& expected, const std::string& got) {
    return InvalidArgumentError("spec." + field + ": expected " + expected + ", got " + got);
  };
  auto range = [&bad](const std::string& field, uint64_t value, uint64_t min, uint64_t max) {
    if (value >= min && value <= max) return Status::Ok();
    return bad(field, "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]", std::to_string(value));
  };
  const v1::AsyncSpec& a = s.async();
  RETURN_IF_ERROR(range("async.buffer_size", a.buffer_size(), 1, kMaxParties));
  RETURN_IF_ERROR(range("async.max_staleness", a.max_staleness(), 0, kMaxRounds));
  RETURN_IF_ERROR(range("async.concurrency", a.concurrency(), 1, kMaxParties));
  const std::string& weighting = a.staleness_weighting();
  if (weighting != "polynomial" && weighting != "constant") {
    return bad("async.staleness_weighting", kStalenessWeightingNames, Shown(weighting));
  }
  const double exponent = a.staleness_exponent();
  if (!(std::isfinite(exponent) && exponent >= 0 && exponent <= kMaxStalenessExponent)) {
    return bad("async.staleness_exponent", "a number in [0, " + FormatNumber(kMaxStalenessExponent) + "]", FormatNumber(exponent));
  }
  if (weighting == "constant" && exponent != 0) {
    return bad("async.staleness_exponent", "0 with staleness_weighting \"constant\" (it applies to \"polynomial\")",
               FormatNumber(exponent));
  }
  const auto& p = s.data().partition();
  if (p.kind() != v1::PARTITION_LOCAL_FILES && a.concurrency() > p.parties()) {
    return bad("async.concurrency", "at most data.partition.parties (" + std::to_string(p.parties()) +
                                        "): each client training holds a party",
               std::to_string(a.concurrency()));
  }
  // A server step applies the staleness-weighted mean of the buffer; FedNova's normalised
  // mean and SCAFFOLD's control variates are made for the clients of one synchronous round,
  // and the robust rules compare the updates of one round.
  if (s.strategy() == "fednova" || s.strategy() == "scaffold") {
    return bad("strategy", "fedavg, fedavgm, fedadam, fedyogi, fedadagrad or fedprox with an asynchronous job "
                           "(async: a server step applies a buffered mean)",
               Shown(s.strategy()));
  }
  if (!s.aggregation().rule().empty() && s.aggregation().rule() != "mean") {
    return bad("aggregation.rule", "\"mean\" with an asynchronous job (async: a server step applies a buffered "
                                   "mean; the robust rules compare one round's updates)",
               Shown(s.aggregation().rule()));
  }
  // What the asynchronous driver does not do (yet): pick clients by a policy, encode the
  // updates, evaluate on the workers.
  if (!SelectionPolicy(s).empty() && SelectionPolicy(s) != "random") {
    return bad("selection.policy", "\"random\" with an asynchronous job (async keeps every idle client training)",
               Shown(SelectionPolicy(s)));
  }
  if (s.selection().over_selection() != 0) {
    return bad("selection.over_selection", "none with an asynchronous job (async has no rounds to over-select for)",
               FormatNumber(s.selection().over_selection()));
  }
  if (s.compression().encoding() != v1::ENCODING_UNSPECIFIED && s.compression().encoding() != v1::ENCODING_FLOAT32) {
    return bad("compression.encoding", "\"float32\" with an asynchronous job (compressed updates are for synchronous "
                                       "rounds)",
               std::to_string(s.compression().encoding()));
  }
  if (s.evaluation().federated()) {
    return bad("evaluation.federated", "false with an asynchronous job (federated evaluation is for synchronous "
                                       "rounds)",
               "true");
  }
  return Status::Ok();
}

// spec.data.partition.party_labels: only for label-quantity, one set per party, each of
// labels_per_party distinct labels (the dataset's classes are checked with the data).
Status ValidatePartyLabels(const v1::PartitionSpec& p) {
  if (p.party_labels_size() == 0) return Status::Ok();
  if (p.kind() != v1::PARTITION_LABEL_QUANTITY) {
    return Refused("data.partition.party_labels", "no label sets unless data.partition.kind is \"label-quantity\"",
                   std::to_string(p.party_labels_size()) + " sets");
  }
  if (static_cast<uint32_t>(p.party_labels_size()) != p.parties()) {
    return Refused("data.partition.party_labels", "one set per party (" + std::to_string(p.parties()) + ")",
                   std::to_string(p.party_labels_size()) + " sets");
  }
  const uint32_t k = p.labels_per_party() > 0 ? p.labels_per_party() : 2;
  if (uint64_t{p.parties()} * k > kMaxPartyLabels) {
    return Refused("data.partition.party_labels", "at most " + std::to_string(kMaxPartyLabels) +
                                                      " labels in all (parties x labels_per_party)",
                   std::to_string(uint64_t{p.parties()} * k));
  }
  for (int i = 0; i < p.party_labels_size(); ++i) {
    const auto& labels = p.party_labels(i).labels();
    const std::string field = "data.partition.party_labels[" + std::to_string(i) + "]";
    if (static_cast<uint32_t>(labels.size()) != k) {
      return Refused(field, std::to_string(k) + " labels (labels_per_party)", std::to_string(labels.size()));
    }
    std::bitset<kMaxClasses> seen;
    for (uint32_t label : labels) {
      if (label >= kMaxClasses) return Refused(field, "labels below " + std::to_string(kMaxClasses), std::to_string(label));
      if (seen[label]) return Refused(field, "distinct labels", std::to_string(label) + " twice");
      seen[label] = true;
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateDataSpec(const v1::DataSpec& d) {
  auto bad = [](const std::string& field, const std::string& expected, const std::string& got) {
    return InvalidArgumentError("spec." + field + ": expected " + expected + ", got " + got);
  };
  const bool fashion = d.dataset().empty() || d.dataset() == "fashion-mnist";
  if (!fashion && !IsDatasetName(d.dataset())) {
    return bad("data.dataset", "\"fashion-mnist\" or a dataset's name (1 to 64 of [a-z0-9._-])", Shown(d.dataset()));
  }
  if (!d.format().empty() && !ParseDataFormat(d.format()).ok()) {
    return bad("data.format", "\"idx\", \"cifar10\", \"npz\" or \"csv\"", Shown(d.format()));
  }
  if (fashion && !d.format().empty() && d.format() != "idx") {
    return bad("data.format", "\"idx\" (or nothing) for fashion-mnist", Shown(d.format()));
  }
  if (!fashion && d.format().empty()) {
    return bad("data.format", "the format of dataset " + Shown(d.dataset()) + " (\"idx\", \"cifar10\", \"npz\" or \"csv\")",
               "nothing");
  }
  if (!d.label_column().empty()) {
    if (d.format() != "csv") return bad("data.label_column", "nothing unless data.format is \"csv\"", Shown(d.label_column()));
    if (d.label_column().size() > 64 || HasHiddenCharacters(d.label_column()) ||
        d.label_column().find(',') != std::string::npos) {
      return bad("data.label_column", "at most 64 bytes without commas or control characters", Shown(d.label_column()));
    }
  }
  if (d.mean_size() != d.std_size()) {
    return bad("data.std", "as many values as data.mean (" + std::to_string(d.mean_size()) + ")", std::to_string(d.std_size()));
  }
  if (d.mean_size() > kMaxNormalisationChannels) {
    return bad("data.mean", "at most " + std::to_string(kMaxNormalisationChannels) + " values", std::to_string(d.mean_size()));
  }
  if (fashion && d.mean_size() > 1) {
    return bad("data.mean", "at most one value for fashion-mnist (one channel; unset: its own statistics)",
               std::to_string(d.mean_size()) + " values");
  }
  for (int i = 0; i < d.mean_size(); ++i) {
    if (!std::isfinite(d.mean(i)) || std::abs(d.mean(i)) > 1e6) {
      return bad("data.mean[" + std::to_string(i) + "]", "a finite number within 1e6", FormatNumber(d.mean(i)));
    }
    // A subnormal std has no finite reciprocal: every normalised value would be infinite.
    if (!(d.std(i) > 0) || !std::isnormal(d.std(i)) || !std::isfinite(1.0f / d.std(i)) || d.std(i) > 1e6) {
      return bad("data.std[" + std::to_string(i) + "]",
                 "a positive number from " + FormatNumber(std::numeric_limits<float>::min()) +
                     " (so that 1/std is finite) to 1e6",
                 FormatNumber(d.std(i)));
    }
  }
  if (d.augment().crop_padding() > kMaxCropPadding) {
    return bad("data.augment.crop_padding", "at most " + std::to_string(kMaxCropPadding),
               std::to_string(d.augment().crop_padding()));
  }
  if (d.classes() == 1 || d.classes() > kMaxClasses) {
    return bad("data.classes", "2 to " + std::to_string(kMaxClasses) + " (0: inferred from the labels)",
               std::to_string(d.classes()));
  }
  if (d.has_input_shape()) {
    const v1::InputShape& shape = d.input_shape();
    for (const auto& [field, value, max] : {std::tuple<const char*, uint32_t, uint32_t>{"channels", shape.channels(), kMaxInputDim},
                                            {"rows", shape.rows(), kMaxInputDim},
                                            {"cols", shape.cols(), kMaxInputDim},
                                            {"classes", shape.classes(), kMaxClasses}}) {
      if (value < 1 || value > max) {
        return bad(std::string("data.input_shape.") + field, "1 to " + std::to_string(max) + " (the coordinator fills it)",
                   std::to_string(value));
      }
    }
    if (uint64_t{shape.channels()} * shape.rows() * shape.cols() > kMaxSampleValues) {
      return bad("data.input_shape", "at most " + std::to_string(kMaxSampleValues) + " values a sample",
                 std::to_string(shape.channels()) + "x" + std::to_string(shape.rows()) + "x" + std::to_string(shape.cols()));
    }
    if (d.classes() != 0 && d.classes() != shape.classes()) {
      return bad("data.input_shape.classes", "data.classes (" + std::to_string(d.classes()) + ")",
                 std::to_string(shape.classes()));
    }
    if (d.augment().crop_padding() > 0 && shape.rows() < 2) {
      return bad("data.augment.crop_padding", "0 for samples that are not images (" + std::to_string(shape.rows()) + " row)",
                 std::to_string(d.augment().crop_padding()));
    }
  }
  const uint32_t classes = d.classes()            ? d.classes()
                           : d.has_input_shape() ? d.input_shape().classes()
                           : fashion             ? 10
                                                 : kMaxClasses;
  if (d.partition().labels_per_party() > classes) {
    return bad("data.partition.labels_per_party", "[0, " + std::to_string(classes) + "] (the dataset's classes)",
               std::to_string(d.partition().labels_per_party()));
  }
  for (int p = 0; p < d.partition().party_labels_size(); ++p) {
    for (uint32_t label : d.partition().party_labels(p).labels()) {
      if (label >= classes) {
        return bad("data.partition.party_labels[" + std::to_string(p) + "]",
                   "labels in [0, " + std::to_string(classes) + ") (the dataset's classes)", std::to_string(label));
      }
    }
  }
  return Status::Ok();
}

UpdateEncoding JobUpdateEncoding(const v1::JobSpec& spec) {
  auto encoding = ToUpdateEncoding(spec.compression().encoding());
  return encoding.ok() ? *encoding : UpdateEncoding::kFloat32;
}

UpdateEncoding JobDownloadEncoding(const v1::JobSpec& spec) {
  auto encoding = ToUpdateEncoding(spec.compression().download());
  return encoding.ok() && *encoding != UpdateEncoding::kTopK ? *encoding : UpdateEncoding::kFloat32;
}

double TopKFraction(const v1::JobSpec& spec) {
  return JobUpdateEncoding(spec) == UpdateEncoding::kTopK ? spec.compression().fraction() : 0;
}
bool IsAsync(const v1::JobSpec& spec) { return spec.has_async(); }

Status ValidateJobSpec(const v1::JobSpec& s) {
  auto bad = [](const std::string& field, const std::string& expected, const std::string& got) {
    return InvalidArgumentError("spec." + field + ": expected " + expected + ", got " + got);
  };
  // An unsigned field in [min, max].
  auto range = [&bad](const std::string& field, uint64_t value, uint64_t min, uint64_t max) {
    if (value >= min && value <= max) return Status::Ok();
    return bad(field, "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]", std::to_string(value));
  };
  // A floating-point field in (0, max], or [0, max] when zero is allowed (a default).
  auto real = [&bad](const std::string& field, double value, double max, bool zero_allowed, const std::string& zero_means) {
    const bool ok = std::isfinite(value) && (zero_allowed ? value >= 0 : value > 0) && value <= max;
    if (ok) return Status::Ok();
    return bad(field, std::string("a number in ") + (zero_allowed ? "[0, " : "(0, ") + FormatNumber(max) + "]" + zero_means,
               FormatNumber(value));
  };
  if (s.name().size() > 128 || HasHiddenCharacters(s.name())) {
    return bad("name", "at most 128 bytes without control characters", Shown(s.name()));
  }
  if (s.data().path().size() > 4096 || HasHiddenCharacters(s.data().path())) {
    return bad("data.path", "a directory path of at most 4096 bytes without control characters",
               Shown(s.data().path()));
  }
  RETURN_IF_ERROR(range("rounds", s.rounds(), 1, kMaxRounds));
  RETURN_IF_ERROR(range("clients_per_round", s.clients_per_round(), 1, kMaxParties));
  RETURN_IF_ERROR(range("min_clients", s.min_clients(), 1, kMaxParties));
  if (s.min_clients() > s.clients_per_round()) {
    return bad("min_clients", "at most clients_per_round (" + std::to_string(s.clients_per_round()) + ")",
               std::to_string(s.min_clients()));
  }
  RETURN_IF_ERROR(range("round_deadline_ms", s.round_deadline_ms(), 1, kMaxRoundDeadlineMs));
  RETURN_IF_ERROR(range("local_epochs", s.local_epochs(), 1, kMaxLocalEpochs));
  RETURN_IF_ERROR(range("batch_size", s.batch_size(), 1, kMaxBatchSize));
  RETURN_IF_ERROR(range("max_round_attempts", s.max_round_attempts(), 0, kMaxRoundAttempts));
  RETURN_IF_ERROR(range("data.max_train_samples", s.data().max_train_samples(), 0, kMaxSamplesCut));
  RETURN_IF_ERROR(range("data.max_test_samples", s.data().max_test_samples(), 0, kMaxSamplesCut));
  const auto& o = s.optimizer();
  if (!o.name().empty() && o.name() != "sgd") return bad("optimizer.name", "\"sgd\"", Shown(o.name()));
  RETURN_IF_ERROR(real("optimizer.learning_rate", o.learning_rate(), kMaxLearningRate, false, ""));
  if (!(o.momentum() >= 0 && o.momentum() < 1)) return bad("optimizer.momentum", "a value in [0, 1)", FormatNumber(o.momentum()));
  // The trainer's momentum is a float: a double just below 1 would round to 1 there.
  if (!(static_cast<float>(o.momentum()) < 1.0f)) {
    return bad("optimizer.momentum", "a value in [0, 1) that stays below 1 as a float (at most 0.99999994)",
               FormatExactly(o.momentum()));
  }
  RETURN_IF_ERROR(real("optimizer.weight_decay", o.weight_decay(), kMaxWeightDecay, true, ""));
  const std::string strategy = s.strategy().empty() ? "fedavg" : s.strategy();
  const bool momentum_strategy = strategy == "fedavgm";
  const bool adaptive = strategy == "fedadam" || strategy == "fedyogi" || strategy == "fedadagrad";
  const bool client_side = strategy == "fedprox" || strategy == "fednova" || strategy == "scaffold";
  if (strategy != "fedavg" && !momentum_strategy && !adaptive && !client_side) {
    return bad("strategy", "one of " + std::string(kStrategyNames), Shown(s.strategy()));
  }
  // FedProx's mu: positive for fedprox, absent for everything else.
  if (strategy == "fedprox") {
    RETURN_IF_ERROR(real("proximal_mu", s.proximal_mu(), kMaxProximalMu, false, " for strategy \"fedprox\""));
  } else if (s.proximal_mu() != 0) {
    return bad("proximal_mu", "0 for strategy \"" + strategy + "\" (it applies to fedprox)", FormatNumber(s.proximal_mu()));
  }
  if (strategy == "scaffold" && o.learning_rate() < kMinScaffoldLearningRate) {
    return bad("optimizer.learning_rate",
               "at least 1e-6 for strategy \"scaffold\" (a client's control-variate change is bounded by "
               "max_update_norm / learning_rate)",
               FormatNumber(o.learning_rate()));
  }
  // FedNova and SCAFFOLD aggregate in their own way: the mean of normalised updates, the mean
  // of the deltas and the control variates.
  if ((strategy == "fednova" || strategy == "scaffold") && !s.aggregation().rule().empty() &&
      s.aggregation().rule() != "mean") {
    return bad("aggregation.rule", "\"mean\" for strategy \"" + strategy + "\" (it aggregates in its own way)",
               Shown(s.aggregation().rule()));
  }
  const auto& server = s.server();
  // A server option set for a strategy it does not apply to.
  auto not_for = [&bad, &strategy](const std::string& field, const std::string& applies_to, double value) {
    return bad(field, "no value for strategy \"" + strategy + "\" (it applies to " + applies_to + ")", FormatNumber(value));
  };
  RETURN_IF_ERROR(real("server.learning_rate", server.learning_rate(), kMaxServerLearningRate, true, " (0: the default)"));
  if (!(server.momentum() >= 0 && server.momentum() < 1)) {
    return bad("server.momentum", "a value in [0, 1)", FormatNumber(server.momentum()));
  }
  if ((strategy == "fedavg" || client_side) && (server.learning_rate() != 0 || server.momentum() != 0 ||
                                                 server.has_beta1() || server.has_beta2() || server.tau() != 0)) {
    return bad("server", "no server options for strategy \"" + strategy +
                             "\" (they apply to fedavgm, fedadam, fedyogi and fedadagrad)",
               "a server option set");
  }
  if (!momentum_strategy && server.momentum() != 0) return not_for("server.momentum", "fedavgm", server.momentum());
  if (server.has_beta1()) {
    if (!adaptive) return not_for("server.beta1", "fedadam, fedyogi and fedadagrad", server.beta1());
    if (!(server.beta1() >= 0 && server.beta1() < 1)) return bad("server.beta1", "a value in [0, 1)", FormatNumber(server.beta1()));
  }
  if (server.has_beta2()) {
    if (strategy != "fedadam" && strategy != "fedyogi") return not_for("server.beta2", "fedadam and fedyogi", server.beta2());
    if (!(server.beta2() >= 0 && server.beta2() < 1)) return bad("server.beta2", "a value in [0, 1)", FormatNumber(server.beta2()));
  }
  if (server.tau() != 0 && !adaptive) return not_for("server.tau", "fedadam, fedyogi and fedadagrad", server.tau());
  RETURN_IF_ERROR(real("server.tau", server.tau(), kMaxTau, true, " (0: the default, " + FormatNumber(kDefaultTau) + ")"));
  const std::string& policy = s.update_norm_policy();
  if (!policy.empty() && policy != "refuse" && policy != "clip") {
    return bad("update_norm_policy", "\"refuse\" or \"clip\"", Shown(policy));
  }
  RETURN_IF_ERROR(real("max_update_norm", s.max_update_norm(), kMaxUpdateNormLimit, true,
                       " (0: the default, " + FormatNumber(kDefaultMaxUpdateNorm) + ")"));
  const auto& m = s.model();
  if (const auto known = KnownModelNames(); std::find(known.begin(), known.end(), m.name()) == known.end()) {
    std::string names;
    for (const auto& name : known) names += (names.empty() ? "one of \"" : ", \"") + name + "\"";
    return bad("model.name", names, Shown(m.name()));
  }
  if (!m.trainer().empty() && !IsTrainerName(m.trainer())) {
    return bad("model.trainer", "a trainer name of 1 to 64 characters from [a-z0-9._-] (the workers map it to a command)",
               Shown(m.trainer()));
  }
  if (!m.trainer().empty() && (s.strategy() == "fedprox" || s.strategy() == "fednova" || s.strategy() == "scaffold")) {
    return bad("model.trainer", "no external trainer with strategy \"" + s.strategy() +
                                    "\" (its client side runs in Tessera's native training)",
               Shown(m.trainer()));
  }
  if (!m.trainer().empty() && s.evaluation().federated()) {
    return bad("evaluation.federated", "false with an external trainer (workers evaluate natively)", "true");
  }
  if (!m.trainer().empty() && !s.collective_backend().empty() && s.collective_backend() != "auto") {
    return bad("collective_backend", "none with an external trainer (site cohorts train natively)",
               Shown(s.collective_backend()));
  }
  if (m.name() != "mlp" && m.hidden_size() > 0) return bad("model.hidden", "no widths for model \"" + m.name() + "\"", "a list");
  if (m.name() == "declared" && m.layers_size() == 0) return bad("model.layers", "at least one layer for model \"declared\"", "none");
  if (m.name() != "declared" && m.layers_size() > 0) {
    return bad("model.layers", "no layers for model \"" + m.name() + "\" (declared layers need model \"declared\")",
               std::to_string(m.layers_size()) + " layers");
  }
  // Counted before anything is converted: at most two levels (residual blocks hold plain
  // layers), kMaxDeclaredLayers in all.
  {
    int64_t total = m.layers_size();
    for (const v1::LayerSpec& layer : m.layers()) {
      total += layer.body_size() + layer.shortcut_size();
      for (const auto* path : {&layer.body(), &layer.shortcut()}) {
        for (const v1::LayerSpec& sub : *path) {
          if (sub.body_size() + sub.shortcut_size() > 0) {
            return bad("model.layers", "residual blocks that hold plain layers only", "a nested residual block");
          }
        }
      }
    }
    if (total > kMaxDeclaredLayers) {
      return bad("model.layers", "at most " + std::to_string(kMaxDeclaredLayers) + " layers in all", std::to_string(total));
    }
  }
  if (m.hidden_size() > kMaxHiddenLayers) {
    return bad("model.hidden", "at most " + std::to_string(kMaxHiddenLayers) + " hidden layers",
               std::to_string(m.hidden_size()));
  }
  for (int i = 0; i < m.hidden_size(); ++i) {
    RETURN_IF_ERROR(range("model.hidden[" + std::to_string(i) + "]", m.hidden(i), 1, kMaxHiddenWidth));
  }
  RETURN_IF_ERROR(ValidateDataSpec(s.data()));  // first: the model is built for the data's shape
  // A dataset other than Fashion-MNIST has its shape once the coordinator has read its copy
  // (data.input_shape, filled at submit, where the spec is checked again with it): until then
  // the model is not built against Fashion-MNIST's 1x28x28, which would refuse models made for
  // the dataset (a grouped convolution over three channels, a kernel over 28).
  int64_t parameters = 0;
  if (s.data().has_input_shape() || IsFashionMnist(s)) {
    // Counted from the layers' shapes: nothing is allocated before the size is known to fit.
    auto counted = CountParameters(ToModelConfig(s));
    if (!counted.ok()) return bad("model", "a model that can be built", counted.status().message());
    parameters = *counted;
    auto memory = EstimateModelMemoryBytes(s);
    if (!memory.ok() || *memory > kMaxModelMemoryBytes) {
      return bad("model", "a model the coordinator can hold: parameters x 4 bytes x " +
                              std::to_string(CoordinatorModelCopies(s)) + " copies" +
                              (s.strategy() == "scaffold" ? " (scaffold: " + std::to_string(kScaffoldModelCopiesPerParty) +
                                                                " per party)"
                                                          : std::string()) +
                              " within " + Mebibytes(kMaxModelMemoryBytes),
                 std::to_string(parameters) + " parameters (an estimated " +
                     (memory.ok() ? Mebibytes(*memory) : std::string("uncountable amount")) + ")");
    }
  }
  RETURN_IF_ERROR(ValidateAggregation(s, parameters));
  RETURN_IF_ERROR(ValidateCompression(s));
  const auto& p = s.data().partition();
  RETURN_IF_ERROR(range("data.partition.parties", p.parties(), p.kind() == v1::PARTITION_LOCAL_FILES ? 0 : 1, kMaxParties));
  RETURN_IF_ERROR(real("data.partition.beta", p.beta(), kMaxBeta, true, " (0: the default, 0.5)"));
  if (p.beta() != 0 && p.beta() < kMinBeta) {
    return bad("data.partition.beta",
               "0 (the default, 0.5) or a number from " + FormatNumber(kMinBeta) + " (no smaller beta skews more) to " +
                   FormatNumber(kMaxBeta),
               FormatNumber(p.beta()));
  }
  RETURN_IF_ERROR(range("data.partition.labels_per_party", p.labels_per_party(), 0, kMaxLabelsPerParty));
  RETURN_IF_ERROR(ValidatePartyLabels(p));
  // SCAFFOLD keeps a control variate per party and scales the server's by |S|/N: it needs
  // the parties to be the partition's, a known number; workers' own files seat any number.
  if (s.strategy() == "scaffold" && p.kind() == v1::PARTITION_LOCAL_FILES) {
    return bad("data.partition.kind", "a shared partition for strategy \"scaffold\" (it keeps a control variate per "
                                      "party, N = data.partition.parties)",
               "local-files");
  }
  if (p.kind() != v1::PARTITION_LOCAL_FILES) {
    if (s.clients_per_round() > p.parties()) {
      return bad("clients_per_round", "at most data.partition.parties (" + std::to_string(p.parties()) + ")",
                 std::to_string(s.clients_per_round()));
    }
    auto partition = ToPartitionConfig(s);
    if (!partition.ok()) return partition.status();
    // A shared partition cuts the first max_train_samples among the parties ("local-files"
    // cuts each worker's own files to that many), and each worker reads its share from
    // data.path (Fashion-MNIST has a default directory): as tessera check says, for a spec
    // that came another way.
    if (s.data().max_train_samples() != 0 && s.data().max_train_samples() < p.parties()) {
      return bad("data.max_train_samples",
                 "0 (all) or at least data.partition.parties (" + std::to_string(p.parties()) +
                     "): a shared partition gives each party at least one sample",
                 std::to_string(s.data().max_train_samples()));
    }
    if (!IsFashionMnist(s) && s.data().path().empty()) {
      return bad("data.path",
                 "the workers' directory of dataset " + Shown(s.data().dataset()) +
                     " for a shared partition (only kind \"local-files\" reads each worker's own --data-dir)",
                 "none");
    }
  }
  for (const auto& [field, value] : {std::pair<const char*, const std::string*>{"device", &s.device()},
                                     {"fallback_device", &s.fallback_device()},
                                     {"collective_backend", &s.collective_backend()}}) {
    if (value->size() > 64 || HasHiddenCharacters(*value)) {
      return bad(field, "at most 64 bytes without control characters", Shown(*value));
    }
  }
  if (!s.device().empty() && s.device() != "cpu" && s.device().rfind("emu:", 0) != 0 && s.device() != "cuda" &&
      s.device() != "xrt") {
    return bad("device", "a device class (cpu, cuda, xrt or emu:PROFILE)", Shown(s.device()));
  }
  if (!s.fallback_device().empty() && s.fallback_device() != "cpu" && s.fallback_device().rfind("emu:", 0) != 0 &&
      s.fallback_device() != "cuda" && s.fallback_device() != "xrt") {
    return bad("fallback_device", "a device class (cpu, cuda, xrt or emu:PROFILE)", Shown(s.fallback_device()));
  }
  if (s.fallback_device().rfind("emu:", 0) == 0) {
    // A worker falls back only to a profile built into it (emu:edge-npu, ...), never to a
    // profile file the job would name on the worker's disk.
    const std::string_view profile = std::string_view(s.fallback_device()).substr(4);
    const bool plain = !profile.empty() && std::all_of(profile.begin(), profile.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
    });
    if (!plain) {
      return bad("fallback_device", "emu: and a built-in profile's name (lower-case letters, digits and '-')",
                 Shown(s.fallback_device()));
    }
  }
  const std::string& backend = s.collective_backend();
  if (!backend.empty() && backend != "auto" && backend != "gloo" && backend != "mpi" && backend != "nccl" &&
      backend != "p2p") {
    return bad("collective_backend", "auto, gloo, mpi, nccl or p2p", Shown(backend));
  }
  const std::string& policy_name = s.selection().policy();
  if (!policy_name.empty() && policy_name != "random" && policy_name != "deadline" && policy_name != "utility") {
    return bad("selection.policy", kSelectionPolicyNames, Shown(policy_name));
  }
  if (s.selection().has_over_selection()) {
    const double over = s.selection().over_selection();
    if (!(std::isfinite(over) && over >= 0 && over <= kMaxOverSelection)) {
      return bad("selection.over_selection", "a fraction in [0, " + FormatNumber(kMaxOverSelection) + "]", FormatNumber(over));
    }
  }
  if (s.selection().has_straggler_penalty()) {
    const double alpha = s.selection().straggler_penalty();
    if (policy_name != "utility") {
      return bad("selection.straggler_penalty", "no value for policy " + Shown(SelectionPolicy(s)) +
                                                    " (it applies to \"utility\")",
                 FormatNumber(alpha));
    }
    if (!(std::isfinite(alpha) && alpha >= 0 && alpha <= kMaxStragglerPenalty)) {
      return bad("selection.straggler_penalty", "a number in [0, " + FormatNumber(kMaxStragglerPenalty) + "]", FormatNumber(alpha));
    }
  }
  if (s.has_async()) RETURN_IF_ERROR(ValidateAsync(s));
  return Status::Ok();
}

}  // namespace tessera::wire
