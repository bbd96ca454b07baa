#include "core/value_scan.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include "base/target_clones.h"
#include "core/scan_vectors.h"

namespace tessera {
namespace {

using scan::AddSquares;
using scan::Bits8;
using scan::Doubles4;
using scan::Floats8;
using scan::MaxMagnitude;
using scan::OrNonFinite;

// `groups` whole groups of sixteen values at `d` added to the state: the lanes in `lanes`
// (as four vectors of four), the non-finite flag in `bad`, the magnitude in `max_abs`.
TESSERA_CLONES_AVX2 __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic"))) void
ScanGroups(const uint8_t* __restrict d, size_t groups, double* __restrict lanes, uint32_t* bad, float* max_abs) {
  Doubles4 s0, s1, s2, s3;
  std::memcpy(&s0, lanes, sizeof(s0));
  std::memcpy(&s1, lanes + 4, sizeof(s1));
  std::memcpy(&s2, lanes + 8, sizeof(s2));
  std::memcpy(&s3, lanes + 12, sizeof(s3));
  Bits8 bits = {};
  Floats8 m0 = {}, m1 = {};
  for (size_t g = 0; g < groups; ++g, d += ValueScan::kLanes * sizeof(float)) {
    Floats8 x0, x1;
    std::memcpy(&x0, d, sizeof(x0));
    std::memcpy(&x1, d + sizeof(x0), sizeof(x1));
    AddSquares(x0, &s0, &s1);
    AddSquares(x1, &s2, &s3);
    OrNonFinite(x0, &bits);
    OrNonFinite(x1, &bits);
    MaxMagnitude(x0, &m0);
    MaxMagnitude(x1, &m1);
  }
  std::memcpy(lanes, &s0, sizeof(s0));
  std::memcpy(lanes + 4, &s1, sizeof(s1));
  std::memcpy(lanes + 8, &s2, sizeof(s2));
  std::memcpy(lanes + 12, &s3, sizeof(s3));
  uint32_t b = 0;
  float m = *max_abs;
  for (size_t k = 0; k < 8; ++k) {
    b |= bits[k];
    m = std::max({m, m0[k], m1[k]});
  }
  *bad |= b;
  *max_abs = m;
}

constexpr size_t kGroupBytes = ValueScan::kLanes * sizeof(float);

}  // namespace

ValueScan::Result ValueScan::Of(const float* values, size_t n) {
  ValueScan scan;
  scan.Feed(reinterpret_cast<const uint8_t*>(values), n * sizeof(float));
  return scan.Finish();
}

void ValueScan::Feed(const uint8_t* bytes, size_t n) {
  if (n == 0) return;  // an empty tensor's bytes may be a null pointer, which memcpy must not get
  if (carry_bytes_ > 0) {  // complete the group a piece left open
    const size_t take = std::min(n, kGroupBytes - carry_bytes_);
    std::memcpy(carry_ + carry_bytes_, bytes, take);
    carry_bytes_ += take;
    bytes += take;
    n -= take;
    if (carry_bytes_ < kGroupBytes) return;
    ScanGroups(carry_, 1, lanes_, &bad_, &max_abs_);
    values_ += kLanes;
    carry_bytes_ = 0;
  }
  const size_t groups = n / kGroupBytes;
  if (groups > 0) {
    ScanGroups(bytes, groups, lanes_, &bad_, &max_abs_);
    values_ += groups * kLanes;
  }
  carry_bytes_ = n - groups * kGroupBytes;
  std::memcpy(carry_, bytes + groups * kGroupBytes, carry_bytes_);
}

ValueScan::Result ValueScan::Finish() {
  Result result;
  std::copy(std::begin(lanes_), std::end(lanes_), std::begin(result.lanes));
  uint32_t bad = bad_;
  float m = max_abs_;
  // The values after the last whole group, one by one into lane 0.
  for (size_t i = 0; i + sizeof(float) <= carry_bytes_; i += sizeof(float)) {
    float x;
    std::memcpy(&x, carry_ + i, sizeof(x));
    result.lanes[0] += static_cast<double>(x) * x;
    bad |= scan::NonFiniteBit(x);
    m = std::max(m, std::fabs(x));
  }
  result.finite = bad == 0;
  result.max_abs = m;
  result.values = values_ + carry_bytes_ / sizeof(float);
  *this = ValueScan();
  return result;
}

}  // namespace tessera
