// What a federated client computes around its local training for algorithms whose clients
// do more than train and send their delta: FedNova's normaliser and SCAFFOLD's control
// variate step. (FedProx's proximal term and SCAFFOLD's gradient correction run inside the
// training loop: TrainOptions in core/train/trainer.h.)
//
// Pure functions over host tensors; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "core/tensor.h"

namespace tessera {

// FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous
// Federated Optimization", NeurIPS 2020): the L1 norm of the client's aggregation vector a_i
// after `local_steps` steps of SGD with momentum `momentum` (rho in [0, 1)), as NIID-Bench
// computes it:
//   a_i = (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho),   tau = local_steps;
// tau itself for plain SGD (rho = 0), and 0 for no steps. The server divides the client's
// delta by it (server/strategy/fednova.cc). kInvalidArgument for a momentum outside [0, 1)
// (at 1 the formula is 0 / 0).
Result<double> FedNovaNormalizer(uint64_t local_steps, double momentum);

// One client's SCAFFOLD step, option II of Karimireddy et al. (ICML 2020, eq. 4): from the
// round's global model x, the client's model after training y, the server's control variate
// c and the client's c_i, after K steps at `learning_rate`:
//   c_i+ = c_i - c + (x - y) / (K lr),      control_delta = c_i+ - c_i.
// `effective_steps` is K, the optimiser steps taken: the correction moves the weights outside
// the optimiser's momentum (TrainOptions), K lr (c - c_i) in all, so that c_i+ estimates the
// gradient as the momentum amplified it, as NIID-Bench's reference client computes it.
// Computed in double, stored as float. All four sets must have the same layout (names,
// shapes, order); InvalidArgument naming the set otherwise, or when the steps or lr are not
// positive.
struct ScaffoldClientStep {
  TensorSet next_control;   // c_i+
  TensorSet control_delta;  // c_i+ - c_i: what the client uploads beside its delta
};
Result<ScaffoldClientStep> ScaffoldClientVariates(const TensorSet& global, const TensorSet& trained,
                                                  const TensorSet& server_control, const TensorSet& client_control,
                                                  double effective_steps, double learning_rate);

// The values of `tensors` one after another, in order: the flat layout of a model's
// parameters (core/model/model.h), as TrainOptions' control variates take them.
std::vector<float> FlattenTensors(const TensorSet& tensors);

}  // namespace tessera
