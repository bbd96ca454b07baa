#include "worker/error_feedback.h"

#include <cmath>

namespace tessera::worker {

std::optional<TensorSet> ResidualAfterUpload(UploadOutcome outcome, TensorSet unsent) {
  if (outcome == UploadOutcome::kRefused) return std::nullopt;
  for (const NamedTensor& t : unsent) {
    for (float v : t.values) {
      if (!std::isfinite(v)) return std::nullopt;
    }
  }
  return unsent;
}

}  // namespace tessera::worker
