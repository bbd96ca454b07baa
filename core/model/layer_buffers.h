// What the layers' implementations (core/model/layers.cc, core/model/declared_layers.cc) share
// about their device memory. Not for use outside them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "device/device.h"

namespace tessera::layer_buffers {

// `base + offset`, or null for no gradients bound (Model::Build binds none until the first
// Backward needs them).
inline float* At(float* base, int64_t offset) { return base == nullptr ? nullptr : base + offset; }

// Makes `buffer` hold at least `bytes`, reallocating only when it is smaller: a layer's
// device state grows with the largest batch seen, never shrinks.
inline Status Grow(Device& device, DeviceBuffer& buffer, size_t bytes) {
  if (buffer.bytes() >= bytes) return Status::Ok();
  buffer.Reset();
  ASSIGN_OR_RETURN(buffer, device.Allocate(bytes));
  return Status::Ok();
}

}  // namespace tessera::layer_buffers
