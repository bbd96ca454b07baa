// FedAvg and FedAvgM: the sample-weighted mean of the clients' deltas, applied directly
// (FedAvg) or through server momentum (FedAvgM).
#include <cmath>
#include <mutex>

#include "server/strategy/factories.h"
#include "server/strategy/strategy.h"

namespace tessera::server {
namespace {

// Running sums of weight x delta, one lock per tensor so that concurrent folds pipeline
// through the model instead of queueing for all of it.
class WeightedMean final : public RoundAggregate {
 public:
  explicit WeightedMean(const TensorSet& layout) : locks_(layout.size()) {
    sums_.reserve(layout.size());
    for (const auto& t : layout) sums_.emplace_back(t.values.size(), 0.0);
  }

  Status Fold(const ClientUpdate& update) override {
    if (update.samples == 0) return InvalidArgumentError("update with 0 samples: expected a positive sample count");
    const TensorSet& delta = *update.delta;
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
    const double w = static_cast<double>(update.samples);
    for (size_t i = 0; i < delta.size(); ++i) {
      std::lock_guard<std::mutex> lock(locks_[i]);
      double* sum = sums_[i].data();
      const float* d = delta[i].values.data();
      const size_t n = sums_[i].size();
      for (size_t j = 0; j < n; ++j) sum[j] += w * d[j];
    }
    return Status::Ok();
  }

  uint64_t updates() const override {
    std::lock_guard<std::mutex> lock(totals_mu_);
    return updates_;
  }

  // The mean delta of tensor i, element j. Only after every fold has returned.
  double Mean(size_t i, size_t j) const { return sums_[i][j] / static_cast<double>(total_weight_); }

 private:
  std::vector<std::vector<double>> sums_;
  std::vector<std::mutex> locks_;  // one per tensor, guarding its sum
  mutable std::mutex totals_mu_;
  uint64_t total_weight_ = 0;
  uint64_t updates_ = 0;
};

const WeightedMean* AsMean(const RoundAggregate& aggregate) { return dynamic_cast<const WeightedMean*>(&aggregate); }

Status CheckFinishable(const RoundAggregate& aggregate, std::string_view strategy) {
  if (AsMean(aggregate) == nullptr) {
    return InternalError(std::string(strategy) + ": the round's aggregate was not opened by this strategy");
  }
  if (aggregate.updates() == 0) return FailedPreconditionError("no update to aggregate");
  return Status::Ok();
}

// FedAvg (McMahan et al., 2017): the next model is the global model plus the sample-weighted
// mean of the deltas. Stateless. Also FedProx's server side (Li et al., MLSys 2020), whose
// proximal term is all on the clients.
class FedAvg final : public Strategy {
 public:
  explicit FedAvg(std::string_view name = "fedavg") : name_(name) {}
  std::string_view name() const override { return name_; }
  Status Restore(TensorSet state) override {
    if (!state.empty()) {
      return InvalidArgumentError(std::string(name_) + " keeps no state, but the checkpoint holds " +
                                  std::to_string(state.size()) +
                                  " strategy tensors (was the job written by another strategy?)");
    }
    return Status::Ok();
  }
  const TensorSet& state() const override { return empty_; }
  std::unique_ptr<RoundAggregate> BeginRound(const TensorSet& global) const override {
    return std::make_unique<WeightedMean>(global);
  }
  Result<StrategyStep> Finish(const TensorSet& global, const RoundAggregate& aggregate) const override {
    RETURN_IF_ERROR(CheckFinishable(aggregate, name()));
    const WeightedMean& mean = *AsMean(aggregate);
    StrategyStep step;
    step.model = global;
    for (size_t i = 0; i < step.model.size(); ++i) {
      float* v = step.model[i].values.data();
      for (size_t j = 0; j < step.model[i].values.size(); ++j) v[j] = static_cast<float>(v[j] + mean.Mean(i, j));
    }
    return step;
  }
  void Adopt(TensorSet) override {}

 private:
  const std::string_view name_;
  TensorSet empty_;
};

// FedAvgM (Hsu et al., 2019, "Measuring the Effects of Non-Identical Data Distribution for
// Federated Visual Classification"): server momentum over the mean delta,
//   v <- momentum * v + mean_delta;   w <- w + server_learning_rate * v.
// With momentum 0 and learning rate 1 it is FedAvg. State: v, one tensor per parameter.
class FedAvgM final : public Strategy {
 public:
  FedAvgM(const TensorSet& layout, double learning_rate, double momentum)
      : learning_rate_(learning_rate), momentum_(momentum) {
    for (const auto& t : layout) {
      NamedTensor v;
      v.name = "momentum/" + t.name;
      v.shape = t.shape;
      v.values.assign(t.values.size(), 0.0f);
      velocity_.push_back(std::move(v));
    }
  }

  std::string_view name() const override { return "fedavgm"; }

  Status Restore(TensorSet state) override {
    if (state.empty()) return Status::Ok();  // a fresh start: zero velocity
    RETURN_IF_ERROR(CheckSameLayout(velocity_, state, "fedavgm state in the checkpoint"));
    RETURN_IF_ERROR(CheckFinite(state, "fedavgm state in the checkpoint"));
    velocity_ = std::move(state);
    return Status::Ok();
  }
  const TensorSet& state() const override { return velocity_; }

  std::unique_ptr<RoundAggregate> BeginRound(const TensorSet& global) const override {
    return std::make_unique<WeightedMean>(global);
  }

  Result<StrategyStep> Finish(const TensorSet& global, const RoundAggregate& aggregate) const override {
    RETURN_IF_ERROR(CheckFinishable(aggregate, name()));
    if (global.size() != velocity_.size()) {
      return InternalError("fedavgm: the model has " + std::to_string(global.size()) + " tensors, its state " +
                           std::to_string(velocity_.size()));
    }
    const WeightedMean& mean = *AsMean(aggregate);
    StrategyStep step;
    step.model = global;
    step.state = velocity_;
    for (size_t i = 0; i < step.model.size(); ++i) {
      float* w = step.model[i].values.data();
      float* v = step.state[i].values.data();
      for (size_t j = 0; j < step.model[i].values.size(); ++j) {
        v[j] = static_cast<float>(momentum_ * v[j] + mean.Mean(i, j));
        w[j] = static_cast<float>(w[j] + learning_rate_ * v[j]);
      }
    }
    return step;
  }

  void Adopt(TensorSet state) override { velocity_ = std::move(state); }

 private:
  const double learning_rate_;
  const double momentum_;
  TensorSet velocity_;
};

}  // namespace

std::string_view KnownStrategies() { return "fedavg, fedavgm, fedprox, fednova, scaffold"; }

Result<std::unique_ptr<Strategy>> CreateStrategy(const v1::JobSpec& spec, const TensorSet& layout) {
  const std::string& name = spec.strategy();
  if (name.empty() || name == "fedavg") return std::unique_ptr<Strategy>(new FedAvg());
  if (name == "fedavgm") {
    const double lr = spec.server().learning_rate() > 0 ? spec.server().learning_rate() : 1.0;
    return std::unique_ptr<Strategy>(new FedAvgM(layout, lr, spec.server().momentum()));
  }
  if (name == "fedprox") return std::unique_ptr<Strategy>(new FedAvg("fedprox"));
  if (name == "fednova") return CreateFedNova(spec, layout);
  if (name == "scaffold") return CreateScaffold(spec, layout);
  return InvalidArgumentError("strategy '" + name.substr(0, 64) + "' is not known; expected one of: " +
                              std::string(KnownStrategies()));
}

TensorSet JoinModelAndState(const TensorSet& model, const TensorSet& state) {
  TensorSet all = model;
  for (const auto& t : state) {
    NamedTensor copy = t;
    copy.name = std::string(kStrategyStatePrefix) + t.name;
    all.push_back(std::move(copy));
  }
  return all;
}

TensorSet SplitModelAndState(TensorSet tensors, TensorSet* state) {
  TensorSet model;
  state->clear();
  for (auto& t : tensors) {
    if (t.name.rfind(kStrategyStatePrefix, 0) == 0) {
      t.name.erase(0, kStrategyStatePrefix.size());
      state->push_back(std::move(t));
    } else {
      model.push_back(std::move(t));
    }
  }
  return model;
}

}  // namespace tessera::server
