// Transparent huge pages for large buffers.
//
// A buffer of a few megabytes that is allocated, filled and freed every round (a 10 MiB
// model's download, its parameters, gradients and optimiser state, the trained copy, the
// encoded update) is mapped for itself and faulted in 4 KiB at a time: 2,600 page faults for
// a 10 MiB tensor, each of them a trap into the kernel and, on a virtual machine, into the
// hypervisor. Advised before it is first touched, the same buffer is faulted in 2 MiB pages.
// Only the whole 2 MiB pages inside the buffer are advised, so that what is resident is what
// the buffer uses, as before.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tessera {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Buffers of fewer bytes are not advised: they hold at most one whole 2 MiB page, not worth
// the system call.
inline constexpr size_t kHugePageAdviceMinBytes = size_t{4} << 20;

// Off until a process turns it on. The advice pays for memory that is mapped for its buffer
// alone and unmapped when the buffer is freed, as a lean worker's large buffers are (its
// main() fixes glibc's mmap threshold at 256 KiB). Where freed memory stays in the heap
// (glibc's default threshold grows to the largest block freed), an advised range would outlive
// its buffer and hold smaller ones, which the kernel may then back with whole huge pages.
void EnableHugePageAdvice(bool on);
bool HugePageAdviceEnabled();

// When enabled, asks the kernel (madvise MADV_HUGEPAGE) to back the whole 2 MiB pages inside
// [data, data + bytes) with transparent huge pages when `bytes` is at least
// kHugePageAdviceMinBytes. Effective where transparent huge pages are enabled ("madvise" or
// "always"); a no-op elsewhere and on failure. Call it before the memory is first touched.
void AdviseHugePages(void* data, size_t bytes);

// n zero floats, advised (when enabled) before they are written.
std::vector<float> ZeroedFloats(size_t n);
// Resizes `bytes` (empty) to n zero bytes, advised (when enabled) before they are written.
void ResizeZeroed(std::string& bytes, size_t n);

}  // namespace tessera
