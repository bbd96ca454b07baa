// The aggregation rules' shared parts, and the sample-weighted mean.
#include "server/strategy/aggregation.h"

#include <mutex>

#include "base/target_clones.h"
#include "proto/job_mapping.h"

namespace tessera::server {

AggregationOptions AggregationFromSpec(const v1::JobSpec& spec) {
  AggregationOptions options;
  const v1::RobustAggregationSpec& a = spec.aggregation();
  if (a.rule() == "median") options.rule = AggregationRule::kMedian;
  if (a.rule() == "trimmed-mean") options.rule = AggregationRule::kTrimmedMean;
  if (a.rule() == "krum") options.rule = AggregationRule::kKrum;
  options.trim_fraction = a.trim_fraction() > 0 ? a.trim_fraction() : wire::kDefaultTrimFraction;
  options.byzantine = a.byzantine_clients();
  if (a.selected() > 0) options.selected = a.selected();
  return options;
}

std::string_view AggregationRuleName(AggregationRule rule) {
  switch (rule) {
    case AggregationRule::kMean: return "mean";
    case AggregationRule::kMedian: return "median";
    case AggregationRule::kTrimmedMean: return "trimmed-mean";
    case AggregationRule::kKrum: return "krum";
  }
  return "mean";
}

Status CheckUpdateFits(const ClientUpdate& update, const std::vector<size_t>& sizes) {
  if (update.samples == 0) return InvalidArgumentError("update with 0 samples: expected a positive sample count");
  if (!(update.scale > 0 && update.scale <= 1)) {
    return InvalidArgumentError("update from '" + update.client + "': its scale " + std::to_string(update.scale) +
                                " is not in (0, 1]");
  }
  const TensorSet& delta = *update.delta;
  if (delta.size() != sizes.size()) {
    return InvalidArgumentError("update has " + std::to_string(delta.size()) + " tensors, expected " +
                                std::to_string(sizes.size()));
  }
  for (size_t i = 0; i < delta.size(); ++i) {
    if (delta[i].values.size() != sizes[i]) {
      return InvalidArgumentError("tensor '" + delta[i].name + "' has " + std::to_string(delta[i].values.size()) +
                                  " values, expected " + std::to_string(sizes[i]));
    }
  }
  return Status::Ok();
}

namespace {

// sum[j] += w x d[j]: every update's fold, over the whole model. Vectorised (the build's -O2
// leaves a loop whose length is not known scalar) and cloned for AVX2, chosen when the process
// loads (target_clones). Element by element, without FMA: the same products and sums as the
// scalar loop, so the aggregate is the same to the bit on every machine.
TESSERA_CLONES_AVX2 __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic"))) void
AddScaled(double* __restrict sum, const float* __restrict d, size_t n, double w) {
  for (size_t j = 0; j < n; ++j) sum[j] += w * d[j];
}

// Running sums of weight x delta, one lock per tensor so that concurrent folds pipeline
// through the model instead of queueing for all of it.
class WeightedMean final : public DeltaAggregate {
 public:
  explicit WeightedMean(const TensorSet& layout) : locks_(layout.size()) {
    sums_.reserve(layout.size());
    sizes_.reserve(layout.size());
    for (const auto& t : layout) {
      sums_.emplace_back(t.values.size(), 0.0);
      sizes_.push_back(t.values.size());
    }
  }

  Status Fold(const ClientUpdate& update) override {
    RETURN_IF_ERROR(CheckUpdateFits(update, sizes_));
    const TensorSet& delta = *update.delta;
    {
      std::lock_guard<std::mutex> lock(totals_mu_);
      uint64_t total = 0;
      if (__builtin_add_overflow(total_weight_, update.samples, &total)) {
        return InvalidArgumentError("update from '" + update.client + "': its sample count " +
                                    std::to_string(update.samples) + " overflows the round's total");
      }
      total_weight_ = total;
      ++updates_;
    }
    // The update's share of the mean is its samples; its staleness weight scales its delta.
    const double w = static_cast<double>(update.samples) * update.scale;
    for (size_t i = 0; i < delta.size(); ++i) {
      std::lock_guard<std::mutex> lock(locks_[i]);
      AddScaled(sums_[i].data(), delta[i].values.data(), sums_[i].size(), w);
    }
    return Status::Ok();
  }

  uint64_t updates() const override {
    std::lock_guard<std::mutex> lock(totals_mu_);
    return updates_;
  }

  Status Combine(const TensorVisitor& visit) const override {
    if (updates() == 0) return FailedPreconditionError("no update to aggregate");
    const double total = static_cast<double>(total_weight_);
    std::vector<double> mean;
    for (size_t i = 0; i < sums_.size(); ++i) {
      mean.resize(sums_[i].size());
      for (size_t j = 0; j < mean.size(); ++j) mean[j] = sums_[i][j] / total;
      visit(i, mean);
    }
    return Status::Ok();
  }

 private:
  std::vector<std::vector<double>> sums_;
  std::vector<size_t> sizes_;
  std::vector<std::mutex> locks_;  // one per tensor, guarding its sum
  mutable std::mutex totals_mu_;
  uint64_t total_weight_ = 0;
  uint64_t updates_ = 0;
};

}  // namespace

std::unique_ptr<DeltaAggregate> OpenAggregate(const AggregationOptions& options, const TensorSet& layout) {
  if (options.rule == AggregationRule::kMean) return std::make_unique<WeightedMean>(layout);
  return OpenRetainingAggregate(options, layout);
}

}  // namespace tessera::server
