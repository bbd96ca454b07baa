// Datasets in the formats a job may name, read the same way by the coordinator (its test
// split, and the shape it infers a job's model from) and by the workers (their share of the
// training split, or their own files).
//
// A dataset is a directory holding a training and a test split in one format:
//
//   idx      MNIST's format: train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-
//            idx3-ubyte, t10k-labels-idx1-ubyte, each plain or gzip (".gz"). One channel.
//            An image file whose header promises more than 4 GiB of pixels is refused. Its
//            labels and shape are read without its pixels; rows are loaded by reading the
//            image file through once, keeping only those asked for.
//   cifar10  CIFAR-10's binary version: data_batch_1.bin ... data_batch_5.bin (those present,
//            from the first without a gap: a missing batch before a present one is kNotFound
//            naming it) and test_batch.bin; each record one label byte then 3,072
//            pixel bytes (1,024 red, 1,024 green, 1,024 blue, row-major 32x32); a batch
//            of more than 4 GiB is refused.
//   npz      train.npz and test.npz, each with an array "x" (N,C,H,W), (N,H,W) or (N,F) of
//            uint8, float32 or float64, and "y" (N) of integer labels. (N,H,W) is one channel;
//            (N,F) is F features, read as F channels of 1x1.
//   csv      train.csv and test.csv: a header row naming the columns, then one sample a row;
//            one column (label_column) holds integer labels, every other a number. F feature
//            columns are read as F channels of 1x1. Comma-separated, no quoting; a UTF-8
//            byte-order mark before the header is skipped. A file of more than 4 GiB, a
//            line of more than 64 MiB, or more than 2^30 values in all (4 GiB as floats)
//            is refused.
//
// Pixels stored as bytes (idx, cifar10, uint8 npz) are scaled to [0, 1]; then each channel c
// becomes (x - mean[c]) / std[c] when the source gives a mean and std (one value applies to
// every channel). Labels are integers in [0, 255].
//
// Every file is hostile: headers, sizes, counts, labels, field counts and numbers are checked,
// and an error names the file (and line, array or record) and what was expected. Byte budgets
// bound what a file may make us allocate.
//
// Thread-compatible: free functions, no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "core/data/dataset.h"

namespace tessera {

enum class DataFormat { kIdx, kCifar10, kNpz, kCsv };

// "idx", "cifar10", "npz", "csv": the names job specs use.
std::string_view DataFormatName(DataFormat format);
Result<DataFormat> ParseDataFormat(std::string_view name);

struct DataSource {
  DataFormat format = DataFormat::kIdx;
  std::string dir;                  // the dataset's directory
  std::string label_column = "label";  // csv
  std::vector<float> mean, std;     // per channel, or one for all; empty: no normalisation
};

// What a split holds, read from headers where the format has them (idx, cifar10, npz read
// only what they need; csv reads the file).
struct DataShape {
  int channels = 0, rows = 0, cols = 0;
  int64_t count = 0;
  int max_label = -1;  // the largest label seen (all of them are read)
};

// The split's shape and its labels, without keeping its samples.
Result<DataShape> InspectSplit(const DataSource& source, bool train);
Result<std::vector<uint8_t>> ReadSplitLabels(const DataSource& source, bool train);

// The samples at `rows` of a split (in that order; they may repeat), normalised; the others
// are never converted to floats. kOutOfRange names the first row outside the split.
// `num_classes`: labels must lie in [0, num_classes).
Result<Dataset> LoadSplitRows(const DataSource& source, bool train, const std::vector<int64_t>& rows,
                              int num_classes);
// The whole split.
Result<Dataset> LoadSplit(const DataSource& source, bool train, int num_classes);

// The files a split is read from, for messages and tests ("cifar10 test split: DIR/test_batch.bin").
Result<std::vector<std::string>> SplitFiles(const DataSource& source, bool train);

// Writers for tests and for preparing local data (idx has WriteIdxPair in idx.h).
// CIFAR-10 records: labels.size() records of 3,072 pixel bytes each (CHW).
Status WriteCifar10Batch(const std::string& path, const std::vector<uint8_t>& labels,
                         const std::vector<uint8_t>& pixels);
// A csv split: `header` names the columns; each row has header.size() values.
Status WriteCsv(const std::string& path, const std::vector<std::string>& header,
                const std::vector<std::vector<double>>& rows);

}  // namespace tessera
