// NumPy's file formats: one array in a .npy file, named arrays in a .npz archive (a zip of
// .npy files, stored or deflated). Tessera reads them for datasets and for the arrays an
// external trainer hands back, and writes them for model export and for the arrays it hands
// to an external trainer.
//
// Every file is treated as hostile: header lengths, shapes, element counts, sizes and
// offsets are checked before anything is allocated, against a caller's byte limit, and every
// error names the file (and the array) and says what was expected and what was found.
//
// Supported dtypes: float32, float64, uint8, int8, int32, int64 (little-endian, or a
// single byte), C order. Fortran order, big-endian, object and structured arrays are refused
// by name. Written archives use the "stored" method with float32 arrays.
//
// Thread safety: free functions, no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "core/tensor.h"

namespace tessera {

// One array as a .npy file holds it.
struct NumpyArray {
  std::string name;              // its key in an .npz ("conv1.weight"); empty for a lone .npy
  std::string dtype;             // NumPy's descriptor: "<f4", "<f8", "|u1", "|i1", "<i4", "<i8"
  std::vector<int64_t> shape;    // empty: a scalar
  std::string data;              // the raw little-endian bytes, C order

  int64_t NumElements() const;
  // The values converted to float32 (integers exactly while they fit; float64 rounded).
  // `what` names the array in errors.
  Result<std::vector<float>> ToFloat32(const std::string& what) const;
  // The values as integers; floats must hold whole numbers.
  Result<std::vector<int64_t>> ToInt64(const std::string& what) const;
};

// The most bytes a file or an archive member may expand to, unless a caller says otherwise.
inline constexpr uint64_t kDefaultNumpyByteLimit = uint64_t{4} << 30;

// Parses the bytes of one .npy file. `what` names it in errors ("train.npz: x.npy").
Result<NumpyArray> ParseNpy(std::string_view bytes, const std::string& what,
                            uint64_t max_bytes = kDefaultNumpyByteLimit);
// The bytes of a .npy file (format version 1.0) holding `array`.
std::string EncodeNpy(const NumpyArray& array);

Result<NumpyArray> ReadNpy(const std::string& path, uint64_t max_bytes = kDefaultNumpyByteLimit);
// Every array of an .npz archive, in the archive's order, named without the ".npy" suffix.
// `max_bytes` bounds the archive's total expanded size.
Result<std::vector<NumpyArray>> ReadNpz(const std::string& path, uint64_t max_bytes = kDefaultNumpyByteLimit);
// Parses an archive already in memory; `what` names it in errors.
Result<std::vector<NumpyArray>> ParseNpz(std::string_view bytes, const std::string& what,
                                         uint64_t max_bytes = kDefaultNumpyByteLimit);
// The bytes of an .npz archive of `arrays` (stored, no compression); names must be unique
// and non-empty. Refuses an archive of 4 GiB or more (no zip64).
Result<std::string> EncodeNpz(const std::vector<NumpyArray>& arrays);
// Writes EncodeNpz(arrays) to `path` whole or not at all (base/whole_file.h: PATH.tmp, every
// step checked, renamed into place); `sync`: fsync'd before the rename and its directory after,
// as an export is (a hand-over read back at once on the same machine need not be).
Status WriteNpz(const std::string& path, const std::vector<NumpyArray>& arrays, bool sync = true);

// A float32 tensor as an array of the same name and shape, and back.
NumpyArray ToNumpy(const NamedTensor& tensor);
std::vector<NumpyArray> ToNumpy(const TensorSet& tensors);
Result<NamedTensor> ToTensor(const NumpyArray& array, const std::string& what);

}  // namespace tessera
