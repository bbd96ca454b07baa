// An in-memory labelled image dataset, as loaded from IDX files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

struct Dataset {
  std::string source;            // where it came from, for messages ("train-images-idx3-ubyte.gz")
  int64_t count = 0;             // number of samples
  int channels = 1;
  int rows = 0;
  int cols = 0;
  int num_classes = 10;
  std::vector<float> images;     // count * channels * rows * cols, normalised, NCHW
  std::vector<uint8_t> labels;   // count values in [0, num_classes)

  int64_t SampleSize() const { return static_cast<int64_t>(channels) * rows * cols; }
  const float* Image(int64_t i) const { return images.data() + i * SampleSize(); }
};

}  // namespace tessera
