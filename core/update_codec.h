// Encodings of an update's float32 values for the wire, and their decoders. Pure functions on
// spans and bytes: no proto, no I/O. The worker encodes its delta with the job's encoding; the
// coordinator decodes each tensor back to float32 before the strategy folds it.
//
// Every layout is little-endian:
//   kFloat32   4 n bytes, the values as they are.
//   kFloat16   2 n bytes, IEEE 754 binary16, rounded to nearest even; values beyond binary16's
//              range become +-inf, NaN stays NaN (the coordinator refuses non-finite updates).
//   kBFloat16  2 n bytes, the upper half of the float32 after rounding to nearest even; NaN
//              stays NaN.
//   kInt8      4 + n bytes: a float32 scale s = max|x| / 127 (0 for an all-zero tensor; one
//              float step lower where 127 s would round past the float range), then
//              q_i = round(x_i / s) in [-127, 127] as int8; x_i is read back as s q_i.
//   kTopK      8 k bytes, k = TopKCount(n, fraction): (uint32 index, float32 value) pairs of
//              the k entries largest in magnitude (ties: the lower index), in strictly
//              increasing index order; every other entry is read back as 0.
//
// Decoders take their input as hostile: the byte count must be the one the element count
// implies, an int8 scale finite and >= 0, top-k indices in range and strictly increasing.
// Their errors say what was expected and what came; callers prefix the tensor's name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera {

enum class UpdateEncoding { kFloat32, kFloat16, kBFloat16, kInt8, kTopK };

// "float32", "float16", "bfloat16", "int8", "topk": as job.toml spells them.
const char* UpdateEncodingName(UpdateEncoding encoding);

// Scalar conversions (bit patterns as uint16_t).
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t bits);
uint16_t FloatToBFloat16(float value);
float BFloat16ToFloat(uint16_t bits);

// The entries top-k sends of a tensor of n: ceil(fraction x n), at least 1 and at most n
// (0 for an empty tensor). `fraction` must be in (0, 1].
uint64_t TopKCount(uint64_t n, double fraction);

// The bytes a tensor of `elements` values takes in `encoding` (`fraction`: top-k's), or
// nullopt where that would pass UINT64_MAX.
std::optional<uint64_t> EncodedByteSize(UpdateEncoding encoding, uint64_t elements, double fraction);

// `values` encoded; `fraction` is read for kTopK only and must be in (0, 1].
std::string EncodeValues(UpdateEncoding encoding, std::span<const float> values, double fraction);

// What `encoding` loses of `values`: each value minus what its decoder reads back. Error
// feedback keeps it and adds it to the next update (top-k: the entries not sent, the sent
// ones 0).
std::vector<float> EncodingResidual(UpdateEncoding encoding, std::span<const float> values, double fraction);

// For a tensor whose values must stay 0 or more once added to `base` (a batch norm's running
// variance: `values` its delta and `base` the model the receiver adds it to, or zeros for the
// trained tensor sent whole): changes `values` so that, for every i, base[i] plus what the
// decoder of `encoding` reads back of values[i] is 0 or more in float. A value below -base
// is raised to -base; one whose encoded form still reads back below -base (a float16 step, an
// int8 scale's) is raised further for a few passes and then sent as 0 (the base kept), which
// every encoding reads back exactly. `base` holds values of 0 or more, as many as `values`.
// Returns how many values were changed.
size_t KeepSumNotNegative(UpdateEncoding encoding, std::span<const float> base, std::span<float> values,
                          double fraction);

// Decodes `bytes` into `out`, whose size is the tensor's element count; `fraction` gives
// top-k's expected k. InvalidArgument naming what is wrong; `out` is then unspecified.
Status DecodeValues(UpdateEncoding encoding, std::string_view bytes, double fraction, std::span<float> out);

}  // namespace tessera
