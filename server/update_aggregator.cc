#include "server/update_aggregator.h"

namespace tessera::server {

FedAvgAggregator::FedAvgAggregator(const TensorSet& layout) {
  sums_.reserve(layout.size());
  for (const auto& t : layout) sums_.emplace_back(t.values.size(), 0.0);
}

Status FedAvgAggregator::Add(const TensorSet& delta, uint64_t weight) {
  if (weight == 0) return InvalidArgumentError("update with 0 samples: expected a positive sample count");
  if (delta.size() != sums_.size()) {
    return InvalidArgumentError("update has " + std::to_string(delta.size()) + " tensors, expected " +
                                std::to_string(sums_.size()));
  }
  for (size_t i = 0; i < delta.size(); ++i) {
    if (delta[i].values.size() != sums_[i].size()) {
      return InvalidArgumentError("tensor '" + delta[i].name + "' has " + std::to_string(delta[i].values.size()) +
                                  " values, expected " + std::to_string(sums_[i].size()));
    }
  }
  const double w = static_cast<double>(weight);
  for (size_t i = 0; i < delta.size(); ++i) {
    double* sum = sums_[i].data();
    const float* d = delta[i].values.data();
    const size_t n = sums_[i].size();
    for (size_t j = 0; j < n; ++j) sum[j] += w * d[j];
  }
  total_weight_ += weight;
  ++updates_;
  return Status::Ok();
}

Result<TensorSet> FedAvgAggregator::Apply(const TensorSet& global) const {
  if (updates_ == 0) return FailedPreconditionError("no update to aggregate");
  TensorSet next = global;
  const double scale = 1.0 / static_cast<double>(total_weight_);
  for (size_t i = 0; i < next.size(); ++i) {
    float* v = next[i].values.data();
    const double* sum = sums_[i].data();
    for (size_t j = 0; j < next[i].values.size(); ++j) v[j] = static_cast<float>(v[j] + sum[j] * scale);
  }
  return next;
}

Result<std::unique_ptr<UpdateAggregator>> CreateAggregator(const std::string& strategy, const TensorSet& layout) {
  if (strategy.empty() || strategy == "fedavg") return std::unique_ptr<UpdateAggregator>(new FedAvgAggregator(layout));
  return InvalidArgumentError("strategy '" + strategy + "' is not known; expected one of: fedavg");
}

}  // namespace tessera::server
