// Host tensors as the coordinator and the worker exchange them: named, shaped float32
// arrays. A model's state, a model delta and an aggregate are each a TensorSet whose order
// is the model's parameter order. Device-resident storage lives in device/; these are the
// host copies that travel and that the coordinator aggregates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera {

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // row-major, size == product of shape

  int64_t NumElements() const;
  size_t ByteSize() const { return values.size() * sizeof(float); }
  std::string Sha256() const;  // hex SHA-256 of the little-endian bytes of `values`
};

using TensorSet = std::vector<NamedTensor>;

std::string ShapeToString(const std::vector<int64_t>& shape);  // "[6, 1, 5, 5]"
int64_t TotalElements(const TensorSet& tensors);
// Hash of a whole set: SHA-256 over every tensor's name, shape and content hash in order.
std::string TensorSetSha256(const TensorSet& tensors);
// The same from each tensor's hash already computed (tensor_hashes[i] == tensors[i].Sha256()),
// so that a set whose tensors were hashed for a manifest is not hashed again.
std::string TensorSetSha256(const TensorSet& tensors, const std::vector<std::string>& tensor_hashes);

// Checks that `candidate` has exactly the names, shapes and order of `reference`, and as many
// values as its shapes hold; it does not look at the values (CheckFinite does). The error
// names the first offending tensor and what was expected; `what` prefixes it ("update from
// worker w-3 for round 4").
Status CheckSameLayout(const TensorSet& reference, const TensorSet& candidate, const std::string& what);
// Checks that every value is finite, naming the first that is not.
Status CheckFinite(const TensorSet& tensors, const std::string& what);
// Checks that no value of `tensor` is below zero, naming the first that is and its value.
Status CheckNotNegative(const NamedTensor& tensor, const std::string& what);
// `trained` minus `global`, value by value, in `trained`'s place: the change a round made.
// The two have the same layout (checked by the caller).
TensorSet DeltaFrom(TensorSet trained, const TensorSet& global);

}  // namespace tessera
