// Server optimisers: how a round's combined delta d (aggregation.h) moves the global model
// w, and what they remember between rounds. Each is the `strategy` of a job spec:
//
//   fedavg      w <- w + d                                        (McMahan et al. 2017)
//   fedavgm     v <- momentum v + d;  w <- w + learning_rate v    (Hsu et al. 2019)
//   fedadam     m <- b1 m + (1 - b1) d
//               v <- b2 v + (1 - b2) d^2
//               w <- w + learning_rate m / (sqrt(v) + tau)        (Reddi et al. 2021)
//   fedyogi     as fedadam, with v <- v - (1 - b2) d^2 sign(v - d^2)
//   fedadagrad  as fedadam, with v <- v + d^2
//
// The last three are Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan,
// "Adaptive Federated Optimization", ICLR 2021, Algorithm 2, without bias correction: m starts
// at 0 and v at tau^2 (the paper's v_{-1} >= tau^2). Every operation is per coordinate, in
// double, with m and v rounded to float as they are stored: a run resumed from the state a
// checkpoint holds is bit-identical to one that never stopped.
//
// State (StrategyStep::state): fedavg none; fedavgm "momentum/<tensor>" for each of the
// model's tensors; the adaptive ones "m/<tensor>" for each, then "v/<tensor>" for each.
//
// Thread safety: an optimiser is immutable after construction; Step() writes only what it is
// given.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "core/tensor.h"
#include "tessera/v1/job.pb.h"

namespace tessera::server {

class ServerOptimizer {
 public:
  virtual ~ServerOptimizer() = default;
  virtual std::string_view name() const = 0;
  // The state of a fresh start for a model of `layout`; empty for a stateless optimiser.
  virtual TensorSet InitialState(const TensorSet& layout) const = 0;
  // Checks a state read from a checkpoint, beyond its layout (which the caller compares with
  // InitialState's): values the arithmetic needs (a second moment is never negative).
  virtual Status CheckState(const TensorSet& state) const { return Status::Ok(); }
  // One round's step for tensor `index` of a model of `tensors` tensors: `model` holds the
  // tensor's current values and receives the next ones; the tensor's state entries in `state`
  // (laid out as InitialState's) are advanced. `delta` holds as many values as `model`.
  virtual void Step(size_t index, size_t tensors, const std::vector<double>& delta, NamedTensor& model,
                    TensorSet& state) const = 0;
};

// The server optimiser `spec.strategy` names (empty: fedavg), with its options from
// spec.server, the defaults (proto/job_mapping.h) filled in. The spec has been validated (wire::ValidateJobSpec).
// InvalidArgument for a name it does not know.
Result<std::unique_ptr<ServerOptimizer>> CreateServerOptimizer(const v1::JobSpec& spec);

}  // namespace tessera::server
