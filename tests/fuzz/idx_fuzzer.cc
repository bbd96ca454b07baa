// Fuzzes the IDX readers (core/data/idx.h) through their in-memory entry points: the input is
// an image or label file's bytes, plain or gzip-compressed, and goes to both readers (the
// magic number decides which one gets past the header).
//
// Checks that an accepted file holds exactly the elements its header promises.
#include <string>
#include <vector>

#include "core/data/idx.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::vector<uint8_t> bytes(data, data + size);
  Result<IdxImages> images = ParseIdxImages(bytes, "fuzzed-images-idx3-ubyte");
  if (images.ok()) {
    FUZZ_CHECK(images->rows >= 1 && images->cols >= 1 && images->count >= 0, "accepted image dimensions");
    FUZZ_CHECK(images->pixels.size() == static_cast<size_t>(images->count) * static_cast<size_t>(images->rows) *
                                            static_cast<size_t>(images->cols),
               "pixel count differs from count x rows x cols");
  }
  Result<std::vector<uint8_t>> labels = ParseIdxLabels(bytes, "fuzzed-labels-idx1-ubyte");
  (void)labels;
  return 0;
}
