// A copy whose stores bypass the caches (non-temporal stores), for bytes that will not be
// read again soon: a large update's chunks, which wait for the fold while other updates pass
// through the caches. A plain memcpy first reads each destination line it writes (to own
// it), then writes it back when it leaves the cache: three passes over memory where this
// makes two. The source is read as memcpy reads it, so a caller that has just hashed and
// scanned it reads it from the cache.
//
// Ends with a store fence: once the caller publishes the bytes the usual way (a mutex, an
// atomic), another thread sees them as after memcpy. Any alignment, any length; on other
// CPUs than x86-64 it is memcpy.
#pragma once

#include <cstddef>

namespace tessera {

void StreamingCopy(void* dst, const void* src, size_t n);

}  // namespace tessera
