// A strategy as an aggregation rule (aggregation.h) composed with a server optimiser
// (server_optimizers.h): FedAvg is the weighted mean with the plain step, FedAdam with a
// coordinate-wise median is the median with Adam's step, and so on.
#include <algorithm>
#include <string>
#include <vector>

#include "proto/job_mapping.h"
#include "server/strategy/aggregation.h"
#include "server/strategy/factories.h"
#include "server/strategy/server_optimizers.h"
#include "server/strategy/strategy.h"

namespace tessera::server {
namespace {

class ComposedStrategy final : public Strategy {
 public:
  // `name`: the strategy's name when it is not the optimiser's (fedprox's server side is
  // FedAvg's plain step).
  // `plain`: FedAvg's step, which the model's `buffers` take whatever the optimiser.
  ComposedStrategy(AggregationOptions aggregation, std::unique_ptr<ServerOptimizer> optimizer,
                   std::unique_ptr<ServerOptimizer> plain, const TensorSet& layout,
                   const std::vector<std::string>& buffers, std::string name = "")
      : aggregation_(aggregation),
        optimizer_(std::move(optimizer)),
        plain_(std::move(plain)),
        state_(optimizer_->InitialState(layout)),
        name_(name.empty() ? std::string(optimizer_->name()) : std::move(name)),
        is_buffer_(BufferMask(layout, buffers)) {}

  std::string_view name() const override { return name_; }

  Status Restore(TensorSet state) override {
    if (state.empty()) return Status::Ok();  // a fresh start
    const std::string what = std::string(name()) + " state in the checkpoint";
    if (state_.empty()) {
      return InvalidArgumentError(std::string(name()) + " keeps no state, but the checkpoint holds " +
                                  std::to_string(state.size()) +
                                  " strategy tensors (was the job written by another strategy?)");
    }
    RETURN_IF_ERROR(CheckSameLayout(state_, state, what));
    RETURN_IF_ERROR(CheckFinite(state, what));
    RETURN_IF_ERROR(optimizer_->CheckState(state).WithContext(what));
    state_ = std::move(state);
    return Status::Ok();
  }
  const TensorSet& state() const override { return state_; }

  std::unique_ptr<RoundAggregate> BeginRound(const TensorSet& global) const override {
    return OpenAggregate(aggregation_, global);
  }

  Result<StrategyStep> Finish(const TensorSet& global, const RoundAggregate& aggregate) const override {
    const auto* combined = dynamic_cast<const DeltaAggregate*>(&aggregate);
    if (combined == nullptr) {
      return InternalError(std::string(name()) + ": the round's aggregate was not opened by this strategy");
    }
    if (aggregate.updates() == 0) return FailedPreconditionError("no update to aggregate");
    StrategyStep step;
    step.model = global;
    step.state = state_;
    const size_t tensors = step.model.size();
    if (!step.state.empty() && step.state.size() % tensors != 0) {
      return InternalError(std::string(name()) + ": the model has " + std::to_string(tensors) +
                           " tensors, its state " + std::to_string(step.state.size()));
    }
    Status fits;
    RETURN_IF_ERROR(combined->Combine([&](size_t i, const std::vector<double>& delta) {
      if (i >= tensors || delta.size() != step.model[i].values.size()) {
        if (fits.ok()) fits = InternalError(std::string(name()) + ": the round's aggregate does not fit the model");
        return;
      }
      // A buffer takes FedAvg's step, which reads no state: its optimiser state stays as it began.
      (is_buffer_[i] ? *plain_ : *optimizer_).Step(i, tensors, delta, step.model[i], step.state);
    }));
    RETURN_IF_ERROR(fits);
    return step;
  }

  void Adopt(TensorSet state) override { state_ = std::move(state); }

 private:
  const AggregationOptions aggregation_;
  const std::unique_ptr<ServerOptimizer> optimizer_;
  const std::unique_ptr<ServerOptimizer> plain_;
  TensorSet state_;
  const std::string name_;
  const std::vector<bool> is_buffer_;  // per tensor of the model's layout
};

}  // namespace

std::string_view KnownStrategies() { return wire::kStrategyNames; }

std::vector<bool> BufferMask(const TensorSet& layout, const std::vector<std::string>& buffers) {
  std::vector<bool> mask;
  mask.reserve(layout.size());
  for (const auto& t : layout) mask.push_back(std::find(buffers.begin(), buffers.end(), t.name) != buffers.end());
  return mask;
}

Result<std::unique_ptr<Strategy>> CreateStrategy(const v1::JobSpec& spec, const TensorSet& layout,
                                                 const std::vector<std::string>& buffers) {
  if (spec.strategy() == "fednova") return CreateFedNova(spec, layout, buffers);
  if (spec.strategy() == "scaffold") return CreateScaffold(spec, layout, buffers);
  if (spec.strategy() == "fedprox") {
    // FedProx's server side is FedAvg's (Li et al., MLSys 2020): its proximal term is all on
    // the clients. Any aggregation rule applies.
    v1::JobSpec server_side = spec;
    server_side.set_strategy("fedavg");
    ASSIGN_OR_RETURN(std::unique_ptr<ServerOptimizer> plain, CreateServerOptimizer(server_side));
    ASSIGN_OR_RETURN(std::unique_ptr<ServerOptimizer> for_buffers, CreateServerOptimizer(server_side));
    return std::unique_ptr<Strategy>(new ComposedStrategy(AggregationFromSpec(spec), std::move(plain),
                                                          std::move(for_buffers), layout, buffers, "fedprox"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ServerOptimizer> optimizer, CreateServerOptimizer(spec));
  ASSIGN_OR_RETURN(std::unique_ptr<ServerOptimizer> for_buffers, CreateServerOptimizer(v1::JobSpec()));  // fedavg
  return std::unique_ptr<Strategy>(new ComposedStrategy(AggregationFromSpec(spec), std::move(optimizer),
                                                        std::move(for_buffers), layout, buffers));
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

TensorSet SplitModelAndState(TensorSet tensors, TensorSet* state, TensorSet* selection) {
  TensorSet model;
  state->clear();
  if (selection) selection->clear();
  for (auto& t : tensors) {
    if (t.name.rfind(kSelectionStatePrefix, 0) == 0) {
      if (selection) selection->push_back(std::move(t));
    } else if (t.name.rfind(kStrategyStatePrefix, 0) == 0) {
      t.name.erase(0, kStrategyStatePrefix.size());
      state->push_back(std::move(t));
    } else {
      model.push_back(std::move(t));
    }
  }
  return model;
}

}  // namespace tessera::server
