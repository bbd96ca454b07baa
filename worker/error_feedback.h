// Top-k's error feedback on the worker: what a seat carries into its next update once an
// update has been sent (Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory", NeurIPS 2018).
#pragma once

#include <optional>

#include "core/tensor.h"

namespace tessera::worker {

// How an upload ended, as far as the worker can tell.
enum class UploadOutcome {
  kTaken,    // the coordinator's verdict: accepted
  kRefused,  // the coordinator's verdict: refused (a bad value, the norm bound, too late, ...)
  kUnknown,  // no verdict (the connection broke): the coordinator may or may not have folded it
};

// What the seat keeps after an upload of `sent` (the delta plus the earlier residual) of which
// `unsent` was left out by the encoding; nullopt: nothing (the seat starts afresh).
//  - taken: `unsent`, the part that did not travel;
//  - unknown: `unsent` as well: if the update was folded, that is exact; if not, this round's
//    sent part is lost once, as a dropped update's is. Keeping all of `sent` would count it
//    twice whenever the update had been folded;
//  - refused: nothing. A refused update is often refused for its values (not finite, over the
//    norm bound); carried forward, they would be refused again every round.
// A residual that is not finite is never kept.
std::optional<TensorSet> ResidualAfterUpload(UploadOutcome outcome, TensorSet unsent);

}  // namespace tessera::worker
