// Federated strategies: what the coordinator does with the updates of a round, and what it
// remembers between rounds.
//
// A Strategy lives as long as its job's runner. For each round attempt it opens a
// RoundAggregate, which folds the accepted updates as they stream in (memory O(model),
// whatever the number of clients; the robust aggregation rules of aggregation.h are the
// exception, holding every accepted update until the round closes, O(clients x model),
// bounded when the job is submitted). When the round closes, Finish() computes the next global
// model and the strategy's next state from the aggregate, without changing the strategy;
// the runner writes both in one checkpoint, and only once that commit is durable does it
// hand the state back with Adopt(). A restart restores the state from the checkpoint, so a
// resumed job continues bit for bit where an uninterrupted one would be.
//
// State is a TensorSet (float32, named): server momentum, adaptive moments, control
// variates. It travels in the checkpoint file beside the model under the prefix
// "strategy/" (see StateStore), so model and state can never come from different rounds.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "core/buffer_pool.h"
#include "core/tensor.h"
#include "tessera/v1/job.pb.h"

namespace tessera::server {

// An update's delta its caller hands over with the update: `tensors` is the set the update's
// `delta` points to, and an aggregate may move its tensors out (leaving the set empty) to fold
// them later beside other updates; it gives their buffers to `recycle` once folded. Both
// null: the caller keeps the delta, and the aggregate reads it during Fold() only.
struct HandedDelta {
  TensorSet* tensors = nullptr;
  FloatBufferPool* recycle = nullptr;
};

// One client's update as a strategy sees it, already checked against the model's layout
// (names, shapes, finite values).
struct ClientUpdate {
  std::string client;            // the worker's id (a cohort's leader)
  uint32_t party = 0;            // the client's seat: its share of the partition
  uint64_t samples = 0;          // positive
  uint64_t local_steps = 0;      // optimiser steps it reports (UpdateHeader.local_steps); 0: not told
  double step_normalizer = 0;    // FedNova's a_i it reports (UpdateHeader.step_normalizer); 0: not told
  const TensorSet* delta = nullptr;  // the client's model minus the round's global model
  // A factor on the delta, its weight in the mean staying `samples`: an asynchronous job's
  // staleness weight, in (0, 1]. Only the sample-weighted mean takes a factor other than 1
  // (wire::ValidateJobSpec keeps the other rules and strategies out of asynchronous jobs);
  // the others refuse it.
  double scale = 1.0;
  // The factor the round clipped the client's delta by (update_norm_policy "clip": the job's
  // max_update_norm over the delta's L2 norm, in (0, 1)); 1 when it was not clipped. `delta`
  // is the clipped one already; a strategy whose payload was computed from the delta the
  // client sent (SCAFFOLD's variate change) scales it to match.
  double clip_factor = 1.0;
  // The update's other sets, by name: those PayloadSets() names, each checked against the
  // model's layout (names, shapes, finite values); null when the strategy reads none.
  const std::map<std::string, TensorSet>* payload = nullptr;
  HandedDelta handed = {};  // the delta's buffers, when the caller gives them up
};

// What one round attempt accumulates.
class RoundAggregate {
 public:
  virtual ~RoundAggregate() = default;
  // Folds one update in. Thread-safe: uploads of different clients may fold concurrently.
  // An error leaves the aggregate as it was.
  virtual Status Fold(const ClientUpdate& update) = 0;
  virtual uint64_t updates() const = 0;
  // Checks what an update claims besides its tensors (its steps, its normaliser) when its
  // header arrives, before any tensor bytes are read; `delta` and `payload` are null here.
  // InvalidArgument naming the field refuses the update. Thread-safe.
  virtual Status CheckClaims(const ClientUpdate& /*update*/) const { return Status::Ok(); }
};

struct StrategyStep {
  TensorSet model;  // the next global model
  TensorSet state;  // the strategy's state after the round; empty for a stateless strategy
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string_view name() const = 0;

  // The state a checkpoint carried (without the "strategy/" prefix); empty: a fresh start.
  // Refuses a state that does not fit the model or the strategy, naming the tensor.
  virtual Status Restore(TensorSet state) = 0;
  virtual const TensorSet& state() const = 0;

  // The tensor sets a client's update carries besides "delta" (a control variate's change,
  // ...), each with the model's layout: an update without one of them, or with any other set,
  // is refused before its bytes are read.
  virtual std::vector<std::string> PayloadSets() const { return {}; }
  // The tensor sets each participant downloads after the model's tensors (the task's
  // model_sets), in order, each with the model's layout. Empty (the default): every
  // participant downloads the one shared encoding of the model.
  virtual std::vector<std::string> DownloadSets() const { return {}; }
  // Those sets for the participant seated at `party`, one after another in DownloadSets()
  // order, each tensor named "SET/" + the model tensor's name. Called on the job's thread
  // between rounds.
  virtual TensorSet DownloadTensors(uint32_t /*party*/) const { return {}; }
  // An empty aggregate for a model of `global`'s layout. Reads only the layout and the
  // strategy's options, never its state: the asynchronous driver opens the next buffer on the
  // upload thread that filled the previous one, while the job's thread may be in Finish() or
  // Adopt(). The one exception is a strategy that never runs asynchronously
  // (wire::ValidateJobSpec): SCAFFOLD's aggregate holds the server's control variate its
  // participants downloaded, to bound their variates' changes, and is opened on the job's
  // thread between Adopt()s.
  virtual std::unique_ptr<RoundAggregate> BeginRound(const TensorSet& global) const = 0;
  // The next model and state. Requires at least one folded update. Does not change `this`.
  virtual Result<StrategyStep> Finish(const TensorSet& global, const RoundAggregate& aggregate) const = 0;
  // The state of a step whose checkpoint is now committed.
  virtual void Adopt(TensorSet state) = 0;
};

// The strategy a job names: the server optimiser of spec.strategy with its [server] options
// (server_optimizers.h) over the aggregation rule of spec.aggregation (aggregation.h), for a
// model of `layout`. The spec has been validated (wire::ValidateJobSpec).
// `buffers`: the names of the model's buffers (a batch norm's running statistics), which no
// optimiser steps: a server optimiser moves them by the aggregate alone, as FedAvg does, since
// momentum or an adaptive step could carry a running variance below zero. FedNova and SCAFFOLD
// move them by FedAvg's sample-weighted mean of the deltas: a running statistic is no sum of
// gradient steps to normalise by the steps taken or to correct with a control variate.
Result<std::unique_ptr<Strategy>> CreateStrategy(const v1::JobSpec& spec, const TensorSet& layout,
                                                 const std::vector<std::string>& buffers = {});

// The strategies CreateStrategy knows, for messages and `tessera check`.
std::string_view KnownStrategies();

// Per tensor of `layout`, whether `buffers` names it: the mask every strategy steps buffers by.
std::vector<bool> BufferMask(const TensorSet& layout, const std::vector<std::string>& buffers);

// Checkpoints hold the model's tensors, then the strategy's under this prefix, then what the
// job's client selection learned under kSelectionStatePrefix (ClientHistory::ToTensor).
inline constexpr std::string_view kStrategyStatePrefix = "strategy/";
inline constexpr std::string_view kSelectionStatePrefix = "selection/";
TensorSet JoinModelAndState(const TensorSet& model, const TensorSet& state);
// Splits a checkpoint's tensors into the model (returned), the strategy's state (without its
// prefix) and the selection's tensors (with theirs; left out when `selection` is null).
TensorSet SplitModelAndState(TensorSet tensors, TensorSet* state, TensorSet* selection = nullptr);

}  // namespace tessera::server
