// Local training and evaluation of a Model on a Dataset: what a worker runs for one round.
//
// Both run on the calling thread and block until done (or cancelled). The model, the data
// and the hook are borrowed for the duration of the call.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/data/dataset.h"
#include "core/model/model.h"
#include "device/device.h"

namespace tessera {

// Called on every step after backward and before the optimiser update, with the flat gradient
// of all parameters (model.flat_gradients(): `count` floats, parameter order). It may change
// the gradient in place (a site cohort allreduces and averages here); an error stops
// training and is returned by TrainLocal. `step` counts from 0 within one TrainLocal call.
// Without a hook (and unsharded) TrainLocal needs no flat gradient: it releases the model's
// (Model::ReleaseGradients) and steps each layer's parameters as the backward pass hands
// their gradients over (Model::BackwardInPieces), to the same values.
class GradientHook {
 public:
  virtual ~GradientHook() = default;
  virtual Status OnGradients(Device& device, DeviceBuffer& flat_gradients, int64_t count, int64_t step) = 0;
};

// Image augmentation applied to each sample as its batch is gathered (Dataset is NCHW), drawn
// from the call's seed, the epoch and the sample's position in the epoch, so that the members
// of a site cohort, each gathering its slice, augment a sample alike.
struct Augmentation {
  bool horizontal_flip = false;  // mirror left-right with probability 1/2
  int crop_padding = 0;          // shift by up to this many pixels each way; zeros come in
};

// Sample `index` of `data` augmented as `bits` say, written to `out` (SampleSize floats): bit 0
// mirrors it left-right (with horizontal_flip); with crop_padding p, bits 8.. and 24.. pick the
// vertical and horizontal shifts dy, dx in [-p, p] (each mod 2p + 1): out(y, x) = in(y + dy,
// x + dx) before the mirror, 0 where that falls outside the image.
void AugmentImage(const Dataset& data, int64_t index, const Augmentation& augment, uint64_t bits, float* out);

struct TrainOptions {
  uint32_t epochs = 1;
  uint32_t batch_size = 64;
  float learning_rate = 0.01f, momentum = 0.9f, weight_decay = 0.0f;
  uint64_t seed = 0;                  // shuffling; the same seed gives the same batch order
  std::function<bool()> should_stop;  // checked between steps; true stops with Cancelled
  GradientHook* gradient_hook = nullptr;
  // Data-parallel sharding inside a site cohort: every member walks the same shuffled batches
  // (same seed), and member `shard_index` of `shard_count` computes the gradient of its slice
  // of each batch. The slice's gradient is scaled by slice/batch * shard_count before the
  // hook, so that averaging it over the members (the hook's allreduce) gives exactly the
  // gradient of the whole batch. A member whose slice is empty contributes zeros. Dropout
  // drops for each sample what it would drop in the whole batch (Model::SetBatchSlice); batch
  // norms see their slice's statistics, not the batch's.
  uint32_t shard_index = 0;
  uint32_t shard_count = 1;
  // Client-side terms of federated algorithms, on the device (Device::AddScaledDifference):
  //  - FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020):
  //    proximal_mu * (w - w0), the gradient of mu/2 ||w - w0||^2, added to each step's
  //    gradient after the gradient hook (so that the members of a site cohort add it alike to
  //    the gradient they synchronised) and before the optimiser step; w0 are the model's
  //    parameters when TrainLocal starts (the round's global model). 0: off.
  //  - SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated
  //    Learning", ICML 2020): after each optimiser step the weights move by
  //    -learning_rate * (server_control - client_control), outside the momentum, as
  //    NIID-Bench's client does; each NumParameters() floats in parameter order, borrowed for
  //    the call. Both null: off.
  Augmentation augment;
  float proximal_mu = 0.0f;
  const std::vector<float>* server_control = nullptr;
  const std::vector<float>* client_control = nullptr;
};

struct TrainReport {
  uint64_t samples = 0;     // samples processed, over all epochs
  uint64_t steps = 0;
  double mean_loss = 0;     // sample-weighted mean of the step losses
  double compute_ms = 0;    // wall time of the step loop, milliseconds
  // Batches of one sample not trained (TrainLocal), over all epochs, and the batch norm that
  // made them so (its name), when there were any.
  uint64_t skipped_batches = 0;
  std::string skipped_for;
};

// SGD with momentum (PyTorch semantics) over data[indices], `epochs` times. Each epoch visits
// the indices in an order shuffled deterministically from options.seed and the epoch number;
// the last partial batch is included, unless it holds one sample and the model has a batch
// norm whose input is [C, 1, 1] (after a linear layer or a global pool): each channel would
// then hold one value, whose batch variance is 0 and which normalises to the layer's bias
// alone, passing no gradient back. Such a batch is skipped whole (no forward, no step, no
// change to the running statistics; not counted in steps or samples) and counted in
// TrainReport::skipped_batches; PyTorch refuses it in training mode. In a site cohort each
// member's batch norm sees its own slice, so the rule is that some member's slice would hold
// one sample (every member computes it alike from the batch's size, and every member skips
// the batch); a batch_size whose full batches would all be so cut is InvalidArgument. Momentum buffers start at
// zero in every call (the optimiser is re-created each round, as in NIID-Bench).
// InvalidArgument when the data's sample shape does not match the model's input, an index is
// out of range, the batch size is zero, proximal_mu is negative or not finite, or a control
// variate is given alone or with another length than the model's parameters; Cancelled when
// should_stop returned true.
Result<TrainReport> TrainLocal(Model& model, const Dataset& data, const std::vector<int64_t>& indices,
                               const TrainOptions& options);

struct EvalReport {
  double accuracy = 0;  // fraction in [0, 1]
  double loss = 0;      // mean cross-entropy
  uint64_t samples = 0;
};

// Accuracy and loss on the first max_samples samples of `data` (all when 0), in batches of
// `batch_size`. Leaves the parameters unchanged.
Result<EvalReport> Evaluate(Model& model, const Dataset& data, uint32_t batch_size = 500, int64_t max_samples = 0);

}  // namespace tessera
