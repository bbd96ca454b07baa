#include "device/memory_pool.h"

#include <bit>
#include <cassert>
#include <string>

namespace tessera {

MemoryPool::MemoryPool(DriverAllocator driver) : driver_(std::move(driver)) {}

MemoryPool::~MemoryPool() {
  assert(stats_.blocks_in_use == 0 && "device buffers outlived their device");
  Trim();
}

size_t MemoryPool::SizeClass(size_t bytes) {
  if (bytes > kLargestClass) return kNoClass;
  if (bytes <= kSmallestClass) return kSmallestClass;
  // Four classes between consecutive powers of two: 2^k, then 2^k + i x 2^(k-2) for i = 1..3.
  // A request takes at most a quarter more than it asked for (a power-of-two class could
  // take nearly twice: a 10 MiB model in 16 MiB). No step overflows: the sums stay within
  // (2^k, 2^(k+1)] and 2^(k+1) <= kLargestClass.
  const size_t power = std::bit_floor(bytes);
  if (power == bytes) return bytes;
  const size_t step = power / kClassesPerDoubling;
  return power + (bytes - power + step - 1) / step * step;
}

Result<void*> MemoryPool::Acquire(size_t bytes, size_t* class_bytes) {
  const size_t size = SizeClass(bytes);
  if (size == kNoClass) {
    return ResourceExhaustedError("device memory pool: a request of " + std::to_string(bytes) +
                                  " bytes is larger than the largest size class (" +
                                  std::to_string(kLargestClass) + " bytes)");
  }
  *class_bytes = size;
  std::lock_guard<std::mutex> lock(mutex_);
  auto& cached = free_blocks_[size];
  if (!cached.empty()) {
    void* address = cached.back();
    cached.pop_back();
    ++stats_.pool_hits;
    stats_.bytes_in_use += size;
    ++stats_.blocks_in_use;
    return address;
  }
  void* address = driver_.allocate(size);
  if (address == nullptr) {
    // Give the cached blocks of other classes back and try once more.
    for (auto& [cached_size, blocks] : free_blocks_) {
      for (void* block : blocks) {
        driver_.release(block, cached_size);
        stats_.bytes_from_driver -= cached_size;
      }
      blocks.clear();
    }
    address = driver_.allocate(size);
    if (address == nullptr) {
      return ResourceExhaustedError("device memory pool: the driver could not allocate " +
                                    std::to_string(size) + " bytes (request of " +
                                    std::to_string(bytes) + " bytes)");
    }
  }
  ++stats_.driver_allocations;
  stats_.bytes_from_driver += size;
  stats_.bytes_in_use += size;
  ++stats_.blocks_in_use;
  return address;
}

void MemoryPool::Release(void* address, size_t class_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_blocks_[class_bytes].push_back(address);
  stats_.bytes_in_use -= class_bytes;
  --stats_.blocks_in_use;
}

void MemoryPool::Trim() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [size, blocks] : free_blocks_) {
    for (void* block : blocks) {
      driver_.release(block, size);
      stats_.bytes_from_driver -= size;
    }
    blocks.clear();
  }
}

MemoryPoolStats MemoryPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace tessera
