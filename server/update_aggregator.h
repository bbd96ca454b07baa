// Streaming aggregation of model updates. Each accepted update is folded into running sums
// as it arrives, so the aggregator's memory is O(model) whatever the number of clients.
// Strategies (FedAvg today; FedProx, FedAdam and robust rules later) implement this
// interface; the round never sees more than one update at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/tensor.h"

namespace tessera::server {

class UpdateAggregator {
 public:
  virtual ~UpdateAggregator() = default;
  // Folds in one update (a model delta) that has already been validated against the
  // global model's layout. `weight` is the update's sample count. Not thread-safe: the
  // round serialises calls.
  virtual Status Add(const TensorSet& delta, uint64_t weight) = 0;
  virtual uint64_t updates() const = 0;
  // The next global model: `global` moved by the aggregate of the updates. Requires at
  // least one update.
  virtual Result<TensorSet> Apply(const TensorSet& global) const = 0;
};

// FedAvg (McMahan et al.): the sample-weighted mean of the deltas, added to the global model.
class FedAvgAggregator : public UpdateAggregator {
 public:
  explicit FedAvgAggregator(const TensorSet& layout);
  Status Add(const TensorSet& delta, uint64_t weight) override;
  uint64_t updates() const override { return updates_; }
  Result<TensorSet> Apply(const TensorSet& global) const override;

 private:
  std::vector<std::vector<double>> sums_;  // per tensor: sum of weight * delta
  uint64_t total_weight_ = 0;
  uint64_t updates_ = 0;
};

Result<std::unique_ptr<UpdateAggregator>> CreateAggregator(const std::string& strategy, const TensorSet& layout);

}  // namespace tessera::server
