// Tiny tensor sets for the strategies' arithmetic tests: a two-tensor layout ("w" [2], "b"
// [1]) whose values a test writes by hand, and every value of a set in order.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace tessera::server::testing {

inline TensorSet Layout(float a, float b, float c) { return {{"w", {2}, {a, b}}, {"b", {1}, {c}}}; }

inline std::vector<float> Values(const TensorSet& set) {
  std::vector<float> all;
  for (const auto& t : set) all.insert(all.end(), t.values.begin(), t.values.end());
  return all;
}

}  // namespace tessera::server::testing
