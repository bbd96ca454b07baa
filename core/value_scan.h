// One float32 tensor's scan, fed its bytes in pieces of any size (a piece may end inside a
// value): the sum of its squares in sixteen lanes of double, whether every value is finite,
// and the largest magnitude. Fed whole or in pieces, the lanes come out the same to the bit:
// lane 4q + k sums the squares of values 16i + 4q + k, in order, and the values after the last
// whole group of sixteen go to lane 0 at Finish. The coordinator's update check reads its
// deltas' norms and finiteness from it (server/jobs/update_checks.h), and the update
// assembler feeds it each chunk of an update's delta as the chunk lands, while it is in cache
// (proto/update_assembler.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace tessera {

class ValueScan {
 public:
  static constexpr size_t kLanes = 16;

  struct Result {
    double lanes[kLanes] = {};  // partial sums of squares, added up by the caller in its order
    bool finite = true;         // no infinity or NaN among the values
    float max_abs = 0;          // the largest magnitude, when every value is finite
    uint64_t values = 0;        // how many values were scanned
  };

  // One pass over `n` values.
  static Result Of(const float* values, size_t n);

  // The next `n` bytes of the tensor.
  void Feed(const uint8_t* bytes, size_t n);
  // Once every byte is fed (a whole number of values); the scan starts over after it.
  Result Finish();

 private:
  double lanes_[kLanes] = {};
  uint32_t bad_ = 0;
  float max_abs_ = 0;
  uint64_t values_ = 0;  // in whole groups of sixteen so far
  uint8_t carry_[kLanes * sizeof(float)];
  size_t carry_bytes_ = 0;  // the bytes of a group not yet complete
};

// A scan per tensor of a set, in order; nullopt for a tensor not scanned.
using TensorScans = std::vector<std::optional<ValueScan::Result>>;

}  // namespace tessera
