// Reading and writing IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or plain.
//
// IDX layout: a 4-byte magic (two zero bytes, a type byte, a dimension count), one big-endian
// uint32 per dimension, then the elements in row-major order. Tessera reads the two kinds the
// image datasets use: idx1 unsigned-byte labels (magic 0x00000801, dims [count]) and idx3
// unsigned-byte images (magic 0x00000803, dims [count, rows, cols]).
//
// Every check is strict: a path that is not a regular file (a FIFO, opened without waiting for
// a writer), a wrong magic, a zero row or column size (a count of 0 items
// reads as an empty file), a file shorter or longer than its
// header promises, a corrupt or cut-off gzip stream, an image/label count mismatch and a label
// outside [0, num_classes) are each refused with a Status that names the file and says what
// was expected and what was found. Truncation and corruption are kDataLoss; well-formed files
// that do not fit together (mismatched counts, a label out of range) are kInvalidArgument; a
// missing file is kNotFound.
//
// Whether a file is gzip is decided by its first two bytes, not by its name.
//
// All functions are thread-compatible: they share no state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "core/data/dataset.h"

namespace tessera {

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// Fashion-MNIST's training-set pixel statistics after scaling to [0, 1]. A pixel byte x becomes
// (x / 255 - kFashionMnistMean) / kFashionMnistStd.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// How pixel bytes become floats: (x / 255 - mean) / std. The default is Fashion-MNIST's own
// statistics; {0, 1} keeps x / 255 (torchvision's ToTensor alone, as NIID-Bench's code reads it).
struct PixelNormalisation {
  float mean = kFashionMnistMean;
  float std = kFashionMnistStd;
};

// The raw contents of an idx3 unsigned-byte image file.
struct IdxImages {
  std::string source;           // the path it was read from
  int64_t count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols bytes, row-major
};

// Reads a whole file, inflating it when it starts with the gzip magic, as long as it holds at
// most `max_bytes` (after inflating): kInvalidArgument past that, having read (or inflated) no
// more than one byte beyond it. kNotFound when it cannot be opened; kDataLoss for a corrupt or
// truncated gzip stream.
Result<std::vector<uint8_t>> ReadMaybeGzipFile(const std::string& path, uint64_t max_bytes);

// Reads an idx3 unsigned-byte image file. The header is read first: a plain file whose size is
// not what it promises is refused before its elements are read, and a gzip stream is inflated
// no further than one byte past the promise (a stream that goes on is refused as trailing
// data), so that neither a short file's header nor a gzip bomb sets the memory used. A header
// promising more than 4 GiB of elements is kInvalidArgument before any is read (the row
// loaders below, which keep only the rows asked for, read larger files).
Result<IdxImages> ReadIdxImages(const std::string& path);
// Reads an idx1 unsigned-byte label file, as ReadIdxImages reads images.
Result<std::vector<uint8_t>> ReadIdxLabels(const std::string& path);
// Only the header of an idx3 unsigned-byte image file, checked as ReadIdxImages checks it (a
// plain file's size included): an IdxImages without pixels. A gzip stream's length is not
// checked; the row loaders below check it as they read.
Result<IdxImages> ReadIdxImagesHeader(const std::string& path);

// The same readers over a file's bytes already in memory, gzip-compressed or plain, with the
// same checks and errors; `source` stands for the file in messages and in IdxImages::source.
Result<IdxImages> ParseIdxImages(std::vector<uint8_t> bytes, const std::string& source);
Result<std::vector<uint8_t>> ParseIdxLabels(std::vector<uint8_t> bytes, const std::string& source);

// Loads an image file and its label file into a Dataset with one channel, pixels normalised
// with the Fashion-MNIST statistics above. `source` is the image file's name without its
// directory. Fails when the counts differ, a label is not in [0, num_classes), or the files
// hold no images (kInvalidArgument naming the image file; so do the row loaders below).
Result<Dataset> LoadIdxPair(const std::string& images_path, const std::string& labels_path,
                            int num_classes = 10, PixelNormalisation normalisation = {});

// Loads Fashion-MNIST's training (60000) or test (10000) split from `dir` (empty: the default
// directory). Looks for "train-images-idx3-ubyte.gz" / "train-labels-idx1-ubyte.gz" (or
// "t10k-..." for the test split), then for the same names without ".gz". Loading the training
// split takes well under a second.
Result<Dataset> LoadFashionMnist(const std::string& dir, bool train, PixelNormalisation normalisation = {});

// The image and label files of Fashion-MNIST's training or test split in `dir` (empty: the
// default directory), by the names LoadFashionMnist looks for; kNotFound lists what it tried.
struct IdxPairPaths {
  std::string images;
  std::string labels;
};
Result<IdxPairPaths> FindFashionMnist(const std::string& dir, bool train);
// The same for any MNIST-format dataset in `dir`; `dataset` names it in the kNotFound message.
Result<IdxPairPaths> FindIdxSplit(const std::string& dir, bool train, std::string_view dataset);

// Loads only the samples at `rows` (in that order; they may repeat) of an image/label file
// pair, normalised as LoadIdxPair does, with the same checks. The image file is read as a
// stream (inflated as it goes when gzip-compressed) and only the chosen rows are kept, as
// floats: a worker holds its share, never the whole training set, even while loading it.
// Nothing is set aside on the header's word alone: a plain file's size is checked against the
// header first, and a gzip stream's rows are kept as they arrive.
// kOutOfRange names the first row outside the files.
Result<Dataset> LoadIdxPairRows(const std::string& images_path, const std::string& labels_path,
                                const std::vector<int64_t>& rows, int num_classes = 10,
                                PixelNormalisation normalisation = {});

// The first min(n, count) samples of an image/label file pair (n <= 0: all of them), loaded
// as LoadIdxPairRows loads rows: for a split of which only the first n are used.
Result<Dataset> LoadIdxPairFirst(const std::string& images_path, const std::string& labels_path, int64_t n,
                                 int num_classes = 10, PixelNormalisation normalisation = {});

// The samples at `indices`, in that order (indices may repeat). kOutOfRange names the first
// index outside [0, dataset.count).
Result<Dataset> Subset(const Dataset& dataset, const std::vector<int64_t>& indices);

// The first min(n, dataset.count) samples; n <= 0 means all of them. For max_*_samples limits.
Dataset TakeFirst(const Dataset& dataset, int64_t n);

// Writes an idx3 image file and an idx1 label file; a path ending in ".gz" is written
// gzip-compressed. `pixels` must hold labels.size() * rows * cols bytes (kInvalidArgument
// otherwise). Meant for tests and for preparing local-files partitions.
Status WriteIdxPair(const std::string& images_path, const std::string& labels_path, int rows,
                    int cols, const std::vector<uint8_t>& pixels,
                    const std::vector<uint8_t>& labels);

// Writes `bytes` to `path` as is, or gzip-compressed when the path ends in ".gz".
Status WriteMaybeGzipFile(const std::string& path, const std::vector<uint8_t>& bytes);

}  // namespace tessera
