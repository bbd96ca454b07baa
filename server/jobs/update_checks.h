// The checks of an update that every driver makes (the synchronous Round, the asynchronous
// AsyncDriver), before it is folded: the figures it reports, its envelope before any tensor
// byte is read, and its values once they are (layout, finite, the norm bound, clipping).
// Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/tensor.h"
#include "core/update_codec.h"
#include "core/value_scan.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::server {

// `what` names the update in errors ("update from worker 'w' for job j round 3").
//
// The figures a worker reports besides its tensors. Times (compute_ms, download_ms,
// data_load_ms) are shown to operators and summed into metrics: finite, not negative, at most
// a week. Its train_loss is averaged into the round's record: finite, at most
// kMaxReportedLoss in magnitude. Its collective_backend is kept in the record: empty, or a
// backend's name of at most kMaxBackendNameBytes of [a-z0-9._-].
inline constexpr double kMaxReportedLoss = 1e30;
inline constexpr size_t kMaxBackendNameBytes = 32;
Status CheckReportedFigures(const v1::UpdateHeader& header, const std::string& what);

// The upload's envelope before any tensor bytes are read: its sets (a "delta" set and every
// set in `extra_sets`, no other, each in an encoding this build reads) and each set's
// manifest against `layout` (names, shapes, dtypes).
// The delta must travel in `delta_encoding` (the job's [compression]), every other set in float32.
Status CheckUpdateEnvelope(const v1::UpdateHeader& header, const TensorSet& layout,
                           const std::vector<std::string>& extra_sets, const std::string& what,
                           UpdateEncoding delta_encoding = UpdateEncoding::kFloat32);
// A received delta (and its payload sets) against `global`: layout, finite values, its L2
// norm within `max_update_norm` or, with `clip`, scaled down to it.
struct CheckedDelta {
  Status verdict;                    // not ok: the update is refused for this
  double norm = 0;                   // the delta's L2 norm as received, once its values are known finite
  bool non_finite_alone = false;     // `global` plus the (clipped) delta alone overflows float
  std::optional<TensorSet> clipped;  // the delta scaled down to the bound, when it was
};
// What lets CheckDelta read less. `global_max_abs`: GlobalMagnitudes(global); the scan then
// reads only the delta wherever the two magnitudes bound global + delta below float's
// overflow (the same verdict, norm and flags; half the memory read for a model larger than
// the caches). `delta_scans`: the delta's tensors already scanned as they arrived
// (UpdateAssembler::ScanSet), used with `global_max_abs` and not read again; nullopt for a
// tensor scanned here.
struct ScanHints {
  const std::vector<float>* global_max_abs = nullptr;
  const TensorScans* delta_scans = nullptr;
};
// `non_negative`, per tensor of `global` (or null): the tensors whose values may not be
// negative (a batch norm's running variance, which makes every evaluation NaN). An update that
// would take one below 0 (global plus the delta as folded, clipped or not) is refused, naming
// the tensor, the element and the values.
CheckedDelta CheckDelta(const TensorSet& global, const TensorSet& delta, const std::map<std::string, TensorSet>* payload,
                        const std::vector<std::string>& extra_sets, double max_update_norm, bool clip,
                        const std::string& what, const ScanHints& hints = {},
                        const std::vector<bool>* non_negative = nullptr);
// Each tensor's largest magnitude, infinity for a tensor with a value that is not finite.
std::vector<float> GlobalMagnitudes(const TensorSet& global);
// The same for an update sent as the trained model (UpdateHeader.trained_weights): `trained`
// becomes its delta from `global` in the same pass (the worker's float subtraction, value for
// value), then is checked as CheckDelta checks a delta. Left unchanged when the layout is not
// the model's.
CheckedDelta CheckTrainedDelta(const TensorSet& global, TensorSet& trained,
                               const std::map<std::string, TensorSet>* payload, const std::vector<std::string>& extra_sets,
                               double max_update_norm, bool clip, const std::string& what,
                               const std::vector<bool>* non_negative = nullptr);

}  // namespace tessera::server
