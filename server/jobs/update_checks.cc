#include "server/jobs/update_checks.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <type_traits>
#include <vector>

#include "base/escape.h"
#include "base/format.h"
#include "base/target_clones.h"
#include "core/scan_vectors.h"
#include "proto/job_mapping.h"
#include "proto/update_envelope.h"

namespace tessera::server {

Status CheckReportedFigures(const v1::UpdateHeader& h, const std::string& what) {
  // Times a worker reports are shown to operators and summed into metrics: finite, not
  // negative, at most a week.
  for (const auto& [field, ms] : {std::pair<const char*, double>{"compute_ms", h.compute_ms()},
                                  {"download_ms", h.download_ms()},
                                  {"data_load_ms", h.data_load_ms()}}) {
    if (!(ms >= 0 && ms <= 7 * 24 * 3600e3)) {
      return InvalidArgumentError(what + ": field '" + field + "': expected milliseconds in [0, 604800000], got " +
                                  FormatNumber(ms));
    }
  }
  // The train loss goes into the round's sample-weighted mean and the utility selection's
  // ranking: a NaN, an infinity or a 1e308 from one worker would make the round's figure NaN
  // or infinite. An honest worker's loss is finite (an external trainer's is checked so on the
  // worker), and 1e30 times every sample of every client of a round stays far within double.
  if (!(std::abs(h.train_loss()) <= kMaxReportedLoss)) {
    return InvalidArgumentError(what + ": field 'train_loss': expected a finite number in [-1e30, 1e30], got " +
                                FormatNumber(h.train_loss()));
  }
  // The backend a cohort negotiated is copied into the round's record, which operators read:
  // it is refused, not kept, unless it is a backend's name ("gloo", "nccl", ...), so that
  // neither control characters nor megabytes reach the record.
  const std::string& backend = h.collective_backend();
  const bool named = backend.size() <= kMaxBackendNameBytes &&
                     std::all_of(backend.begin(), backend.end(), [](char c) {
                       return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
                     });
  if (!named) {
    return InvalidArgumentError(what + ": field 'collective_backend': expected a backend's name, at most " +
                                std::to_string(kMaxBackendNameBytes) + " of [a-z0-9._-], got " +
                                QuoteUntrusted(backend));
  }
  return Status::Ok();
}

Status CheckUpdateEnvelope(const v1::UpdateHeader& h, const TensorSet& layout, const std::vector<std::string>& extra_sets,
                           const std::string& what, UpdateEncoding delta_encoding) {
  ASSIGN_OR_RETURN(std::vector<wire::UpdateSetView> sets, wire::UpdateSets(h, what));
  if (h.trained_weights() && delta_encoding != UpdateEncoding::kFloat32) {
    return InvalidArgumentError(what + ": field 'trained_weights': a trained model travels in float32 only; this "
                                "job's updates are deltas in " + UpdateEncodingName(delta_encoding));
  }
  for (const auto& set : sets) {
    if (set.name != wire::kDeltaSet &&
        std::find(extra_sets.begin(), extra_sets.end(), set.name) == extra_sets.end()) {
      std::string expected = "'delta'";
      for (const auto& name : extra_sets) expected += ", '" + name + "'";
      return InvalidArgumentError(what + ": set " + QuoteUntrusted(set.name) + " is not one this job's strategy reads; expected " +
                                  expected);
    }
  }
  for (const auto& name : extra_sets) {
    if (std::none_of(sets.begin(), sets.end(), [&](const wire::UpdateSetView& set) { return set.name == name; })) {
      return InvalidArgumentError(what + ": no set '" + name + "'; this job's strategy needs one");
    }
  }
  // Every set has the model's layout: the delta and each of the strategy's sets.
  for (const auto& set : sets) {
    const bool delta = set.name == wire::kDeltaSet;
    const std::string in_set = delta ? "" : " of set " + QuoteUntrusted(set.name);
    // "delta" travels in the job's encoding, a strategy's own sets in float32.
    const auto encoding = wire::ToUpdateEncoding(set.encoding);
    if (!encoding.ok()) return encoding.status().WithContext(what + ": set " + QuoteUntrusted(set.name));
    const UpdateEncoding expected = delta ? delta_encoding : UpdateEncoding::kFloat32;
    if (*encoding != expected) {
      return InvalidArgumentError(what + ": set " + QuoteUntrusted(set.name) + " is encoded " + UpdateEncodingName(*encoding) +
                                  "; this job expects " + UpdateEncodingName(expected) +
                                  (delta ? " (its [compression] encoding)" : " (only the delta is compressed)"));
    }
    const auto& tensors = set.manifest->tensors();
    if (static_cast<size_t>(tensors.size()) != layout.size()) {
      return InvalidArgumentError(what + ": expected " + std::to_string(layout.size()) + " tensors" + in_set +
                                  ", got " + std::to_string(tensors.size()));
    }
    for (int i = 0; i < tensors.size(); ++i) {
      const NamedTensor& want = layout[static_cast<size_t>(i)];
      const auto& shape = tensors[i].shape();
      if (tensors[i].name() != want.name) {
        return InvalidArgumentError(what + ": tensor " + std::to_string(i) + in_set + ": expected name '" + want.name +
                                    "', got " + QuoteUntrusted(tensors[i].name()));
      }
      if (!std::equal(shape.begin(), shape.end(), want.shape.begin(), want.shape.end())) {
        const std::vector<int64_t> got(shape.begin(), shape.end());
        return InvalidArgumentError(what + ": tensor '" + want.name + "'" + in_set + ": expected shape " +
                                    ShapeToString(want.shape) + ", got " + EscapeUntrusted(ShapeToString(got)));
      }
      if (tensors[i].dtype() != wire::EncodedDType(*encoding)) {
        return InvalidArgumentError(what + ": tensor '" + want.name + "'" + in_set + ": expected dtype " +
                                    v1::DType_Name(wire::EncodedDType(*encoding)) + " for " +
                                    UpdateEncodingName(*encoding) + ", got " + v1::DType_Name(tensors[i].dtype()));
      }
    }
  }
  return Status::Ok();
}

namespace {

using scan::AddSquares;
using scan::Bits8;
using scan::Doubles4;
using scan::Floats8;
using scan::NonFiniteBit;
using scan::OrNonFinite;
constexpr size_t kScanLanes = ValueScan::kLanes;

// One pass over a delta of `global`'s layout: the sum of its squares (in double, sixteen
// partial sums), whether all its values are finite, and whether global + delta is.
struct DeltaScan {
  double squares = 0;
  bool delta_finite = true;
  bool sum_finite = true;
};

// One tensor of the scan below: its squares in sixteen partial sums, in acc[0..15].
template <bool kSubtract>
[[gnu::always_inline]] inline void ScanTensorBody(const float* g, std::conditional_t<kSubtract, float*, const float*> d,
                                                  size_t n, double* acc, uint32_t* bad_delta, uint32_t* bad_sum) {
  Doubles4 s0 = {}, s1 = {}, s2 = {}, s3 = {};
  Bits8 delta_bits = {}, sum_bits = {};
  size_t j = 0;
  for (; j + kScanLanes <= n; j += kScanLanes) {
    Floats8 x0, x1, g0, g1;
    std::memcpy(&x0, d + j, sizeof(x0));
    std::memcpy(&x1, d + j + 8, sizeof(x1));
    std::memcpy(&g0, g + j, sizeof(g0));
    std::memcpy(&g1, g + j + 8, sizeof(g1));
    if constexpr (kSubtract) {
      x0 -= g0;
      x1 -= g1;
      std::memcpy(d + j, &x0, sizeof(x0));
      std::memcpy(d + j + 8, &x1, sizeof(x1));
    }
    AddSquares(x0, &s0, &s1);
    AddSquares(x1, &s2, &s3);
    OrNonFinite(x0, &delta_bits);
    OrNonFinite(x1, &delta_bits);
    const Floats8 y0 = g0 + x0, y1 = g1 + x1;
    OrNonFinite(y0, &sum_bits);
    OrNonFinite(y1, &sum_bits);
  }
  for (size_t k = 0; k < 4; ++k) {
    acc[k] = s0[k];
    acc[4 + k] = s1[k];
    acc[8 + k] = s2[k];
    acc[12 + k] = s3[k];
  }
  uint32_t bad_d = 0, bad_s = 0;
  for (size_t k = 0; k < 8; ++k) {
    bad_d |= delta_bits[k];
    bad_s |= sum_bits[k];
  }
  for (; j < n; ++j) {
    if constexpr (kSubtract) {
      d[j] -= g[j];
    }
    const float x = d[j];
    acc[0] += static_cast<double>(x) * x;
    bad_d |= NonFiniteBit(x);
    bad_s |= NonFiniteBit(g[j] + x);
  }
  *bad_delta |= bad_d != 0;
  *bad_sum |= bad_s != 0;
}

// Every update's check, over the whole model: cloned for AVX2 as the fold is
// (server/strategy/aggregation.cc); the partial sums stay sixteen lanes, without FMA, so the
// norm is the same to the bit whichever clone runs.
TESSERA_CLONES_AVX2 __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic"))) void
ScanTensor(const float* __restrict g, const float* __restrict d, size_t n, double* acc, uint32_t* bad_delta,
           uint32_t* bad_sum) {
  ScanTensorBody<false>(g, d, n, acc, bad_delta, bad_sum);
}
TESSERA_CLONES_AVX2 __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic"))) void
ScanSubtractTensor(const float* __restrict g, float* __restrict d, size_t n, double* acc, uint32_t* bad_delta,
                   uint32_t* bad_sum) {
  ScanTensorBody<true>(g, d, n, acc, bad_delta, bad_sum);
}

// The sixteen partial sums added pairwise, in a fixed order.
double SumLanes(const double* acc) {
  double pairs[kScanLanes / 2];
  for (size_t k = 0; k < kScanLanes / 2; ++k) pairs[k] = acc[2 * k] + acc[2 * k + 1];
  return ((pairs[0] + pairs[1]) + (pairs[2] + pairs[3])) + ((pairs[4] + pairs[5]) + (pairs[6] + pairs[7]));
}

// With kSubtract, `delta` holds the trained model on entry and its difference from `global`
// on return, computed in the same pass (the worker's float subtraction, value for value).
// With `hints.global_max_abs` (GlobalMagnitudes of `global`), a tensor whose largest
// magnitude plus the global tensor's cannot reach float's overflow is scanned without reading
// global: global + delta is finite there by that bound. Its scan is `hints.delta_scans`'s
// when the assembler made one as the tensor arrived, else made here. Any other tensor is
// scanned in full.
template <bool kSubtract>
DeltaScan ScanDelta(const TensorSet& global, std::conditional_t<kSubtract, TensorSet&, const TensorSet&> delta,
                    const ScanHints& hints) {
  DeltaScan scan;
  uint32_t bad_delta = 0;
  uint32_t bad_sum = 0;
  for (size_t i = 0; i < delta.size(); ++i) {
    double acc[kScanLanes] = {};
    if constexpr (kSubtract) {
      ScanSubtractTensor(global[i].values.data(), delta[i].values.data(), delta[i].values.size(), acc, &bad_delta,
                         &bad_sum);
    } else {
      bool bounded = false;
      if (hints.global_max_abs != nullptr && i < hints.global_max_abs->size()) {
        const std::vector<float>& values = delta[i].values;
        ValueScan::Result alone;
        if (hints.delta_scans != nullptr && i < hints.delta_scans->size() && (*hints.delta_scans)[i] &&
            (*hints.delta_scans)[i]->values == values.size()) {
          alone = *(*hints.delta_scans)[i];
        } else {
          alone = ValueScan::Of(values.data(), values.size());
        }
        std::copy(std::begin(alone.lanes), std::end(alone.lanes), std::begin(acc));
        // Two floats' magnitudes add exactly enough in double: a sum within float's largest
        // value cannot round to infinity in float.
        bounded = alone.finite && static_cast<double>((*hints.global_max_abs)[i]) + static_cast<double>(alone.max_abs) <=
                                      static_cast<double>(std::numeric_limits<float>::max());
      }
      if (!bounded) {
        std::fill(std::begin(acc), std::end(acc), 0.0);
        ScanTensor(global[i].values.data(), delta[i].values.data(), delta[i].values.size(), acc, &bad_delta, &bad_sum);
      }
    }
    scan.squares += SumLanes(acc);
  }
  scan.delta_finite = bad_delta == 0;
  scan.sum_finite = bad_sum == 0;
  return scan;
}

// The fewest digits that read back as `value` (a float, not its double's digits).
std::string FloatText(float value) {
  char text[32];
  const auto [end, error] = std::to_chars(text, text + sizeof(text), value);
  return error == std::errc() ? std::string(text, end) : FormatNumber(value);
}

// The tensors `non_negative` marks (null: none) of global + delta, each sum in float as the
// fold's step makes it: OK when none is below 0, else InvalidArgument naming the first.
Status CheckSumsNotNegative(const TensorSet& global, const TensorSet& delta, const std::vector<bool>* non_negative,
                            const std::string& what) {
  if (non_negative == nullptr) return Status::Ok();
  for (size_t i = 0; i < delta.size() && i < non_negative->size(); ++i) {
    if (!(*non_negative)[i]) continue;
    const std::vector<float>& g = global[i].values;
    const std::vector<float>& d = delta[i].values;
    for (size_t j = 0; j < d.size(); ++j) {
      if (g[j] + d[j] < 0.0f) {
        return InvalidArgumentError(what + ": tensor '" + global[i].name + "' element " + std::to_string(j) +
                                    ": the model's " + FloatText(g[j]) + " plus the update's " + FloatText(d[j]) +
                                    " is below 0; its values must stay 0 or more (a running variance)");
      }
    }
  }
  return Status::Ok();
}

// CheckDelta and CheckTrainedDelta: with kSubtract, `delta` is the trained model, made the
// delta by the scan.
template <bool kSubtract>
CheckedDelta CheckDeltaImpl(const TensorSet& global, std::conditional_t<kSubtract, TensorSet&, const TensorSet&> delta,
                            const std::map<std::string, TensorSet>* payload, const std::vector<std::string>& extra_sets,
                            double max_update_norm, bool clip, const std::string& what,
                            const ScanHints& hints, const std::vector<bool>* non_negative) {
  CheckedDelta checked;
  checked.verdict = CheckSameLayout(global, delta, what);
  DeltaScan scan;
  if (checked.verdict.ok()) {
    scan = ScanDelta<kSubtract>(global, delta, hints);
    // CheckFinite names the first bad element; it runs only when there is one.
    if (!scan.delta_finite) checked.verdict = CheckFinite(delta, what);
  }
  for (size_t k = 0; checked.verdict.ok() && k < extra_sets.size(); ++k) {
    const std::string& name = extra_sets[k];
    if (payload == nullptr || payload->count(name) == 0) {
      checked.verdict = InvalidArgumentError(what + ": no set '" + name + "'; this job's strategy needs one");
    } else {
      // The strategy's sets are checked as the delta is, but for the norm bound: SCAFFOLD folds
      // its control variate's change into the server's and keeps it for the party, so a value
      // that is not finite would reach the model's next rounds through every client. Their
      // bound is the strategy's, which knows what they mean: SCAFFOLD's aggregate refuses a
      // change larger than one computed from the update's delta could be (scaffold.cc), and
      // never scales one down, which would leave the party's c_i other than its client's.
      const TensorSet& set = payload->at(name);
      checked.verdict = CheckSameLayout(global, set, what + ", set '" + name + "'");
      if (checked.verdict.ok()) checked.verdict = CheckFinite(set, what + ", set '" + name + "'");
    }
  }
  if (!checked.verdict.ok()) return checked;
  // The delta's L2 norm, in double (finite values of float square and sum without overflow),
  // and whether the global model plus this delta alone already overflows float.
  checked.non_finite_alone = !scan.sum_finite;
  checked.norm = std::sqrt(scan.squares);
  if (checked.norm <= max_update_norm) {  // NaN norms cannot come: the values are finite
    checked.verdict = CheckSumsNotNegative(global, delta, non_negative, what);
    return checked;
  }
  if (!clip) {
    checked.verdict = InvalidArgumentError(what + ": its delta's L2 norm " + FormatNumber(checked.norm) +
                                           " exceeds the job's max_update_norm " + FormatNumber(max_update_norm));
    return checked;
  }
  const double scale = max_update_norm / checked.norm;
  checked.clipped = delta;
  checked.non_finite_alone = false;
  for (size_t i = 0; i < checked.clipped->size(); ++i) {
    const float* g = global[i].values.data();
    float* d = (*checked.clipped)[i].values.data();
    for (size_t j = 0; j < (*checked.clipped)[i].values.size(); ++j) {
      d[j] = static_cast<float>(d[j] * scale);
      checked.non_finite_alone = checked.non_finite_alone || !std::isfinite(g[j] + d[j]);
    }
  }
  // Scaled towards 0, a delta that kept the sum at 0 or more still does; checked as folded.
  checked.verdict = CheckSumsNotNegative(global, *checked.clipped, non_negative, what);
  return checked;
}

}  // namespace

CheckedDelta CheckDelta(const TensorSet& global, const TensorSet& delta, const std::map<std::string, TensorSet>* payload,
                        const std::vector<std::string>& extra_sets, double max_update_norm, bool clip,
                        const std::string& what, const ScanHints& hints, const std::vector<bool>* non_negative) {
  return CheckDeltaImpl<false>(global, delta, payload, extra_sets, max_update_norm, clip, what, hints, non_negative);
}

std::vector<float> GlobalMagnitudes(const TensorSet& global) {
  std::vector<float> out;
  out.reserve(global.size());
  for (const NamedTensor& t : global) {
    const ValueScan::Result scan = ValueScan::Of(t.values.data(), t.values.size());
    // No bound for a tensor that is not finite: updates to it are scanned in full.
    out.push_back(scan.finite ? scan.max_abs : std::numeric_limits<float>::infinity());
  }
  return out;
}

CheckedDelta CheckTrainedDelta(const TensorSet& global, TensorSet& trained,
                               const std::map<std::string, TensorSet>* payload, const std::vector<std::string>& extra_sets,
                               double max_update_norm, bool clip, const std::string& what,
                               const std::vector<bool>* non_negative) {
  return CheckDeltaImpl<true>(global, trained, payload, extra_sets, max_update_norm, clip, what, ScanHints{},
                              non_negative);
}

}  // namespace tessera::server
