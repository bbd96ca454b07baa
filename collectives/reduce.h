// Host reduction kernels used by the send/recv algorithms and the fallback compositions.
#pragma once

#include <cstddef>

#include "collectives/types.h"

namespace tessera::collectives {

// dst[i] = op(a[i], b[i]) for i < count; dst may alias a or b. kAvg reduces as kSum: the
// caller divides once at the end with DivideElements.
void ReduceElements(void* dst, const void* a, const void* b, size_t count, DataType type,
                    ReduceOp op);

// buffer[i] /= divisor (integer division for integer types), for ReduceOp::kAvg.
void DivideElements(void* buffer, size_t count, DataType type, int divisor);

}  // namespace tessera::collectives
