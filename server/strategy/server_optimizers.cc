// FedAvg's plain step, FedAvgM's server momentum, and the adaptive optimisers of Reddi et
// al. 2021 (server_optimizers.h).
#include "server/strategy/server_optimizers.h"

#include <cmath>
#include <string>

#include "base/format.h"
#include "proto/job_mapping.h"

namespace tessera::server {
namespace {

// A zero tensor named `prefix` + the name of each tensor of `layout`, shaped alike.
void AppendFilled(const TensorSet& layout, const std::string& prefix, float value, TensorSet* state) {
  for (const auto& t : layout) {
    NamedTensor s;
    s.name = prefix + t.name;
    s.shape = t.shape;
    s.values.assign(t.values.size(), value);
    state->push_back(std::move(s));
  }
}

class PlainStep final : public ServerOptimizer {
 public:
  std::string_view name() const override { return "fedavg"; }
  TensorSet InitialState(const TensorSet&) const override { return {}; }
  void Step(size_t, size_t, const std::vector<double>& delta, NamedTensor& model, TensorSet&) const override {
    float* w = model.values.data();
    for (size_t j = 0; j < delta.size(); ++j) w[j] = static_cast<float>(w[j] + delta[j]);
  }
};

class ServerMomentum final : public ServerOptimizer {
 public:
  ServerMomentum(double learning_rate, double momentum) : learning_rate_(learning_rate), momentum_(momentum) {}
  std::string_view name() const override { return "fedavgm"; }
  TensorSet InitialState(const TensorSet& layout) const override {
    TensorSet state;
    AppendFilled(layout, "momentum/", 0.0f, &state);
    return state;
  }
  void Step(size_t index, size_t, const std::vector<double>& delta, NamedTensor& model,
            TensorSet& state) const override {
    float* w = model.values.data();
    float* v = state[index].values.data();
    for (size_t j = 0; j < delta.size(); ++j) {
      v[j] = static_cast<float>(momentum_ * v[j] + delta[j]);
      w[j] = static_cast<float>(w[j] + learning_rate_ * v[j]);
    }
  }

 private:
  const double learning_rate_;
  const double momentum_;
};

enum class SecondMoment { kAdam, kYogi, kAdagrad };

class AdaptiveStep final : public ServerOptimizer {
 public:
  AdaptiveStep(SecondMoment kind, double learning_rate, double beta1, double beta2, double tau)
      : kind_(kind), learning_rate_(learning_rate), beta1_(beta1), beta2_(beta2), tau_(tau) {}

  std::string_view name() const override {
    switch (kind_) {
      case SecondMoment::kAdam: return "fedadam";
      case SecondMoment::kYogi: return "fedyogi";
      case SecondMoment::kAdagrad: return "fedadagrad";
    }
    return "fedadam";
  }

  TensorSet InitialState(const TensorSet& layout) const override {
    TensorSet state;
    AppendFilled(layout, "m/", 0.0f, &state);
    AppendFilled(layout, "v/", static_cast<float>(tau_ * tau_), &state);
    return state;
  }

  Status CheckState(const TensorSet& state) const override {
    for (size_t i = state.size() / 2; i < state.size(); ++i) {
      const auto& v = state[i].values;
      for (size_t j = 0; j < v.size(); ++j) {
        if (!(v[j] >= 0)) {
          return InvalidArgumentError("tensor '" + state[i].name + "' holds " + FormatNumber(v[j]) + " at index " +
                                      std::to_string(j) + ": expected a second moment, never negative");
        }
      }
    }
    return Status::Ok();
  }

  void Step(size_t index, size_t tensors, const std::vector<double>& delta, NamedTensor& model,
            TensorSet& state) const override {
    float* w = model.values.data();
    float* m = state[index].values.data();
    float* v = state[tensors + index].values.data();
    for (size_t j = 0; j < delta.size(); ++j) {
      const double d = delta[j];
      const double d2 = d * d;
      m[j] = static_cast<float>(beta1_ * m[j] + (1 - beta1_) * d);
      switch (kind_) {
        case SecondMoment::kAdam:
          v[j] = static_cast<float>(beta2_ * v[j] + (1 - beta2_) * d2);
          break;
        case SecondMoment::kYogi: {
          const double gap = v[j] - d2;
          const double sign = gap > 0 ? 1.0 : (gap < 0 ? -1.0 : 0.0);
          v[j] = static_cast<float>(v[j] - (1 - beta2_) * d2 * sign);
          break;
        }
        case SecondMoment::kAdagrad:
          v[j] = static_cast<float>(v[j] + d2);
          break;
      }
      w[j] = static_cast<float>(w[j] + learning_rate_ * m[j] / (std::sqrt(static_cast<double>(v[j])) + tau_));
    }
  }

 private:
  const SecondMoment kind_;
  const double learning_rate_;
  const double beta1_;
  const double beta2_;
  const double tau_;
};

}  // namespace

Result<std::unique_ptr<ServerOptimizer>> CreateServerOptimizer(const v1::JobSpec& spec) {
  const std::string& name = spec.strategy();
  const v1::ServerOptimizerSpec& server = spec.server();
  if (name.empty() || name == "fedavg") return std::unique_ptr<ServerOptimizer>(new PlainStep());
  if (name == "fedavgm") {
    const double lr = server.learning_rate() > 0 ? server.learning_rate() : wire::DefaultServerLearningRate(name);
    return std::unique_ptr<ServerOptimizer>(new ServerMomentum(lr, server.momentum()));
  }
  SecondMoment kind;
  if (name == "fedadam") {
    kind = SecondMoment::kAdam;
  } else if (name == "fedyogi") {
    kind = SecondMoment::kYogi;
  } else if (name == "fedadagrad") {
    kind = SecondMoment::kAdagrad;
  } else {
    return InvalidArgumentError("strategy '" + name.substr(0, 64) + "' is not known; expected one of: " +
                                std::string(wire::kStrategyNames));
  }
  return std::unique_ptr<ServerOptimizer>(
      new AdaptiveStep(kind, server.learning_rate() > 0 ? server.learning_rate() : wire::DefaultServerLearningRate(name),
                       server.has_beta1() ? server.beta1() : wire::kDefaultBeta1,
                       server.has_beta2() ? server.beta2() : wire::kDefaultBeta2,
                       server.tau() > 0 ? server.tau() : wire::kDefaultTau));
}

}  // namespace tessera::server
