#include "core/data/dataset_source.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <limits>
#include <memory>
#include <sstream>

#include "base/escape.h"
#include "base/format.h"
#include "core/data/idx.h"
#include "core/data/numpy_format.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kCifarPixels = 3 * 32 * 32;
constexpr int64_t kCifarRecord = 1 + kCifarPixels;
constexpr int kCifarBatches = 5;
// The most a csv split or an npz archive may hold in memory while it is read.
constexpr uint64_t kMaxSplitBytes = uint64_t{4} << 30;
constexpr size_t kMaxCsvColumns = 65536;
constexpr size_t kMaxCsvLineBytes = size_t{64} << 20;
constexpr uint64_t kMaxCsvValues = kMaxSplitBytes / sizeof(float);

std::string SplitName(bool train) { return train ? "training" : "test"; }

// Values of one sample, before normalisation, written to `out` (SampleSize floats).
using SampleReader = std::function<Status(int64_t row, float* out)>;

// The normalisation a source asks for, checked against the channel count.
struct Normaliser {
  std::vector<float> mean, inv_std;  // per channel; empty: none
  int64_t plane = 1;                 // values per channel

  static Result<Normaliser> For(const DataSource& source, int channels, int64_t plane) {
    Normaliser n;
    n.plane = plane;
    if (source.mean.empty() && source.std.empty()) return n;
    const auto widen = [&](const std::vector<float>& values, const char* key) -> Result<std::vector<float>> {
      if (values.size() == 1) return std::vector<float>(static_cast<size_t>(channels), values[0]);
      if (values.size() == static_cast<size_t>(channels)) return values;
      return InvalidArgumentError(std::string("data.") + key + ": expected one value or one per channel (" +
                                  std::to_string(channels) + "), got " + std::to_string(values.size()));
    };
    if (source.mean.empty() || source.std.empty()) {
      return InvalidArgumentError("data.mean and data.std: give both or neither");
    }
    ASSIGN_OR_RETURN(n.mean, widen(source.mean, "mean"));
    ASSIGN_OR_RETURN(std::vector<float> std, widen(source.std, "std"));
    n.inv_std.resize(std.size());
    for (size_t c = 0; c < std.size(); ++c) {
      // A positive std so small that it is subnormal has no finite reciprocal (or one that
      // makes every value infinite): refused like a zero.
      const float inverse = 1.0f / std[c];
      if (!(std[c] > 0) || !std::isnormal(std[c]) || !std::isfinite(inverse) || !std::isfinite(n.mean[c])) {
        return InvalidArgumentError("data.std[" + std::to_string(c) + "]: expected a positive finite number of at " +
                                    "least " + FormatNumber(std::numeric_limits<float>::min()) +
                                    " (so that 1/std is finite), and a finite mean; got std " +
                                    FormatNumber(std[c]) + ", mean " + FormatNumber(n.mean[c]));
      }
      n.inv_std[c] = inverse;
    }
    return n;
  }

  // Normalises `sample` (row `row` of `source`) in place; a value that comes out infinite or
  // NaN is refused, naming data.std, rather than trained on.
  Status Apply(float* sample, const std::string& source, int64_t row) const {
    if (mean.empty()) return Status::Ok();
    for (size_t c = 0; c < mean.size(); ++c) {
      float* p = sample + static_cast<int64_t>(c) * plane;
      for (int64_t j = 0; j < plane; ++j) {
        const float in = p[j];
        p[j] = (in - mean[c]) * inv_std[c];
        if (!std::isfinite(p[j])) return NotFinite(source, row, c, j, in);
      }
    }
    return Status::Ok();
  }

 private:
  Status NotFinite(const std::string& source, int64_t row, size_t c, int64_t j, float in) const {
    return InvalidArgumentError(source + ": sample " + std::to_string(row) + ", channel " + std::to_string(c) +
                                ", value " + std::to_string(j) + ": " + FormatNumber(in) + " normalised with " +
                                "data.mean[" + std::to_string(c) + "] " + FormatNumber(mean[c]) + " and data.std[" +
                                std::to_string(c) + "] " + FormatNumber(1.0f / inv_std[c]) +
                                " is not finite; expected a larger data.std (or a mean nearer the data)");
  }
};

// A split read into memory in a uniform shape: labels, and a reader for any sample.
struct OpenSplit {
  std::string source;  // the first file's name, for messages
  DataShape shape;
  std::vector<uint8_t> labels;
  SampleReader read;
  // Where set (idx), the samples at `rows` in one pass, in place of `read`.
  std::function<Status(const std::vector<int64_t>& rows, float* out)> read_rows;
  // Whatever the reader needs to stay alive.
  std::shared_ptr<void> keep;
};

Status CheckLabel(int64_t label, const std::string& where) {
  if (label < 0 || label > 255) {
    return InvalidArgumentError(where + ": label " + std::to_string(label) + " is outside [0, 255]");
  }
  return Status::Ok();
}

// A split with nothing in it: evaluated, it scored 0 on 0 samples round after round; trained
// on, it sent updates of 0 samples.
Status NoSamples(const std::string& path, bool train) {
  return InvalidArgumentError(path + ": holds no samples; expected at least one in the " + SplitName(train) +
                              " split");
}

// ---- idx ----

// An idx split is read as Fashion-MNIST's is: its labels whole, its shape from the image
// file's header, and a share by streaming the image file and keeping only the rows asked for
// (read_rows). The whole image file is never held: it may be far larger than a share.
Result<OpenSplit> OpenIdx(const DataSource& source, bool train) {
  ASSIGN_OR_RETURN(IdxPairPaths paths, FindIdxSplit(source.dir, train, "idx dataset"));
  ASSIGN_OR_RETURN(IdxImages images, ReadIdxImagesHeader(paths.images));
  // The header bounds the product to 2^40: it does not wrap.
  const uint64_t pixels = static_cast<uint64_t>(images.count) * static_cast<uint64_t>(images.rows) *
                          static_cast<uint64_t>(images.cols);
  if (pixels > kMaxSplitBytes) {
    return InvalidArgumentError(paths.images + ": header promises " + std::to_string(images.count) + " images of " +
                                std::to_string(images.rows) + "x" + std::to_string(images.cols) + ", " +
                                std::to_string(pixels) + " pixels; an idx split may hold at most " +
                                std::to_string(kMaxSplitBytes) + " (4 GiB)");
  }
  ASSIGN_OR_RETURN(std::vector<uint8_t> labels, ReadIdxLabels(paths.labels));
  if (static_cast<int64_t>(labels.size()) != images.count) {
    return InvalidArgumentError(paths.labels + ": " + std::to_string(labels.size()) + " labels for " +
                                std::to_string(images.count) + " images in " + paths.images);
  }
  if (images.count == 0) return NoSamples(paths.images, train);
  OpenSplit split;
  split.source = fs::path(paths.images).filename().string();
  split.shape = DataShape{1, images.rows, images.cols, images.count, -1};
  split.labels = std::move(labels);
  split.read_rows = [paths](const std::vector<int64_t>& rows, float* out) -> Status {
    // Pixels as x / 255: the source's own normalisation follows.
    ASSIGN_OR_RETURN(Dataset share, LoadIdxPairRows(paths.images, paths.labels, rows, /*num_classes=*/256,
                                                    PixelNormalisation{0.0f, 1.0f}));
    const int64_t sample = share.SampleSize();
    for (int64_t i = 0; i < share.count; ++i) share.CopyImage(i, out + i * sample);
    return Status::Ok();
  };
  return split;
}

// ---- cifar10 ----

Result<std::vector<std::string>> CifarFiles(const DataSource& source, bool train) {
  const fs::path dir(source.dir);
  std::error_code ec;
  if (!train) {
    const std::string test = (dir / "test_batch.bin").string();
    if (!fs::exists(test, ec)) return NotFoundError("cifar10 test split: " + test + " not found");
    return std::vector<std::string>{test};
  }
  // The batches from data_batch_1.bin on, as many as there are; one missing before another
  // that is there is refused rather than its records silently left out.
  std::vector<std::string> files;
  std::string missing;
  for (int b = 1; b <= kCifarBatches; ++b) {
    const std::string path = (dir / ("data_batch_" + std::to_string(b) + ".bin")).string();
    if (!fs::exists(path, ec)) {
      if (missing.empty()) missing = path;
      continue;
    }
    if (!missing.empty()) {
      return NotFoundError("cifar10 training split: " + missing + " not found, but " + path +
                           " is: expected the batches from data_batch_1.bin on without a gap");
    }
    files.push_back(path);
  }
  if (files.empty()) {
    return NotFoundError("cifar10 training split: " + (dir / "data_batch_1.bin").string() + " not found");
  }
  return files;
}

struct CifarFile {
  std::string path;
  int64_t first = 0, count = 0;
  std::unique_ptr<std::ifstream> in;  // kept open while the split is read
};

Result<OpenSplit> OpenCifar10(const DataSource& source, bool train) {
  ASSIGN_OR_RETURN(std::vector<std::string> paths, CifarFiles(source, train));
  auto files = std::make_shared<std::vector<CifarFile>>();
  OpenSplit split;
  split.source = fs::path(paths[0]).filename().string();
  int64_t total = 0;
  for (const std::string& path : paths) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    if (ec) return NotFoundError(path + ": cannot read its size: " + ec.message());
    // A batch is read a label at a time: one larger than any split may be (a sparse file, or
    // not a batch at all) is refused before its records are counted.
    if (size > kMaxSplitBytes) {
      return InvalidArgumentError(path + ": " + std::to_string(size) + " bytes; expected a CIFAR-10 batch of at most " +
                                  std::to_string(kMaxSplitBytes) + " bytes (each of CIFAR-10's holds 10,000 records)");
    }
    if (size == 0 || size % kCifarRecord != 0) {
      return DataLossError(path + ": " + std::to_string(size) + " bytes is not a whole number of CIFAR-10 records (" +
                           std::to_string(kCifarRecord) + " bytes each: a label byte and 32x32x3 pixels)");
    }
    const int64_t count = static_cast<int64_t>(size / kCifarRecord);
    std::ifstream in(path, std::ios::binary);
    if (!in) return NotFoundError(path + ": cannot open");
    std::vector<uint8_t> record(static_cast<size_t>(kCifarRecord));
    for (int64_t r = 0; r < count; ++r) {
      // Labels only: one byte a record, the pixels skipped.
      in.seekg(r * kCifarRecord);
      char label = 0;
      if (!in.get(label)) return DataLossError(path + ": record " + std::to_string(r) + " cannot be read");
      split.labels.push_back(static_cast<uint8_t>(label));
    }
    files->push_back(CifarFile{path, total, count, std::make_unique<std::ifstream>(path, std::ios::binary)});
    total += count;
  }
  split.shape = DataShape{3, 32, 32, total, -1};
  split.read = [files](int64_t row, float* out) -> Status {
    for (CifarFile& f : *files) {
      if (row >= f.first + f.count) continue;
      std::ifstream& in = *f.in;
      in.clear();
      in.seekg((row - f.first) * kCifarRecord + 1);
      uint8_t pixels[kCifarPixels];
      if (!in.read(reinterpret_cast<char*>(pixels), kCifarPixels)) {
        return DataLossError(f.path + ": record " + std::to_string(row - f.first) + " cannot be read");
      }
      for (int64_t j = 0; j < kCifarPixels; ++j) out[j] = static_cast<float>(pixels[j]) / 255.0f;
      return Status::Ok();
    }
    return OutOfRangeError("cifar10: row " + std::to_string(row) + " is past the split");
  };
  split.keep = files;
  return split;
}

// ---- npz ----

Result<OpenSplit> OpenNpz(const DataSource& source, bool train) {
  const std::string path = (fs::path(source.dir) / (train ? "train.npz" : "test.npz")).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFoundError("npz " + SplitName(train) + " split: " + path + " not found");
  ASSIGN_OR_RETURN(std::vector<NumpyArray> arrays, ReadNpz(path, kMaxSplitBytes));
  auto x = std::make_shared<NumpyArray>();
  const NumpyArray* y = nullptr;
  // The archive's own array names, for the message below: quoted and escaped, the first few.
  constexpr size_t kNamesShown = 8;
  std::string names;
  for (size_t i = 0; i < arrays.size() && i < kNamesShown; ++i) {
    names += (i ? ", " : "") + QuoteUntrusted(arrays[i].name);
  }
  if (arrays.size() > kNamesShown) names += " and " + std::to_string(arrays.size() - kNamesShown) + " more";
  for (NumpyArray& a : arrays) {
    if (a.name == "x") *x = std::move(a);
    if (a.name == "y") y = &a;
  }
  if (x->name != "x" || y == nullptr) {
    return InvalidArgumentError(path + ": expected arrays 'x' (samples) and 'y' (labels); it has " +
                                (names.empty() ? std::string("none") : names));
  }
  if (x->dtype != "|u1" && x->dtype != "<f4" && x->dtype != "<f8") {
    return InvalidArgumentError(path + ": array 'x' has dtype " + x->dtype + "; expected uint8, float32 or float64");
  }
  const auto& s = x->shape;
  if (s.size() < 2 || s.size() > 4) {
    return InvalidArgumentError(path + ": array 'x' has " + std::to_string(s.size()) +
                                " dimensions; expected (N,C,H,W), (N,H,W) or (N,F)");
  }
  OpenSplit split;
  split.source = fs::path(path).filename().string();
  const auto dim = [&](size_t i) { return s[i]; };
  int64_t channels = 1, rows = 1, cols = 1;
  if (s.size() == 4) channels = dim(1), rows = dim(2), cols = dim(3);
  if (s.size() == 3) rows = dim(1), cols = dim(2);
  if (s.size() == 2) channels = dim(1);
  constexpr int64_t kMaxDim = 1 << 16;
  if (channels < 1 || rows < 1 || cols < 1 || channels > kMaxDim || rows > kMaxDim || cols > kMaxDim) {
    return InvalidArgumentError(path + ": array 'x' has a sample dimension outside [1, 65536]");
  }
  if (s[0] == 0) return NoSamples(path, train);
  if (y->shape.size() != 1 || y->shape[0] != s[0]) {
    return InvalidArgumentError(path + ": array 'y' must be one label per sample of 'x' (" + std::to_string(s[0]) +
                                ")");
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> labels, y->ToInt64(path + ": array 'y'"));
  split.labels.reserve(labels.size());
  for (size_t i = 0; i < labels.size(); ++i) {
    RETURN_IF_ERROR(CheckLabel(labels[i], path + ": y[" + std::to_string(i) + "]"));
    split.labels.push_back(static_cast<uint8_t>(labels[i]));
  }
  split.shape = DataShape{static_cast<int>(channels), static_cast<int>(rows), static_cast<int>(cols), s[0], -1};
  const int64_t sample = channels * rows * cols;
  split.read = [x, sample, path](int64_t row, float* out) -> Status {
    // A value that is not a number, infinite, or (float64) past float's range, named with
    // what it is: a float64 of 1e300 is finite in the file but not as a float.
    const auto refuse = [&](int64_t j, double v) {
      return InvalidArgumentError(path + ": x[" + std::to_string(row) + "], value " + std::to_string(j) + ": " +
                                  FormatNumber(v) + "; expected a finite number within float's range (magnitude " +
                                  "at most " + FormatNumber(std::numeric_limits<float>::max()) + ")");
    };
    const char* base = x->data.data();
    if (x->dtype == "|u1") {
      const auto* in = reinterpret_cast<const uint8_t*>(base) + row * sample;
      for (int64_t j = 0; j < sample; ++j) out[j] = static_cast<float>(in[j]) / 255.0f;
    } else if (x->dtype == "<f4") {
      std::memcpy(out, base + row * sample * 4, static_cast<size_t>(sample) * 4);
      for (int64_t j = 0; j < sample; ++j) {
        if (!std::isfinite(out[j])) return refuse(j, out[j]);
      }
    } else {
      for (int64_t j = 0; j < sample; ++j) {
        double v;
        std::memcpy(&v, base + (row * sample + j) * 8, 8);
        if (!std::isfinite(v) || std::fabs(v) > std::numeric_limits<float>::max()) return refuse(j, v);
        out[j] = static_cast<float>(v);
      }
    }
    return Status::Ok();
  };
  split.keep = x;
  return split;
}

// ---- csv ----

// The comma-separated fields of `line`, at most max_fields + 1 of them: one more than
// max_fields says the line has too many, without a view kept for each comma of a line that is
// nothing but commas (16 bytes held per byte read).
std::vector<std::string_view> SplitFields(std::string_view line, size_t max_fields) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (fields.size() <= max_fields) {
    const size_t comma = line.find(',', start);
    std::string_view field = line.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    while (!field.empty() && (field.front() == ' ' || field.front() == '\t')) field.remove_prefix(1);
    while (!field.empty() && (field.back() == ' ' || field.back() == '\t' || field.back() == '\r')) field.remove_suffix(1);
    fields.push_back(field);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return fields;
}

// Reads the next line of `in` into `line`, without its '\n': false at the end of the file.
// A line longer than kMaxCsvLineBytes is an error naming it, read no further than the limit
// (std::getline would hold all of a file without a newline).
Result<bool> ReadCsvLine(std::istream& in, const std::string& path, int64_t line_number, std::string* line) {
  line->clear();
  std::streambuf* buffer = in.rdbuf();
  for (;;) {
    const int c = buffer->sbumpc();
    if (c == std::char_traits<char>::eof()) return !line->empty();
    if (c == '\n') return true;
    if (line->size() == kMaxCsvLineBytes) {
      return InvalidArgumentError(path + ": line " + std::to_string(line_number) + ": longer than " +
                                  std::to_string(kMaxCsvLineBytes >> 20) + " MiB; expected a csv line of at most that");
    }
    line->push_back(static_cast<char>(c));
  }
}

std::string Shown(std::string_view text) {
  std::string s(text.substr(0, 40));
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  }
  return "'" + s + (text.size() > 40 ? "...'" : "'");
}

Result<OpenSplit> OpenCsv(const DataSource& source, bool train) {
  const std::string path = (fs::path(source.dir) / (train ? "train.csv" : "test.csv")).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFoundError("csv " + SplitName(train) + " split: " + path + " not found");
  const uintmax_t size = fs::file_size(path, ec);
  if (ec || size > kMaxSplitBytes) {
    return InvalidArgumentError(path + ": expected a readable file of at most 4 GiB");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open");
  std::string line;
  ASSIGN_OR_RETURN(bool has_header, ReadCsvLine(in, path, 1, &line));
  if (!has_header) return InvalidArgumentError(path + ": empty; expected a header row");
  // A UTF-8 byte-order mark (spreadsheets' "CSV UTF-8") is not part of the first column's name.
  if (line.starts_with("\xEF\xBB\xBF")) line.erase(0, 3);
  std::vector<std::string> header;  // owned: `line` is read into again below
  for (std::string_view field : SplitFields(line, kMaxCsvColumns)) header.emplace_back(field);
  if (header.size() < 2 || header.size() > kMaxCsvColumns) {
    return InvalidArgumentError(path + ": line 1: expected a header of 2 to 65536 columns (a label and features), got " +
                                (header.size() > kMaxCsvColumns ? "more" : std::to_string(header.size())));
  }
  size_t label_at = header.size();
  for (size_t c = 0; c < header.size(); ++c) {
    if (header[c] == source.label_column) {
      if (label_at != header.size()) {
        return InvalidArgumentError(path + ": line 1: the label column " + Shown(source.label_column) + " appears twice");
      }
      label_at = c;
    }
  }
  if (label_at == header.size()) {
    return InvalidArgumentError(path + ": line 1: no column named " + Shown(source.label_column) +
                                " (data.label_column) in the header");
  }
  const int64_t features = static_cast<int64_t>(header.size()) - 1;
  auto values = std::make_shared<std::vector<float>>();
  // A value takes at least two bytes of the file (a digit and a separator), so this many never
  // grow the vector: no reallocation holds the old values and twice as many new ones at once.
  // Reserved, not touched: pages are used as rows fill them.
  try {
    values->reserve(static_cast<size_t>(std::min<uint64_t>(kMaxCsvValues, (static_cast<uint64_t>(size) + 1) / 2)));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(path + ": cannot set memory aside for the values of a " + std::to_string(size) +
                                  "-byte file");
  }
  OpenSplit split;
  split.source = fs::path(path).filename().string();
  int64_t line_number = 1, count = 0;
  for (;;) {
    ASSIGN_OR_RETURN(bool more, ReadCsvLine(in, path, line_number + 1, &line));
    if (!more) break;
    ++line_number;
    if (line.empty() || line == "\r") continue;
    const std::vector<std::string_view> fields = SplitFields(line, header.size());
    const std::string where = path + ": line " + std::to_string(line_number);
    if (fields.size() != header.size()) {
      return InvalidArgumentError(where + ": expected " + std::to_string(header.size()) + " fields as the header has, got " +
                                  (fields.size() > header.size() ? "more" : std::to_string(fields.size())));
    }
    // Refused before the row goes in, so that the vector never grows past the bound.
    if (values->size() + static_cast<uint64_t>(features) > kMaxCsvValues) {
      return InvalidArgumentError(where + ": more than " + std::to_string(kMaxCsvValues) +
                                  " feature values in all (4 GiB as floats)");
    }
    for (size_t c = 0; c < fields.size(); ++c) {
      const std::string_view f = fields[c];
      if (c == label_at) {
        int64_t label = -1;
        const auto [end, err] = std::from_chars(f.data(), f.data() + f.size(), label);
        if (err != std::errc() || end != f.data() + f.size()) {
          return InvalidArgumentError(where + ", column " + Shown(header[c]) + ": expected an integer label, got " +
                                      Shown(f));
        }
        RETURN_IF_ERROR(CheckLabel(label, where));
        split.labels.push_back(static_cast<uint8_t>(label));
        continue;
      }
      double v = 0;
      const auto [end, err] = std::from_chars(f.data(), f.data() + f.size(), v);
      if (err != std::errc() || end != f.data() + f.size() || !std::isfinite(v) ||
          std::abs(v) > std::numeric_limits<float>::max()) {
        return InvalidArgumentError(where + ", column " + Shown(header[c]) + ": expected a finite number, got " + Shown(f));
      }
      values->push_back(static_cast<float>(v));
    }
    ++count;
  }
  if (count == 0) return InvalidArgumentError(path + ": no samples after the header");
  split.shape = DataShape{static_cast<int>(features), 1, 1, count, -1};
  split.read = [values, features](int64_t row, float* out) {
    std::memcpy(out, values->data() + row * features, sizeof(float) * static_cast<size_t>(features));
    return Status::Ok();
  };
  split.keep = values;
  return split;
}

Result<OpenSplit> Open(const DataSource& source, bool train) {
  switch (source.format) {
    case DataFormat::kIdx: return OpenIdx(source, train);
    case DataFormat::kCifar10: return OpenCifar10(source, train);
    case DataFormat::kNpz: return OpenNpz(source, train);
    case DataFormat::kCsv: return OpenCsv(source, train);
  }
  return InvalidArgumentError("unknown data format");
}

}  // namespace

std::string_view DataFormatName(DataFormat format) {
  switch (format) {
    case DataFormat::kIdx: return "idx";
    case DataFormat::kCifar10: return "cifar10";
    case DataFormat::kNpz: return "npz";
    case DataFormat::kCsv: return "csv";
  }
  return "?";
}

Result<DataFormat> ParseDataFormat(std::string_view name) {
  for (DataFormat f : {DataFormat::kIdx, DataFormat::kCifar10, DataFormat::kNpz, DataFormat::kCsv}) {
    if (DataFormatName(f) == name) return f;
  }
  return InvalidArgumentError("data.format: expected \"idx\", \"cifar10\", \"npz\" or \"csv\", got " + Shown(name));
}

Result<DataShape> InspectSplit(const DataSource& source, bool train) {
  ASSIGN_OR_RETURN(OpenSplit split, Open(source, train));
  DataShape shape = split.shape;
  for (uint8_t label : split.labels) shape.max_label = std::max<int>(shape.max_label, label);
  return shape;
}

Result<std::vector<uint8_t>> ReadSplitLabels(const DataSource& source, bool train) {
  ASSIGN_OR_RETURN(OpenSplit split, Open(source, train));
  return std::move(split.labels);
}

Result<Dataset> LoadSplitRows(const DataSource& source, bool train, const std::vector<int64_t>& rows,
                              int num_classes) {
  if (num_classes < 1 || num_classes > 256) {
    return InvalidArgumentError("classes: expected 1 to 256, got " + std::to_string(num_classes));
  }
  ASSIGN_OR_RETURN(OpenSplit split, Open(source, train));
  const DataShape& shape = split.shape;
  ASSIGN_OR_RETURN(Normaliser norm,
                   Normaliser::For(source, shape.channels, static_cast<int64_t>(shape.rows) * shape.cols));
  Dataset data;
  data.source = split.source;
  data.channels = shape.channels;
  data.rows = shape.rows;
  data.cols = shape.cols;
  data.num_classes = num_classes;
  data.count = static_cast<int64_t>(rows.size());
  const int64_t sample = data.SampleSize();
  if (sample > 0 && data.count > std::numeric_limits<int64_t>::max() / 4 / sample) {
    return InvalidArgumentError(split.source + ": " + std::to_string(data.count) + " samples are too many to hold");
  }
  data.images.resize(static_cast<size_t>(data.count * sample));
  data.labels.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t row = rows[i];
    if (row < 0 || row >= shape.count) {
      return OutOfRangeError(split.source + ": row " + std::to_string(row) + " at position " + std::to_string(i) +
                             " is outside [0, " + std::to_string(shape.count) + ")");
    }
    const uint8_t label = split.labels[static_cast<size_t>(row)];
    if (label >= num_classes) {
      return InvalidArgumentError(split.source + ": sample " + std::to_string(row) + " has label " +
                                  std::to_string(label) + "; expected one in [0, " + std::to_string(num_classes) +
                                  ") (data.classes)");
    }
    data.labels[i] = label;
    if (split.read_rows) continue;
    float* out = data.images.data() + static_cast<int64_t>(i) * sample;
    RETURN_IF_ERROR(split.read(row, out));
    RETURN_IF_ERROR(norm.Apply(out, split.source, row));
  }
  if (split.read_rows) {
    RETURN_IF_ERROR(split.read_rows(rows, data.images.data()));
    for (size_t i = 0; i < rows.size(); ++i) {
      RETURN_IF_ERROR(norm.Apply(data.images.data() + static_cast<int64_t>(i) * sample, split.source, rows[i]));
    }
  }
  return data;
}

Result<Dataset> LoadSplit(const DataSource& source, bool train, int num_classes) {
  ASSIGN_OR_RETURN(DataShape shape, InspectSplit(source, train));
  std::vector<int64_t> rows(static_cast<size_t>(shape.count));
  for (int64_t i = 0; i < shape.count; ++i) rows[static_cast<size_t>(i)] = i;
  return LoadSplitRows(source, train, rows, num_classes);
}

Result<std::vector<std::string>> SplitFiles(const DataSource& source, bool train) {
  const fs::path dir(source.dir);
  switch (source.format) {
    case DataFormat::kIdx: {
      ASSIGN_OR_RETURN(IdxPairPaths paths, FindIdxSplit(source.dir, train, "idx dataset"));
      return std::vector<std::string>{paths.images, paths.labels};
    }
    case DataFormat::kCifar10: return CifarFiles(source, train);
    case DataFormat::kNpz: return std::vector<std::string>{(dir / (train ? "train.npz" : "test.npz")).string()};
    case DataFormat::kCsv: return std::vector<std::string>{(dir / (train ? "train.csv" : "test.csv")).string()};
  }
  return InvalidArgumentError("unknown data format");
}

Status WriteCifar10Batch(const std::string& path, const std::vector<uint8_t>& labels,
                         const std::vector<uint8_t>& pixels) {
  if (pixels.size() != labels.size() * static_cast<size_t>(kCifarPixels)) {
    return InvalidArgumentError("WriteCifar10Batch: " + std::to_string(pixels.size()) + " pixel bytes for " +
                                std::to_string(labels.size()) + " records of " + std::to_string(kCifarPixels));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (size_t r = 0; r < labels.size(); ++r) {
    out.put(static_cast<char>(labels[r]));
    out.write(reinterpret_cast<const char*>(pixels.data() + r * kCifarPixels), kCifarPixels);
  }
  out.close();
  if (!out) return InternalError("could not write " + path);
  return Status::Ok();
}

Status WriteCsv(const std::string& path, const std::vector<std::string>& header,
                const std::vector<std::vector<double>>& rows) {
  std::ofstream out(path, std::ios::trunc);
  for (size_t c = 0; c < header.size(); ++c) out << (c ? "," : "") << header[c];
  out << "\n";
  std::ostringstream line;
  line.precision(9);
  for (const auto& row : rows) {
    if (row.size() != header.size()) return InvalidArgumentError("WriteCsv: a row's size differs from the header's");
    line.str("");
    for (size_t c = 0; c < row.size(); ++c) line << (c ? "," : "") << row[c];
    out << line.str() << "\n";
  }
  out.close();
  if (!out) return InternalError("could not write " + path);
  return Status::Ok();
}

}  // namespace tessera
