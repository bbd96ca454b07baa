// Transparent huge pages for large buffers.
//
// A buffer of a few megabytes that is allocated, filled and freed every round (a 10 MiB
// model's download, its parameters, gradients and optimiser state, the trained copy, the
// encoded update) is mapped for itself and faulted in 4 KiB at a time: 2,600 page faults for
// a 10 MiB tensor, each of them a trap into the kernel and, on a virtual machine, into the
// hypervisor. Advised before it is first touched, the same buffer is faulted in 2 MiB pages.
// Only the whole 2 MiB pages inside the buffer are advised, so that what is resident is what
// the buffer uses, as before, and only memory mapped for the buffer alone.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tessera {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Buffers of fewer bytes are not advised: they hold at most one whole 2 MiB page, not worth
// the system call.
inline constexpr size_t kHugePageAdviceMinBytes = size_t{4} << 20;

// Off until a process turns it on (a lean worker does: worker/main.cc).
void EnableHugePageAdvice(bool on);
bool HugePageAdviceEnabled();

// When enabled, asks the kernel (madvise MADV_HUGEPAGE) to back the whole 2 MiB pages inside
// [data, data + bytes) with transparent huge pages when `bytes` is at least
// kHugePageAdviceMinBytes. Effective where transparent huge pages are enabled ("madvise" or
// "always"); a no-op elsewhere and on failure. Call it before the memory is first touched, and
// only on memory mapped for this buffer alone (MapHugeAligned): advice on a range of the heap
// would outlive the buffer and let the kernel back smaller blocks there with whole huge pages.
void AdviseHugePages(void* data, size_t bytes);

// n zero floats; when enabled, advised before they are written if malloc mapped them for
// themselves (glibc does so for blocks above its mmap threshold, unless a free block of the
// heap fits: those are left alone).
std::vector<float> ZeroedFloats(size_t n);
// Resizes `bytes` (empty) to n zero bytes, advised as ZeroedFloats' are.
void ResizeZeroed(std::string& bytes, size_t n);

// `bytes` (rounded up to whole 4 KiB pages) of zeroed memory mapped for themselves, starting
// on a 2 MiB boundary; nullptr when the system has no more. Given back by UnmapHugeAligned with
// the same `bytes`.
void* MapHugeAligned(size_t bytes);
void UnmapHugeAligned(void* data, size_t bytes);

}  // namespace tessera
