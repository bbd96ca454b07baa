// Element types a device can hold. Training in Tessera is float32; the narrower types exist
// for transfer compression, mixed precision on accelerators and quantised NPUs.
#pragma once

#include <cstddef>
#include <string_view>

namespace tessera {

enum class DType {
  kFloat32,
  kFloat16,   // IEEE 754 binary16
  kBFloat16,  // the upper 16 bits of a float32
  kInt8,
  kInt32,
};

// Size of one element in bytes.
size_t DTypeSize(DType dtype);
// "float32", "float16", "bfloat16", "int8", "int32".
std::string_view DTypeName(DType dtype);

}  // namespace tessera
