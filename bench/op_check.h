// Op checks: run one Device op on a device under test and on a reference device (the CPU
// backend) from the same host inputs, and compare what comes back. Used by bench_gpu (one
// case per op) and by tests/bench (the odd-shape sweep, on the CPU against itself here and on
// CUDA against the CPU where a GPU is present).
//
// A plain comparison misses an op that touches memory outside its buffers: pools round sizes
// up, so on a GPU nothing faults and on the CPU the heap is quietly corrupted. So every buffer
// is followed by a guard zone: after an input, 0xFF bytes (a NaN as float32, float16 and
// bfloat16), so that an op reading past it reads NaN into its outputs; after an output, 0x3F
// bytes (a finite float), so that any write past it, an in-place update too, changes the
// guard. Both are reported as failures, as is any output that is not finite (the inputs are
// finite, and so is every correct result).
//
// Thread safety: none; one OpRun per device and thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "device/device.h"

namespace tessera::op_check {

// Builds the buffers of one op's run on one device and brings its outputs back.
class OpRun {
 public:
  explicit OpRun(Device& device) : device_(device) {}

  // An input holding `host`.
  float* In(const std::vector<float>& host);
  int32_t* Ints(const std::vector<int32_t>& host);
  // An output of `count` zeros, or starting as `initial` (an op that reads and writes it: a
  // GEMM's c with beta, an in-place update). Outputs are compared in the order they were made.
  float* Out(size_t count);
  float* Out(const std::vector<float>& initial);
  // An int32 output (max pool's argmax), compared as the floats its values convert to.
  int32_t* IntsOut(size_t count);
  // `bytes` of uninitialised scratch (0xFF), guarded but not compared (a cast's intermediate).
  void* Raw(size_t bytes);
  Device& device() { return device_; }

  // Waits for the device, then returns the outputs concatenated. FailedPrecondition naming
  // the buffer when a guard changed; the device's own error when it reported one; the first
  // setup failure (allocation, copy) otherwise.
  Result<std::vector<float>> Results();

 private:
  struct Slot {
    DeviceBuffer buffer;
    size_t bytes = 0;      // what the op may touch; the guard follows
    std::string what;      // "input #2", "output #1"
    bool output = false;
    bool ints = false;     // int32 values
    unsigned char guard = 0;
  };
  void* Add(const void* host, size_t bytes, bool output, const char* kind, bool ints = false);

  Device& device_;
  std::vector<Slot> slots_;
  int inputs_ = 0, outputs_ = 0;
  Status setup_;
};

struct OpCheck {
  std::string name;        // what ran: "gemm a^T b 257x255x1025 alpha 0.5 beta 0.25"
  Op op = Op::kFill;
  bool large = false;      // seconds, or gigabytes, on a CPU reference
  // Largest allowed |device - reference|, relative to max(1, largest |reference output|);
  // 0 asks for the same bits.
  double tolerance = 1e-4;
  std::function<void(OpRun&)> issue;
};

struct OpComparison {
  double max_error = 0;    // largest |device - reference| over the outputs
  double scale = 0;        // largest |reference output|
  double allowed = 0;      // the tolerance in absolute terms
  size_t outputs = 0;
  std::string failure;     // empty when the check passed
  bool passed() const { return failure.empty(); }
};

// Issues `check` on `reference`, then on `device`, and compares.
OpComparison Compare(const OpCheck& check, Device& device, Device& reference);

// Deterministic uniform values in [low, high): fast enough for 2^27 of them.
std::vector<float> Pattern(size_t count, uint32_t seed, float low = -1.0f, float high = 1.0f);

// bench_gpu's checks: one or two per op at the sizes a small CNN uses.
std::vector<OpCheck> BenchChecks();

// The odd-shape sweep: every op at sizes that end mid-block, mid-warp and mid-vector. GEMM in
// every transpose at 1, 3, 255, 257 and 1025 (and rectangles mixing them), k = 0 (c = beta *
// c) and m or n = 0 (nothing); convolutions with batch 1, strides 2 and 3, padding 0 to 2,
// non-square kernels, and a kernel as large as the padded input; max pools with overlapping
// windows, leftover rows and ties; reductions over 1, 257 and 2^27 + 3 elements; casts through
// every dtype; element-wise ops at 1, 257 and 2^20 + 7. The layer-graph ops: activations into
// saturation, backwards in place, average pools over the max pools' geometries, batch norm
// with one position per channel and with 2^18 + 5, layer norm from 1 to 8193 columns, dropout
// with p 0 and seeds above 2^32, axpby with beta 0 over NaN. Max pool backward, dropout and the
// exact ops (fill, relu, casts) must match the reference bit for bit.
std::vector<OpCheck> OddShapeChecks();

}  // namespace tessera::op_check
