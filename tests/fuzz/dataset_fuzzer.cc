// Fuzzes the dataset readers of core/data/dataset_source.h (cifar10, npz, csv) the way a
// worker meets them: as files in a directory. The first input byte picks the format; the rest
// is the test split's file (test_batch.bin, test.npz or test.csv), written to a private
// temporary directory and read through InspectSplit, ReadSplitLabels and LoadSplit.
//
// Checks that an accepted split holds what its shape promises: count x C x H x W finite
// values, count labels below the classes, and the same shape from the header and the load.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/data/dataset_source.h"
#include "fuzz_check.h"

namespace {

const std::string& Directory() {
  static const std::string dir = [] {
    char pattern[] = "/tmp/tessera-dataset-fuzz-XXXXXX";
    const char* made = mkdtemp(pattern);
    if (made == nullptr) std::abort();
    return std::string(made);
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  if (size < 1) return 0;
  static const DataFormat kFormats[] = {DataFormat::kCifar10, DataFormat::kNpz, DataFormat::kCsv};
  static const char* kFiles[] = {"test_batch.bin", "test.npz", "test.csv"};
  const int which = data[0] % 3;
  const std::string path = Directory() + "/" + kFiles[which];
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  }
  DataSource source;
  source.format = kFormats[which];
  source.dir = Directory();
  source.label_column = "label";
  source.mean = {0.5f};
  source.std = {0.25f};
  Result<DataShape> shape = InspectSplit(source, /*train=*/false);
  Result<std::vector<uint8_t>> labels = ReadSplitLabels(source, /*train=*/false);
  Result<Dataset> loaded = LoadSplit(source, /*train=*/false, 256);
  if (loaded.ok()) {
    const Dataset& d = *loaded;
    FUZZ_CHECK(d.count >= 0 && d.channels >= 1 && d.rows >= 1 && d.cols >= 1, "accepted a split without a shape");
    const std::vector<float> values = d.Values();
    FUZZ_CHECK(values.size() == static_cast<size_t>(d.count) * static_cast<size_t>(d.SampleSize()),
               "image values differ from count x sample size");
    FUZZ_CHECK(d.labels.size() == static_cast<size_t>(d.count), "labels differ from the count");
    for (float v : values) FUZZ_CHECK(std::isfinite(v), "a non-finite value was accepted");
    if (shape.ok()) {
      FUZZ_CHECK(shape->count == d.count && shape->channels == d.channels && shape->rows == d.rows &&
                     shape->cols == d.cols,
                 "the header's shape differs from the loaded split's");
    }
    if (labels.ok()) FUZZ_CHECK(*labels == d.labels, "the labels read alone differ from the loaded ones");
  }
  return 0;
}
