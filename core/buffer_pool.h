// Float buffers recycled between updates of one model layout. A coordinator assembles every
// client's update into tensors of the same few sizes, round after round; taking a buffer of a
// size given back before costs no allocation, no zero-filling and no page faults (the large
// ones would otherwise come from and go back to mmap, or churn malloc's free lists).
//
// At most `max_bytes` of idle buffers are kept; more are freed when given back. With one
// layout the pool never holds more than the most buffers in use at once: a buffer is
// allocated only when none of its size is idle. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace tessera {

class FloatBufferPool {
 public:
  explicit FloatBufferPool(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // A buffer of exactly `n` values. A recycled one holds what it held before (every caller
  // overwrites it); a new one is zero-filled.
  std::vector<float> Take(size_t n);
  // Keeps `buffer` for a later Take of its size while the idle bytes stay within max_bytes.
  void Give(std::vector<float>&& buffer);
  // Every tensor's values.
  void Give(TensorSet&& tensors);

  uint64_t idle_bytes() const;
  // Frees every idle buffer.
  void Clear();

 private:
  const uint64_t max_bytes_;
  mutable std::mutex mu_;  // guards the two below
  std::unordered_map<size_t, std::vector<std::vector<float>>> idle_;  // by size
  uint64_t idle_bytes_ = 0;
};

}  // namespace tessera
