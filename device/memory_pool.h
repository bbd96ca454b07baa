// A per-device caching allocator. Requests are rounded up to a size class (from 256 bytes, four
// classes per doubling: 256, 320, 384, 448, 512, 640, ..., so a block is at most a quarter
// larger than its request); a released block goes back to its class's free list instead of to the driver,
// so a training loop that allocates the same shapes every step takes nothing from the driver
// after its first step.
//
// Thread safety: all methods may be called from any thread.
// Ownership: the pool owns every block it ever took from the driver and returns them in its
// destructor; blocks still handed out at that point are a programming error (checked by assert).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "base/status.h"

namespace tessera {

// What a backend's driver offers the pool: raw allocation and release of device memory.
// `allocate` returns nullptr when the device is out of memory.
struct DriverAllocator {
  std::function<void*(size_t bytes)> allocate;
  std::function<void(void* address, size_t bytes)> release;
};

struct MemoryPoolStats {
  uint64_t driver_allocations = 0;  // calls that reached the driver
  uint64_t bytes_from_driver = 0;   // total bytes the pool holds from the driver
  uint64_t pool_hits = 0;           // requests served from a free list
  uint64_t bytes_in_use = 0;        // size-class bytes currently handed out
  uint64_t blocks_in_use = 0;
};

class MemoryPool {
 public:
  explicit MemoryPool(DriverAllocator driver);
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // Returns a block of at least `bytes` bytes (a zero-byte request gets the smallest class).
  // ResourceExhausted when the driver has no memory left even after the free lists are
  // returned to it, or when `bytes` is above the largest size class.
  Result<void*> Acquire(size_t bytes, size_t* class_bytes);
  // Gives back a block from Acquire; `class_bytes` is the value Acquire reported.
  void Release(void* address, size_t class_bytes);
  // Returns every cached (free) block to the driver.
  void Trim();

  MemoryPoolStats stats() const;

  // The smallest size class, and how many classes lie between two powers of two (the first
  // of them the power itself).
  static constexpr size_t kSmallestClass = 256;
  static constexpr size_t kClassesPerDoubling = 4;
  // The largest size class, 2^63 bytes on a 64-bit host.
  static constexpr size_t kLargestClass = SIZE_MAX / 2 + 1;
  // What SizeClass returns for a request larger than the largest class; Acquire refuses it.
  static constexpr size_t kNoClass = SIZE_MAX;

  // The size class a request of `bytes` falls into; kNoClass above kLargestClass.
  static size_t SizeClass(size_t bytes);

 private:
  DriverAllocator driver_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_blocks_;  // by size class
  MemoryPoolStats stats_;
};

}  // namespace tessera
