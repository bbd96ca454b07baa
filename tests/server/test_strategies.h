// Strategies for the round driver's tests, each wrapping the job's own (FedAvg), given to the
// runner through JobRunnerOptions::strategy_factory:
//  - AmplifiedFedAvg: the step amplified 1e38-fold, so an honest client's update stays
//    finite and a large one overflows the model (the non-finite retry).
//  - FoldGatedStrategy: every fold stops at a Gate first, so a test can act while an update
//    is mid-fold (stopping the runner then).
#pragma once

#include <memory>
#include <string_view>
#include <utility>

#include "fake_worker.h"
#include "server/jobs/job_runner.h"
#include "server/strategy/strategy.h"

namespace tessera::server {

class AmplifiedFedAvg final : public Strategy {
 public:
  explicit AmplifiedFedAvg(std::unique_ptr<Strategy> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return "amplified-fedavg"; }
  Status Restore(TensorSet state) override { return inner_->Restore(std::move(state)); }
  const TensorSet& state() const override { return inner_->state(); }
  std::unique_ptr<RoundAggregate> BeginRound(const TensorSet& global) const override {
    return inner_->BeginRound(global);
  }
  Result<StrategyStep> Finish(const TensorSet& global, const RoundAggregate& aggregate) const override {
    ASSIGN_OR_RETURN(StrategyStep step, inner_->Finish(global, aggregate));
    for (size_t i = 0; i < step.model.size(); ++i) {
      for (size_t j = 0; j < step.model[i].values.size(); ++j) {
        const float g = global[i].values[j];
        step.model[i].values[j] = g + (step.model[i].values[j] - g) * 1e38f;
      }
    }
    return step;
  }
  void Adopt(TensorSet state) override { inner_->Adopt(std::move(state)); }

 private:
  std::unique_ptr<Strategy> inner_;
};

class FoldGatedStrategy final : public Strategy {
 public:
  FoldGatedStrategy(std::unique_ptr<Strategy> inner, std::shared_ptr<Gate> gate)
      : inner_(std::move(inner)), gate_(std::move(gate)) {}
  std::string_view name() const override { return "fold-gated"; }
  Status Restore(TensorSet state) override { return inner_->Restore(std::move(state)); }
  const TensorSet& state() const override { return inner_->state(); }
  std::unique_ptr<RoundAggregate> BeginRound(const TensorSet& global) const override {
    return std::make_unique<Aggregate>(inner_->BeginRound(global), gate_);
  }
  Result<StrategyStep> Finish(const TensorSet& global, const RoundAggregate& aggregate) const override {
    return inner_->Finish(global, *static_cast<const Aggregate&>(aggregate).inner);
  }
  void Adopt(TensorSet state) override { inner_->Adopt(std::move(state)); }

 private:
  struct Aggregate final : RoundAggregate {
    Aggregate(std::unique_ptr<RoundAggregate> a, std::shared_ptr<Gate> g) : inner(std::move(a)), gate(std::move(g)) {}
    Status Fold(const ClientUpdate& update) override {
      gate->Pass();
      return inner->Fold(update);
    }
    uint64_t updates() const override { return inner->updates(); }
    std::unique_ptr<RoundAggregate> inner;
    std::shared_ptr<Gate> gate;
  };

  std::unique_ptr<Strategy> inner_;
  std::shared_ptr<Gate> gate_;
};

// A strategy_factory making `Wrapper(job's strategy, args...)`.
template <typename Wrapper, typename... Args>
auto WrapStrategy(Args... args) {
  return [=](const v1::JobSpec& spec, const TensorSet& layout) -> Result<std::unique_ptr<Strategy>> {
    ASSIGN_OR_RETURN(auto inner, CreateStrategy(spec, layout));
    return std::unique_ptr<Strategy>(new Wrapper(std::move(inner), args...));
  };
}

}  // namespace tessera::server
