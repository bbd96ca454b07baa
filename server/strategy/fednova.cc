// FedNova (Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in
// Heterogeneous Federated Optimization", NeurIPS 2020), as NIID-Bench implements it.
//
// Clients that take different numbers of local steps pull FedAvg's model towards the ones
// that took more. FedNova normalises: each client reports its local steps tau_i and a_i, the
// L1 norm of its aggregation vector (tau_i for plain SGD; (tau_i - rho (1 - rho^tau_i) /
// (1 - rho)) / (1 - rho) with momentum rho, core/train/client_algorithms.h). With p_i the
// client's share of the round's samples, d_i = delta_i / a_i and tau_eff = sum p_i a_i:
//   x <- x + tau_eff * sum p_i d_i.
// With equal a_i it is FedAvg. The model's buffers (a batch norm's running statistics) take
// FedAvg's step, x <- x + sum p_i delta_i: no optimiser steps them, so dividing their change
// by the steps taken and rescaling it by tau_eff would only misweigh it. Stateless.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "base/format.h"
#include "server/strategy/factories.h"

namespace tessera::server {
namespace {

// Running sums of p_i-weighted normalised deltas (of p_i-weighted deltas for a buffer), and
// of the weights and weighted a_i, in double; one lock per tensor so that concurrent folds
// pipeline through the model.
class NormalizedMean final : public RoundAggregate {
 public:
  // `is_buffer`: per tensor of `layout`.
  NormalizedMean(const TensorSet& layout, std::vector<bool> is_buffer, uint32_t local_epochs, uint32_t batch_size,
                 double momentum)
      : locks_(layout.size()),
        is_buffer_(std::move(is_buffer)),
        local_epochs_(local_epochs),
        batch_size_(batch_size),
        momentum_(momentum) {
    sums_.reserve(layout.size());
    for (const auto& t : layout) sums_.emplace_back(t.values.size(), 0.0);
  }

  Status CheckClaims(const ClientUpdate& update) const override {
    // The spec's local epochs over the client's samples in batches (the last one partial).
    const uint64_t batches = (update.samples + batch_size_ - 1) / std::max<uint32_t>(1, batch_size_);
    const uint64_t max_steps = std::max<uint64_t>(1, batches) * std::max<uint32_t>(1, local_epochs_);
    if (update.local_steps < 1 || update.local_steps > max_steps) {
      return InvalidArgumentError("field 'local_steps': fednova needs the update's local steps; expected an integer in "
                                  "[1, " + std::to_string(max_steps) + "] (" + std::to_string(local_epochs_) +
                                  " epochs of " + std::to_string(update.samples) + " samples in batches of " +
                                  std::to_string(batch_size_) + "), got " + std::to_string(update.local_steps));
    }
    // a_i sums one coefficient (1 - rho^k) / (1 - rho) in [1, 1 / (1 - rho)) per step, rho
    // the momentum the worker trains with and computes a_i at: the spec's rounded to float
    // (TrainOptions), which may lie above the spec's own (0.99 is 0.9900000095 as a float).
    const double rho = static_cast<float>(momentum_);
    const double steps = static_cast<double>(update.local_steps);
    const double low = steps, high = steps / (1.0 - rho);
    const double slack = 1e-9 * high;
    const double a = update.step_normalizer;
    if (!std::isfinite(a) || a < low - slack || a > high + slack) {
      // Six digits, or as many as tell the claim from the bound it passed (1.04e+10 both).
      std::string low_text = FormatNumber(low), high_text = FormatNumber(high), got = FormatNumber(a);
      if (got == low_text || got == high_text) {
        low_text = FormatExact(low);
        high_text = FormatExact(high);
        got = FormatExact(a);
      }
      return InvalidArgumentError("field 'step_normalizer': expected FedNova's a_i for " +
                                  std::to_string(update.local_steps) + " local steps at momentum " + FormatNumber(momentum_) +
                                  ", a number in [" + low_text + ", " + high_text + "], got " + got);
    }
    return Status::Ok();
  }

  Status Fold(const ClientUpdate& update) override {
    if (update.samples == 0) return InvalidArgumentError("update with 0 samples: expected a positive sample count");
    if (update.scale != 1.0) return InvalidArgumentError("this aggregate weighs no update by staleness (scale must be 1)");
    RETURN_IF_ERROR(CheckClaims(update));
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
    const double w = static_cast<double>(update.samples);
    {
      std::lock_guard<std::mutex> lock(totals_mu_);
      total_weight_ += w;
      weighted_normalizers_ += w * update.step_normalizer;
      ++updates_;
    }
    const double normalized = w / update.step_normalizer;
    for (size_t i = 0; i < delta.size(); ++i) {
      const double scale = is_buffer_[i] ? w : normalized;
      std::lock_guard<std::mutex> lock(locks_[i]);
      double* sum = sums_[i].data();
      const float* d = delta[i].values.data();
      const size_t n = sums_[i].size();
      for (size_t j = 0; j < n; ++j) sum[j] += scale * d[j];
    }
    return Status::Ok();
  }

  uint64_t updates() const override {
    std::lock_guard<std::mutex> lock(totals_mu_);
    return updates_;
  }

  // tau_eff * sum p_i d_i for tensor i, element j; sum p_i delta_i for a buffer. Only after
  // every fold has returned.
  double Step(size_t i, size_t j) const {
    if (is_buffer_[i]) return sums_[i][j] / total_weight_;
    const double tau_eff = weighted_normalizers_ / total_weight_;
    return tau_eff * (sums_[i][j] / total_weight_);
  }

 private:
  std::vector<std::vector<double>> sums_;  // sum of w_i delta_i / a_i; of w_i delta_i for a buffer
  std::vector<std::mutex> locks_;          // one per tensor, guarding its sum
  const std::vector<bool> is_buffer_;      // per tensor
  const uint32_t local_epochs_, batch_size_;
  const double momentum_;
  mutable std::mutex totals_mu_;
  double total_weight_ = 0;          // sum of w_i (samples)
  double weighted_normalizers_ = 0;  // sum of w_i a_i
  uint64_t updates_ = 0;
};

class FedNova final : public Strategy {
 public:
  FedNova(uint32_t local_epochs, uint32_t batch_size, double momentum, std::vector<bool> is_buffer)
      : local_epochs_(local_epochs), batch_size_(batch_size), momentum_(momentum), is_buffer_(std::move(is_buffer)) {}

  std::string_view name() const override { return "fednova"; }
  Status Restore(TensorSet state) override {
    if (!state.empty()) {
      return InvalidArgumentError("fednova keeps no state, but the checkpoint holds " + std::to_string(state.size()) +
                                  " strategy tensors (was the job written by another strategy?)");
    }
    return Status::Ok();
  }
  const TensorSet& state() const override { return empty_; }
  std::unique_ptr<RoundAggregate> BeginRound(const TensorSet& global) const override {
    return std::make_unique<NormalizedMean>(global, is_buffer_, local_epochs_, batch_size_, momentum_);
  }
  Result<StrategyStep> Finish(const TensorSet& global, const RoundAggregate& aggregate) const override {
    const auto* mean = dynamic_cast<const NormalizedMean*>(&aggregate);
    if (mean == nullptr) return InternalError("fednova: the round's aggregate was not opened by this strategy");
    if (aggregate.updates() == 0) return FailedPreconditionError("no update to aggregate");
    StrategyStep step;
    step.model = global;
    for (size_t i = 0; i < step.model.size(); ++i) {
      float* v = step.model[i].values.data();
      for (size_t j = 0; j < step.model[i].values.size(); ++j) v[j] = static_cast<float>(v[j] + mean->Step(i, j));
    }
    return step;
  }
  void Adopt(TensorSet) override {}

 private:
  const uint32_t local_epochs_, batch_size_;
  const double momentum_;
  const std::vector<bool> is_buffer_;  // per tensor of the model's layout
  TensorSet empty_;
};

}  // namespace

Result<std::unique_ptr<Strategy>> CreateFedNova(const v1::JobSpec& spec, const TensorSet& layout,
                                                const std::vector<std::string>& buffers) {
  return std::unique_ptr<Strategy>(
      new FedNova(spec.local_epochs(), spec.batch_size(), spec.optimizer().momentum(), BufferMask(layout, buffers)));
}

}  // namespace tessera::server
