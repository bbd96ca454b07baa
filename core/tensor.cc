#include "core/tensor.h"

#include <cmath>
#include <sstream>

#include "base/sha256.h"

namespace tessera {

int64_t NamedTensor::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string NamedTensor::Sha256() const { return Sha256Hex(values.data(), ByteSize()); }

std::string ShapeToString(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

int64_t TotalElements(const TensorSet& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += static_cast<int64_t>(t.values.size());
  return n;
}

std::string TensorSetSha256(const TensorSet& tensors) {
  std::vector<std::string> hashes;
  hashes.reserve(tensors.size());
  for (const auto& t : tensors) hashes.push_back(t.Sha256());
  return TensorSetSha256(tensors, hashes);
}

std::string TensorSetSha256(const TensorSet& tensors, const std::vector<std::string>& tensor_hashes) {
  Sha256 hasher;
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::string line = tensors[i].name + ShapeToString(tensors[i].shape) + tensor_hashes[i] + "\n";
    hasher.Update(line.data(), line.size());
  }
  return hasher.FinishHex();
}

Status CheckSameLayout(const TensorSet& reference, const TensorSet& candidate, const std::string& what) {
  if (reference.size() != candidate.size()) {
    return InvalidArgumentError(what + ": expected " + std::to_string(reference.size()) +
                                " tensors, got " + std::to_string(candidate.size()));
  }
  for (size_t i = 0; i < reference.size(); ++i) {
    const auto& want = reference[i];
    const auto& got = candidate[i];
    if (want.name != got.name) {
      return InvalidArgumentError(what + ": tensor " + std::to_string(i) + ": expected name '" +
                                  want.name + "', got '" + got.name + "'");
    }
    if (want.shape != got.shape) {
      return InvalidArgumentError(what + ": tensor '" + want.name + "': expected shape " +
                                  ShapeToString(want.shape) + ", got " + ShapeToString(got.shape));
    }
    if (static_cast<int64_t>(got.values.size()) != got.NumElements()) {
      return InvalidArgumentError(what + ": tensor '" + want.name + "': shape " +
                                  ShapeToString(got.shape) + " needs " +
                                  std::to_string(got.NumElements()) + " values, got " +
                                  std::to_string(got.values.size()));
    }
  }
  return Status::Ok();
}

Status CheckFinite(const TensorSet& tensors, const std::string& what) {
  for (const auto& t : tensors) {
    for (size_t j = 0; j < t.values.size(); ++j) {
      if (!std::isfinite(t.values[j])) {
        return InvalidArgumentError(what + ": tensor '" + t.name + "' element " +
                                    std::to_string(j) + " is " +
                                    (std::isnan(t.values[j]) ? "NaN" : "infinite") +
                                    "; expected finite values");
      }
    }
  }
  return Status::Ok();
}

}  // namespace tessera
