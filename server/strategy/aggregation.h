// Aggregation rules: how the updates of one round become one delta, the "pseudo-gradient"
// that a server optimiser (server_optimizers.h) then applies to the global model.
//
//   mean          The sample-weighted mean of the deltas (FedAvg's). Folded as the updates
//                 arrive into running sums: memory O(model) whatever the number of clients.
//   median        The coordinate-wise median of the deltas (Yin et al. 2018, "Byzantine-
//                 Robust Distributed Learning: Towards Optimal Statistical Rates").
//   trimmed-mean  For each coordinate, the mean of the deltas left after cutting the
//                 floor(trim_fraction x n) largest and as many smallest (Yin et al. 2018).
//   krum          Multi-Krum (Blanchard et al. 2017, "Machine Learning with Adversaries:
//                 Byzantine Tolerant Gradient Descent"): with f of the n updates assumed
//                 Byzantine, each update is scored by the sum of its squared L2 distances to
//                 its n - f - 2 nearest others; the mean of the m best-scored updates is the
//                 delta (Krum when m = 1). Needs n > 2f + 2.
//
// The robust rules (median, trimmed-mean, krum) cannot fold: each holds a float copy of every
// accepted delta until the round closes, so the coordinator's memory for a round is
// O(clients x model) (bounded per job by wire::kMaxRetainedUpdateBytes, proto/job_mapping.h,
// checked when the job is submitted), and Krum's scoring takes O(n^2 x model) time. They weigh every update alike,
// whatever sample count it claims (a Byzantine client could claim any count its party
// allows), and combine the updates in the order of their clients' ids, so a round's result
// does not depend on the order the uploads arrived in.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "core/tensor.h"
#include "server/strategy/strategy.h"
#include "tessera/v1/job.pb.h"

namespace tessera::server {

enum class AggregationRule { kMean, kMedian, kTrimmedMean, kKrum };

struct AggregationOptions {
  AggregationRule rule = AggregationRule::kMean;
  double trim_fraction = 0.2;  // trimmed-mean: the fraction cut from each side, in (0, 0.5)
  uint32_t byzantine = 0;      // krum: f
  uint32_t selected = 1;       // krum: m, at least 1
};

// The rule and options a validated spec names (spec.aggregation), defaults filled in.
AggregationOptions AggregationFromSpec(const v1::JobSpec& spec);
// "mean", "median", "trimmed-mean", "krum".
std::string_view AggregationRuleName(AggregationRule rule);

// A round's aggregate that can give its combined delta, one tensor at a time, once the round
// has closed.
class DeltaAggregate : public RoundAggregate {
 public:
  // `delta` holds tensor `index`'s combined values (as many as the tensor has); it is valid
  // only during the call.
  using TensorVisitor = std::function<void(size_t index, const std::vector<double>& delta)>;
  // Calls `visit` for every tensor of the layout, in order. Only after every Fold() has
  // returned. FailedPrecondition when no update was folded, or when the rule cannot apply to
  // this many updates (Krum with n <= 2f + 2); `visit` is then not called. Does not change
  // the aggregate: it may be called again and gives the same values.
  virtual Status Combine(const TensorVisitor& visit) const = 0;
};

// An empty aggregate of `options.rule` for a model of `layout` (only its sizes are kept).
std::unique_ptr<DeltaAggregate> OpenAggregate(const AggregationOptions& options, const TensorSet& layout);

// The aggregate of a robust rule (median, trimmed-mean, krum; robust.cc). OpenAggregate
// calls it; `options.rule` is not kMean.
std::unique_ptr<DeltaAggregate> OpenRetainingAggregate(const AggregationOptions& options, const TensorSet& layout);

// The checks every rule makes of an update before taking it: a positive sample count, and as
// many tensors, each of as many values, as `sizes` (the layout's). The round has checked
// names, shapes and values already; this guards the arithmetic.
Status CheckUpdateFits(const ClientUpdate& update, const std::vector<size_t>& sizes);

}  // namespace tessera::server
