// An in-memory labelled image dataset, as loaded from IDX files or another source.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
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
  // The samples (count * channels * rows * cols values, normalised, NCHW) are held one of two
  // ways. Sources of 8-bit pixels (IDX) keep the bytes, and a byte p stands for the value
  // pixel_values[p]: a quarter of the memory of floats, and the same values bit for bit.
  // Every other source keeps floats in `images`. Read samples through CopyImage/ImageValues,
  // which serve both.
  std::vector<float> images;           // float samples; empty when `pixels` holds them
  std::vector<uint8_t> pixels;         // 8-bit samples; empty when `images` holds them
  std::array<float, 256> pixel_values{};
  std::vector<uint8_t> labels;   // count values in [0, num_classes)

  int64_t SampleSize() const { return static_cast<int64_t>(channels) * rows * cols; }
  bool EightBit() const { return !pixels.empty(); }

  // Writes sample i's SampleSize() values to `out`.
  void CopyImage(int64_t i, float* out) const {
    const int64_t n = SampleSize();
    if (EightBit()) {
      const uint8_t* in = pixels.data() + i * n;
      for (int64_t k = 0; k < n; ++k) out[k] = pixel_values[in[k]];
    } else {
      std::memcpy(out, images.data() + i * n, static_cast<size_t>(n) * sizeof(float));
    }
  }
  // Sample i's values.
  std::vector<float> ImageValues(int64_t i) const {
    std::vector<float> out(static_cast<size_t>(SampleSize()));
    CopyImage(i, out.data());
    return out;
  }
  // Every sample's values, as floats (count * SampleSize()).
  std::vector<float> Values() const {
    if (!EightBit()) return images;
    std::vector<float> out(pixels.size());
    for (size_t k = 0; k < pixels.size(); ++k) out[k] = pixel_values[pixels[k]];
    return out;
  }
  // Bytes the samples take in memory.
  size_t SampleBytes() const { return EightBit() ? pixels.size() : images.size() * sizeof(float); }
};

}  // namespace tessera
