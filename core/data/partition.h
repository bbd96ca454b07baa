// Splitting a labelled training set among federated parties, as NIID-Bench does (Li, Diao,
// Chen, He: "Federated Learning on Non-IID Data Silos: An Experimental Study", ICDE 2022).
//
// Kinds (N samples, K classes, P parties):
//   kIid            shuffle the indices and cut them into P runs whose sizes differ by at most 1
//                   (the first N mod P parties get one more).
//   kDirichlet      label distribution skew. For each class k in turn: shuffle its indices, draw
//                   proportions p ~ Dir(beta) over the parties, zero the proportion of every party
//                   that already holds >= N/P samples, renormalise, and cut the class at
//                   floor(cumsum(p) * n_k). If afterwards some party holds fewer than 10 samples,
//                   the whole split is drawn again. Small beta: few classes per party.
//   kLabelQuantity  #C=k label skew. Party i takes label i mod K, then k-1 further distinct labels
//                   drawn uniformly at random; each label's (shuffled) samples are cut evenly
//                   among the parties that hold it. Samples of a label no party drew (possible
//                   when P < K) are left out of every party. `party_labels`, when given, names
//                   each party's labels instead of drawing them (no draw is made for them). A
//                   party left with no samples is refused, not handed out empty.
//   kQuantity       quantity skew. Party sizes are Dir(beta) proportions of N, redrawn until every
//                   party would get at least 10 samples; samples are assigned IID.
//
// Determinism: the result is a function of (labels, num_classes, config) alone. The generator is
// std::mt19937_64 seeded with config.seed, and every draw derived from it (uniform integers,
// shuffles, normal and gamma variates) is computed here rather than by the standard library's
// distributions, so the split is the same on every platform and standard library.
//
// Thread-compatible; no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera {

struct PartitionConfig {
  enum Kind { kIid, kDirichlet, kLabelQuantity, kQuantity };
  Kind kind = kIid;
  uint32_t parties = 0;
  double beta = 0.5;              // Dirichlet concentration (kDirichlet, kQuantity); > 0
  uint32_t labels_per_party = 2;  // k of #C=k (kLabelQuantity); in [1, num_classes]
  uint64_t seed = 0;
  // kLabelQuantity: each party's labels (parties sets of labels_per_party distinct labels in
  // [0, num_classes)); empty: drawn as above.
  std::vector<std::vector<uint32_t>> party_labels;
};

// "iid", "dirichlet", "label-quantity", "quantity": the names job specs use.
std::string_view PartitionKindName(PartitionConfig::Kind kind);

// The minimum party size kDirichlet and kQuantity redraw for.
inline constexpr int64_t kMinPartySize = 10;

// The smallest beta kDirichlet and kQuantity take. At 0.001 a Dirichlet draw over ten parties
// already gives one party 99.4% of the mass on average, so a smaller beta adds no skew; far
// smaller ones (below about 1e-307) overflow the gamma variates' logarithms to -infinity.
inline constexpr double kMinBeta = 1e-3;

// Returns, for each party, the indices into `labels` of the samples it holds, in a random
// order; no index appears twice. kInvalidArgument, naming the field, for: parties == 0, more
// parties than samples, beta below kMinBeta or not finite (kDirichlet, kQuantity), labels_per_party == 0
// or > num_classes (kLabelQuantity), party_labels that are not `parties` sets of
// labels_per_party distinct labels in [0, num_classes) (kLabelQuantity), fewer than
// kMinPartySize * parties samples (kDirichlet, kQuantity), num_classes < 1, or a label outside [0, num_classes). kFailedPrecondition when
// 10000 draws in a row leave some party under kMinPartySize samples, or when kLabelQuantity
// leaves a party with no samples (its labels are absent from the data, or too few to go round);
// the message names the party and its labels.
Result<std::vector<std::vector<int64_t>>> PartitionIndices(const std::vector<uint8_t>& labels, int num_classes,
                                                           const PartitionConfig& config);

// counts[p][c]: how many samples of class c party p holds. For reports and tests.
std::vector<std::vector<int64_t>> PartitionLabelCounts(const std::vector<std::vector<int64_t>>& partitions,
                                                       const std::vector<uint8_t>& labels, int num_classes);

}  // namespace tessera
