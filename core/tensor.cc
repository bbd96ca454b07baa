#include "core/tensor.h"

#include <cmath>
#include <sstream>

#include "base/escape.h"
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

namespace {

// A shape that came with a candidate tensor, for a message: its first dimensions, and how
// many there are in all when there are more, so that a shape of a million dimensions does not
// make a message of megabytes.
std::string UntrustedShape(const std::vector<int64_t>& shape) {
  constexpr size_t kShown = 8;
  if (shape.size() <= kShown) return ShapeToString(shape);
  std::string out = ShapeToString(std::vector<int64_t>(shape.begin(), shape.begin() + kShown));
  out.pop_back();
  return out + ", ... (" + std::to_string(shape.size()) + " dimensions)]";
}

}  // namespace

Status CheckSameLayout(const TensorSet& reference, const TensorSet& candidate, const std::string& what) {
  if (reference.size() != candidate.size()) {
    return InvalidArgumentError(what + ": expected " + std::to_string(reference.size()) +
                                " tensors, got " + std::to_string(candidate.size()));
  }
  for (size_t i = 0; i < reference.size(); ++i) {
    const auto& want = reference[i];
    const auto& got = candidate[i];
    if (want.name != got.name) {
      return InvalidArgumentError(what + ": tensor " + std::to_string(i) + ": expected name " +
                                  QuoteUntrusted(want.name) + ", got " + QuoteUntrusted(got.name));
    }
    if (want.shape != got.shape) {
      return InvalidArgumentError(what + ": tensor " + QuoteUntrusted(want.name) + ": expected shape " +
                                  UntrustedShape(want.shape) + ", got " + UntrustedShape(got.shape));
    }
    // The shape is the reference's here, so its element count is the reference's too.
    if (static_cast<int64_t>(got.values.size()) != got.NumElements()) {
      return InvalidArgumentError(what + ": tensor " + QuoteUntrusted(want.name) + ": shape " +
                                  ShapeToString(got.shape) + " needs " +
                                  std::to_string(got.NumElements()) + " values, got " +
                                  std::to_string(got.values.size()));
    }
  }
  return Status::Ok();
}

TensorSet DeltaFrom(TensorSet trained, const TensorSet& global) {
  for (size_t i = 0; i < trained.size(); ++i) {
    for (size_t j = 0; j < trained[i].values.size(); ++j) trained[i].values[j] -= global[i].values[j];
  }
  return trained;
}

Status CheckFinite(const TensorSet& tensors, const std::string& what) {
  for (const auto& t : tensors) {
    for (size_t j = 0; j < t.values.size(); ++j) {
      if (!std::isfinite(t.values[j])) {
        return InvalidArgumentError(what + ": tensor " + QuoteUntrusted(t.name) + " element " +
                                    std::to_string(j) + " is " +
                                    (std::isnan(t.values[j]) ? "NaN" : "infinite") +
                                    "; expected finite values");
      }
    }
  }
  return Status::Ok();
}

Status CheckNotNegative(const NamedTensor& tensor, const std::string& what) {
  for (size_t j = 0; j < tensor.values.size(); ++j) {
    if (tensor.values[j] < 0.0f) {
      std::ostringstream value;
      value << tensor.values[j];
      return InvalidArgumentError(what + ": tensor " + QuoteUntrusted(tensor.name) + " element " + std::to_string(j) +
                                  " is " + value.str() + "; expected a value of 0 or more");
    }
  }
  return Status::Ok();
}

}  // namespace tessera
