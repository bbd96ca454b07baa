// Host reduction kernels used by the send/recv algorithms and the fallback compositions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/types.h"

namespace tessera::collectives {

// dst[i] = op(a[i], b[i]) for i < count; dst may alias a or b. kAvg reduces as kSum: the
// caller divides once at the end with DivideElements. op(a, b) and op(b, a) give the same
// bits: for floats kMax and kMin give the canonical quiet NaN when either side is NaN, and
// rank +0 above -0.
void ReduceElements(void* dst, const void* a, const void* b, size_t count, DataType type,
                    ReduceOp op);

// buffer[i] /= divisor (integer division for integer types, done in int64 whatever the
// element type), for ReduceOp::kAvg. A divisor below 2 leaves the buffer as it is.
void DivideElements(void* buffer, size_t count, DataType type, int divisor);

// Float16 averages run in float32 (the sum of float16 values overflows at 65504 long before
// their average does): the buffers are widened, averaged as float32 and narrowed back once.
void HalfToFloatElements(const uint16_t* half, float* wide, size_t count);
void FloatToHalfElements(const float* wide, uint16_t* half, size_t count);

}  // namespace tessera::collectives
