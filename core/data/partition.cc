#include "core/data/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>

#include "base/format.h"

namespace tessera {
namespace {

constexpr int kMaxDraws = 10000;

// Every variate is derived from the engine's raw 64-bit outputs, which the standard fixes, so
// splits do not depend on a standard library's distribution implementations.
class PartitionRandom {
 public:
  explicit PartitionRandom(uint64_t seed) : engine_(seed) {}

  // Uniform in (0, 1).
  double UniformOpen() { return (static_cast<double>(engine_() >> 11) + 0.5) * 0x1.0p-53; }

  // Uniform in [0, n), unbiased (rejection of the top partial block).
  uint64_t Below(uint64_t n) {
    const uint64_t max = std::numeric_limits<uint64_t>::max();
    const uint64_t limit = max - (max % n + 1) % n;
    uint64_t x;
    do {
      x = engine_();
    } while (x > limit);
    return x % n;
  }

  template <typename T>
  void Shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[Below(i)]);
  }

  // Standard normal (Box-Muller, one value per pair of uniforms).
  double Normal() {
    const double u1 = UniformOpen();
    const double u2 = UniformOpen();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

  // The logarithm of a Gamma(alpha, 1) variate. Marsaglia and Tsang's method for alpha >= 1;
  // for alpha < 1, G(alpha) = G(alpha + 1) * U^(1/alpha), kept in logs so that tiny alphas
  // (which would underflow to 0) still give usable Dirichlet proportions.
  double LogGamma(double alpha) {
    if (alpha < 1.0) return LogGamma(alpha + 1.0) + std::log(UniformOpen()) / alpha;
    const double d = alpha - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * d);
    while (true) {
      double x = Normal();
      double v = 1.0 + c * x;
      if (v <= 0.0) continue;
      v = v * v * v;
      const double u = UniformOpen();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return std::log(d * v);
    }
  }

 private:
  std::mt19937_64 engine_;
};

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

// Proportions from log-gamma weights, over the parties marked eligible only (the others get 0).
// When no weight is usable (no party eligible, which happens only once every sample is placed
// and the class is empty, or every weight -infinity) the eligible parties, or all when none is,
// get equal shares: never NaN.
std::vector<double> NormalisedProportions(const std::vector<double>& log_weights, const std::vector<bool>& eligible) {
  double max_log = -std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < log_weights.size(); ++j) {
    if (eligible[j]) max_log = std::max(max_log, log_weights[j]);
  }
  std::vector<double> p(log_weights.size(), 0.0);
  double sum = 0.0;
  if (std::isfinite(max_log)) {
    for (size_t j = 0; j < log_weights.size(); ++j) {
      if (eligible[j]) sum += p[j] = std::exp(log_weights[j] - max_log);
    }
  }
  if (!(sum > 0.0) || !std::isfinite(sum)) {
    const bool any = std::find(eligible.begin(), eligible.end(), true) != eligible.end();
    for (size_t j = 0; j < p.size(); ++j) p[j] = !any || eligible[j] ? 1.0 : 0.0;
    sum = static_cast<double>(any ? std::count(eligible.begin(), eligible.end(), true) : eligible.size());
  }
  for (double& x : p) x /= sum;
  return p;
}

// Appends the consecutive runs of `items` cut at floor(cumsum(p) * n) to the parties.
void AppendCuts(const std::vector<int64_t>& items, const std::vector<double>& p,
                std::vector<std::vector<int64_t>>& parties) {
  const size_t n = items.size();
  double cumulative = 0.0;
  size_t begin = 0;
  for (size_t j = 0; j < parties.size(); ++j) {
    size_t end = n;
    if (j + 1 < parties.size()) {
      cumulative += p[j];
      // Clamped as a double: a cut is converted to an integer only once it is known to be in range.
      const double cut = std::floor(cumulative * static_cast<double>(n));
      end = cut >= static_cast<double>(n) ? n : cut > static_cast<double>(begin) ? static_cast<size_t>(cut) : begin;
    }
    parties[j].insert(parties[j].end(), items.begin() + static_cast<ptrdiff_t>(begin),
                      items.begin() + static_cast<ptrdiff_t>(end));
    begin = end;
  }
}

// Cuts `items` into `parts` runs whose sizes differ by at most 1 (larger runs first).
std::vector<std::vector<int64_t>> SplitEvenly(const std::vector<int64_t>& items, size_t parts) {
  std::vector<std::vector<int64_t>> out(parts);
  const size_t base = items.size() / parts;
  const size_t extra = items.size() % parts;
  size_t begin = 0;
  for (size_t j = 0; j < parts; ++j) {
    size_t size = base + (j < extra ? 1 : 0);
    out[j].assign(items.begin() + static_cast<ptrdiff_t>(begin), items.begin() + static_cast<ptrdiff_t>(begin + size));
    begin += size;
  }
  return out;
}

size_t MinSize(const std::vector<std::vector<int64_t>>& parties) {
  size_t m = std::numeric_limits<size_t>::max();
  for (const auto& p : parties) m = std::min(m, p.size());
  return m;
}

Status Validate(const std::vector<uint8_t>& labels, int num_classes, const PartitionConfig& config) {
  const std::string kind(PartitionKindName(config.kind));
  if (num_classes < 1 || num_classes > 256) {
    return InvalidArgumentError("partition: num_classes must be in [1, 256], got " + std::to_string(num_classes));
  }
  if (config.parties == 0) return InvalidArgumentError("partition.parties: must be at least 1, got 0");
  if (config.parties > labels.size()) {
    return InvalidArgumentError("partition.parties: " + std::to_string(config.parties) +
                                " parties exceed the " + std::to_string(labels.size()) + " samples to split");
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= num_classes) {
      return InvalidArgumentError("partition: label " + std::to_string(labels[i]) + " at index " + std::to_string(i) +
                                  " is outside [0, " + std::to_string(num_classes) + ")");
    }
  }
  if (config.kind == PartitionConfig::kDirichlet || config.kind == PartitionConfig::kQuantity) {
    if (!(config.beta >= kMinBeta) || !std::isfinite(config.beta)) {
      return InvalidArgumentError("partition.beta: must be a finite number of at least " + FormatNumber(kMinBeta) +
                                  " for " + kind + ", got " + FormatNumber(config.beta));
    }
    const uint64_t needed = uint64_t{config.parties} * kMinPartySize;
    if (labels.size() < needed) {
      return InvalidArgumentError("partition.parties: " + kind + " gives every party at least " +
                                  std::to_string(kMinPartySize) + " samples, so " + std::to_string(config.parties) +
                                  " parties need " + std::to_string(needed) + " samples, found " +
                                  std::to_string(labels.size()));
    }
  }
  if (config.kind == PartitionConfig::kLabelQuantity) {
    if (config.labels_per_party == 0 || config.labels_per_party > static_cast<uint32_t>(num_classes)) {
      return InvalidArgumentError("partition.labels_per_party: must be in [1, " + std::to_string(num_classes) +
                                  "] (the number of classes), got " + std::to_string(config.labels_per_party));
    }
    if (!config.party_labels.empty() && config.party_labels.size() != config.parties) {
      return InvalidArgumentError("partition.party_labels: expected one set of labels per party (" +
                                  std::to_string(config.parties) + "), got " +
                                  std::to_string(config.party_labels.size()));
    }
    for (size_t p = 0; p < config.party_labels.size(); ++p) {
      const std::vector<uint32_t>& set = config.party_labels[p];
      const std::string field = "partition.party_labels[" + std::to_string(p) + "]";
      if (set.size() != config.labels_per_party) {
        return InvalidArgumentError(field + ": expected labels_per_party (" + std::to_string(config.labels_per_party) +
                                    ") labels, got " + std::to_string(set.size()));
      }
      std::vector<bool> seen(static_cast<size_t>(num_classes), false);
      for (uint32_t label : set) {
        if (label >= static_cast<uint32_t>(num_classes)) {
          return InvalidArgumentError(field + ": label " + std::to_string(label) + " is outside [0, " +
                                      std::to_string(num_classes) + ")");
        }
        if (seen[label]) return InvalidArgumentError(field + ": label " + std::to_string(label) + " appears twice");
        seen[label] = true;
      }
    }
  }
  return Status::Ok();
}

std::vector<std::vector<int64_t>> SplitIid(size_t n, uint32_t parties, PartitionRandom& random) {
  std::vector<int64_t> all = Iota(static_cast<int64_t>(n));
  random.Shuffle(all);
  return SplitEvenly(all, parties);
}

Result<std::vector<std::vector<int64_t>>> SplitDirichlet(const std::vector<uint8_t>& labels, int num_classes,
                                                         const PartitionConfig& config, PartitionRandom& random) {
  const size_t parties = config.parties;
  std::vector<std::vector<int64_t>> by_class(static_cast<size_t>(num_classes));
  for (size_t i = 0; i < labels.size(); ++i) by_class[labels[i]].push_back(static_cast<int64_t>(i));
  const double fair_share = static_cast<double>(labels.size()) / static_cast<double>(parties);

  for (int draw = 0; draw < kMaxDraws; ++draw) {
    std::vector<std::vector<int64_t>> out(parties);
    for (int c = 0; c < num_classes; ++c) {
      std::vector<int64_t> items = by_class[static_cast<size_t>(c)];
      random.Shuffle(items);
      std::vector<double> log_weights(parties);
      for (double& w : log_weights) w = random.LogGamma(config.beta);
      // NIID-Bench's balancing: a party already at its fair share takes no more.
      std::vector<bool> eligible(parties);
      for (size_t j = 0; j < parties; ++j) eligible[j] = static_cast<double>(out[j].size()) < fair_share;
      AppendCuts(items, NormalisedProportions(log_weights, eligible), out);
    }
    if (MinSize(out) >= static_cast<size_t>(kMinPartySize)) {
      for (auto& party : out) random.Shuffle(party);
      return out;
    }
  }
  return FailedPreconditionError("partition: dirichlet with beta " + std::to_string(config.beta) + " over " +
                                 std::to_string(parties) + " parties left some party under " +
                                 std::to_string(kMinPartySize) + " samples in " + std::to_string(kMaxDraws) +
                                 " draws; raise partition.beta or lower partition.parties");
}

Result<std::vector<std::vector<int64_t>>> SplitLabelQuantity(const std::vector<uint8_t>& labels, int num_classes,
                                                             const PartitionConfig& config, PartitionRandom& random) {
  const size_t parties = config.parties;
  const size_t classes = static_cast<size_t>(num_classes);
  std::vector<std::vector<bool>> holds(parties, std::vector<bool>(classes, false));
  std::vector<size_t> holders(classes, 0);
  for (size_t i = 0; i < config.party_labels.size(); ++i) {
    for (uint32_t c : config.party_labels[i]) {
      holds[i][c] = true;
      ++holders[c];
    }
  }
  for (size_t i = 0; i < parties && config.party_labels.empty(); ++i) {
    size_t first = i % classes;
    holds[i][first] = true;
    ++holders[first];
    for (uint32_t taken = 1; taken < config.labels_per_party;) {
      size_t c = static_cast<size_t>(random.Below(classes));
      if (holds[i][c]) continue;
      holds[i][c] = true;
      ++holders[c];
      ++taken;
    }
  }
  std::vector<std::vector<int64_t>> by_class(classes);
  for (size_t i = 0; i < labels.size(); ++i) by_class[labels[i]].push_back(static_cast<int64_t>(i));

  std::vector<std::vector<int64_t>> out(parties);
  for (size_t c = 0; c < classes; ++c) {
    if (holders[c] == 0) continue;  // no party drew this label: its samples are left out
    random.Shuffle(by_class[c]);
    std::vector<std::vector<int64_t>> runs = SplitEvenly(by_class[c], holders[c]);
    size_t next = 0;
    for (size_t i = 0; i < parties; ++i) {
      if (!holds[i][c]) continue;
      out[i].insert(out[i].end(), runs[next].begin(), runs[next].end());
      ++next;
    }
  }
  // A party whose labels the data lacks (or holds too few of to go round) would train on
  // nothing; refuse the split rather than hand it out.
  for (size_t i = 0; i < parties; ++i) {
    if (!out[i].empty()) continue;
    std::string held;
    size_t samples = 0;
    for (size_t c = 0; c < classes; ++c) {
      if (!holds[i][c]) continue;
      held += (held.empty() ? "" : ", ") + std::to_string(c);
      samples += by_class[c].size();
    }
    const std::string how = config.party_labels.empty()
                                ? "drawn with partition.seed " + std::to_string(config.seed)
                                : "from partition.party_labels[" + std::to_string(i) + "]";
    return FailedPreconditionError(
        "partition: label-quantity leaves party " + std::to_string(i) + " with no samples: its labels [" + held +
        "] (" + how + ") have " + std::to_string(samples) +
        " samples in the data, too few to share with the other parties holding them; name labels the data "
        "holds for every party with partition.party_labels");
  }
  for (auto& party : out) random.Shuffle(party);
  return out;
}

Result<std::vector<std::vector<int64_t>>> SplitQuantity(size_t n, const PartitionConfig& config,
                                                        PartitionRandom& random) {
  const size_t parties = config.parties;
  std::vector<int64_t> all = Iota(static_cast<int64_t>(n));
  random.Shuffle(all);
  const std::vector<bool> everyone(parties, true);
  for (int draw = 0; draw < kMaxDraws; ++draw) {
    std::vector<double> log_weights(parties);
    for (double& w : log_weights) w = random.LogGamma(config.beta);
    std::vector<std::vector<int64_t>> out(parties);
    AppendCuts(all, NormalisedProportions(log_weights, everyone), out);
    if (MinSize(out) >= static_cast<size_t>(kMinPartySize)) return out;
  }
  return FailedPreconditionError("partition: quantity with beta " + std::to_string(config.beta) + " over " +
                                 std::to_string(parties) + " parties left some party under " +
                                 std::to_string(kMinPartySize) + " samples in " + std::to_string(kMaxDraws) +
                                 " draws; raise partition.beta or lower partition.parties");
}

}  // namespace

std::string_view PartitionKindName(PartitionConfig::Kind kind) {
  switch (kind) {
    case PartitionConfig::kIid:
      return "iid";
    case PartitionConfig::kDirichlet:
      return "dirichlet";
    case PartitionConfig::kLabelQuantity:
      return "label-quantity";
    case PartitionConfig::kQuantity:
      return "quantity";
  }
  return "unknown";
}

Result<std::vector<std::vector<int64_t>>> PartitionIndices(const std::vector<uint8_t>& labels, int num_classes,
                                                           const PartitionConfig& config) {
  RETURN_IF_ERROR(Validate(labels, num_classes, config));
  PartitionRandom random(config.seed);
  switch (config.kind) {
    case PartitionConfig::kIid:
      return SplitIid(labels.size(), config.parties, random);
    case PartitionConfig::kDirichlet:
      return SplitDirichlet(labels, num_classes, config, random);
    case PartitionConfig::kLabelQuantity:
      return SplitLabelQuantity(labels, num_classes, config, random);
    case PartitionConfig::kQuantity:
      return SplitQuantity(labels.size(), config, random);
  }
  return InvalidArgumentError("partition.kind: unknown kind " + std::to_string(static_cast<int>(config.kind)));
}

std::vector<std::vector<int64_t>> PartitionLabelCounts(const std::vector<std::vector<int64_t>>& partitions,
                                                       const std::vector<uint8_t>& labels, int num_classes) {
  std::vector<std::vector<int64_t>> counts(partitions.size(), std::vector<int64_t>(static_cast<size_t>(num_classes)));
  for (size_t p = 0; p < partitions.size(); ++p) {
    for (int64_t index : partitions[p]) {
      if (index < 0 || static_cast<size_t>(index) >= labels.size()) continue;
      uint8_t label = labels[static_cast<size_t>(index)];
      if (label < num_classes) ++counts[p][label];
    }
  }
  return counts;
}

}  // namespace tessera
