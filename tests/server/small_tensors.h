// Tiny tensor sets for the strategies' arithmetic tests: a two-tensor layout ("w" [2], "b"
// [1]) whose values a test writes by hand, every value of a set in order, and the header of
// an update to the round those tests open.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::server::testing {

inline TensorSet Layout(float a, float b, float c) { return {{"w", {2}, {a, b}}, {"b", {1}, {c}}}; }

inline std::vector<float> Values(const TensorSet& set) {
  std::vector<float> all;
  for (const auto& t : set) all.insert(all.end(), t.values.begin(), t.values.end());
  return all;
}

// From `worker` for round 4, attempt 1, of job "job-1", trained from model version 3 on
// `samples` samples.
inline v1::UpdateHeader HeaderFor(const std::string& worker, uint64_t samples) {
  v1::UpdateHeader h;
  h.set_worker_id(worker);
  h.set_job_id("job-1");
  h.set_round(4);
  h.set_attempt(1);
  h.set_base_model_version(3);
  h.set_samples(samples);
  return h;
}

}  // namespace tessera::server::testing
