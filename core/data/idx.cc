#include "core/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>

#include "base/format.h"
#include "core/data/byte_stream.h"

namespace tessera {
namespace {

constexpr uint32_t kLabelMagic = 0x00000801;  // unsigned bytes, one dimension
constexpr uint32_t kImageMagic = 0x00000803;  // unsigned bytes, three dimensions
constexpr uint64_t kMaxIdxElements = uint64_t{1} << 40;
// The most elements a file read whole may hold (the row loaders, which keep only the rows
// asked for, read up to kMaxIdxElements).
constexpr uint64_t kMaxWholeIdxBytes = uint64_t{4} << 30;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

void AppendBigEndian32(std::vector<uint8_t>& out, uint32_t v) {
  out.push_back(static_cast<uint8_t>(v >> 24));
  out.push_back(static_cast<uint8_t>(v >> 16));
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

// "60000x28x28".
std::string DimsText(const std::vector<uint32_t>& dims) {
  std::string text;
  for (size_t i = 0; i < dims.size(); ++i) text += (i ? "x" : "") + std::to_string(dims[i]);
  return text;
}

// With `at_least`, `found` is as far as the reader went: the data goes on past it.
std::string SizeMismatch(const std::string& path, const std::vector<uint32_t>& dims, uint64_t expected_size,
                         uint64_t found, bool at_least = false) {
  return path + ": " + (found < expected_size ? "truncated" : "trailing data") + ": header [" + DimsText(dims) +
         "] expects " + std::to_string(expected_size) + " bytes, found " + std::to_string(found) +
         (at_least ? " or more" : "");
}

// Checks the magic of `bytes` (the file's first bytes, as many as there are up to the header's
// size) and reads the dimensions it announces.
Result<std::vector<uint32_t>> ReadIdxHeader(const std::string& path, const std::vector<uint8_t>& bytes,
                                            uint32_t expected_magic, const char* kind) {
  const size_t ndims = expected_magic & 0xff;
  const size_t header_size = 4 + 4 * ndims;
  if (bytes.size() < 4) {
    return DataLossError(path + ": truncated: expected an IDX header of " + std::to_string(header_size) +
                         " bytes, found a file of " + std::to_string(bytes.size()) + " bytes");
  }
  uint32_t magic = BigEndian32(bytes.data());
  if (magic != expected_magic) {
    std::string hint;
    if (magic == kLabelMagic) hint = " (an idx1 label file)";
    if (magic == kImageMagic) hint = " (an idx3 image file)";
    return InvalidArgumentError(path + ": wrong magic number: expected " + Hex32(expected_magic) + " (" + kind +
                                "), found " + Hex32(magic) + hint);
  }
  if (bytes.size() < header_size) {
    return DataLossError(path + ": truncated: expected an IDX header of " + std::to_string(header_size) +
                         " bytes, found a file of " + std::to_string(bytes.size()) + " bytes");
  }
  std::vector<uint32_t> dims(ndims);
  for (size_t i = 0; i < ndims; ++i) {
    dims[i] = BigEndian32(bytes.data() + 4 + 4 * i);
    if (dims[i] == 0 && i > 0) {
      return InvalidArgumentError(path + ": dimension " + std::to_string(i) + " is 0: expected at least 1");
    }
  }
  // The product is checked at each step, before it can wrap: [2^20, 2^20, 2^24] is 2^64 in
  // all, which wraps to 0 and would promise an empty file.
  uint64_t elements = 1;
  for (size_t i = 0; i < ndims; ++i) {
    if (__builtin_mul_overflow(elements, uint64_t{dims[i]}, &elements) || elements > kMaxIdxElements) {
      return InvalidArgumentError(path + ": header dimensions [" + DimsText(dims) +
                                  "] are implausibly large: expected at most 2^40 elements in all");
    }
  }
  return dims;
}

// The size of an IDX file with these dimensions, header included; ReadIdxHeader bounds the
// product to kMaxIdxElements, so it does not wrap.
uint64_t IdxFileSize(const std::vector<uint32_t>& dims) {
  uint64_t elements = 1;
  for (uint32_t d : dims) elements *= d;
  return 4 + 4 * dims.size() + elements;
}

std::string BaseName(const std::string& path) { return std::filesystem::path(path).filename().string(); }

// The first bytes a reader that has not yet seen how large its data is sets aside; beyond
// them its buffer grows only as bytes arrive, so a header's promise alone allocates nothing.
constexpr size_t kFirstReserve = size_t{1} << 26;

// Refuses a stream whose size is known before reading it (a plain file) and is not the
// `expected_size` the header promises: nothing is allocated for a promise the file cannot keep.
Status CheckKnownSize(const ByteStream& stream, const std::string& path, const std::vector<uint32_t>& dims,
                      uint64_t expected_size) {
  const std::optional<uint64_t> size = stream.KnownSize();
  if (size && *size != expected_size) return DataLossError(SizeMismatch(path, dims, expected_size, *size));
  return Status::Ok();
}

// Reads one byte past the end the header promises: there must be none. Reads no further, so
// a stream that goes on (a gzip bomb) costs a byte, not its length.
Status ExpectEnd(ByteStream& stream, const std::string& path, const std::vector<uint32_t>& dims,
                 uint64_t expected_size) {
  uint8_t extra;
  ASSIGN_OR_RETURN(const size_t got, stream.Read(&extra, 1));
  if (got != 0) return DataLossError(SizeMismatch(path, dims, expected_size, stream.Position(), /*at_least=*/true));
  return Status::Ok();
}

// Reads an IDX header of the kind `magic` names from the start of `stream` and checks it,
// an image file's sides included, and, where the stream's size is known, that size.
Result<std::vector<uint32_t>> ReadHeader(ByteStream& stream, const std::string& path, uint32_t magic,
                                         const char* kind) {
  std::vector<uint8_t> header(4 + 4 * (magic & 0xff));
  ASSIGN_OR_RETURN(const size_t got, stream.Read(header.data(), header.size()));
  header.resize(got);
  ASSIGN_OR_RETURN(std::vector<uint32_t> dims, ReadIdxHeader(path, header, magic, kind));
  if (magic == kImageMagic && (dims[1] > 1u << 15 || dims[2] > 1u << 15)) {
    return InvalidArgumentError(path + ": image size " + std::to_string(dims[1]) + "x" + std::to_string(dims[2]) +
                                " is implausible: expected at most 32768 per side");
  }
  RETURN_IF_ERROR(CheckKnownSize(stream, path, dims, IdxFileSize(dims)));
  return dims;
}

struct IdxContents {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> elements;  // what follows the header
};

// Reads a whole IDX file of the kind `magic` names from `stream`: the header first, then
// exactly the elements it promises, in pieces, into a buffer that grows as they arrive, then
// one byte more to see that the file ends there.
Result<IdxContents> ReadIdx(ByteStream& stream, const std::string& path, uint32_t magic, const char* kind) {
  IdxContents contents;
  ASSIGN_OR_RETURN(contents.dims, ReadHeader(stream, path, magic, kind));
  const uint64_t expected_size = IdxFileSize(contents.dims);
  const uint64_t body = expected_size - stream.Position();
  // A plain file of the size promised (a sparse one costs nothing on disk) would be set aside
  // whole, and a gzip stream grows its buffer as far as it goes: either is refused first.
  if (body > kMaxWholeIdxBytes) {
    return InvalidArgumentError(path + ": header [" + DimsText(contents.dims) + "] promises " + std::to_string(body) +
                                " bytes of elements; a file read whole may hold at most " +
                                std::to_string(kMaxWholeIdxBytes) + " (4 GiB)");
  }
  std::vector<uint8_t>& out = contents.elements;
  out.reserve(static_cast<size_t>(stream.KnownSize() ? body : std::min<uint64_t>(body, kFirstReserve)));
  while (out.size() < body) {
    const size_t piece = static_cast<size_t>(std::min<uint64_t>(body - out.size(), uint64_t{1} << 20));
    const size_t at = out.size();
    out.resize(at + piece);
    ASSIGN_OR_RETURN(const size_t got, stream.Read(out.data() + at, piece));
    if (got < piece) return DataLossError(SizeMismatch(path, contents.dims, expected_size, stream.Position()));
  }
  RETURN_IF_ERROR(ExpectEnd(stream, path, contents.dims, expected_size));
  return contents;
}

constexpr char kImageKind[] = "idx3 unsigned-byte images";
constexpr char kLabelKind[] = "idx1 unsigned-byte labels";

Result<IdxImages> ReadImages(ByteStream& stream, const std::string& source) {
  ASSIGN_OR_RETURN(IdxContents contents, ReadIdx(stream, source, kImageMagic, kImageKind));
  IdxImages images;
  images.source = source;
  images.count = contents.dims[0];
  images.rows = static_cast<int>(contents.dims[1]);
  images.cols = static_cast<int>(contents.dims[2]);
  images.pixels = std::move(contents.elements);
  return images;
}

Result<std::vector<uint8_t>> ReadLabels(ByteStream& stream, const std::string& source) {
  ASSIGN_OR_RETURN(IdxContents contents, ReadIdx(stream, source, kLabelMagic, kLabelKind));
  return std::move(contents.elements);
}

}  // namespace

Result<std::vector<uint8_t>> ReadMaybeGzipFile(const std::string& path, uint64_t max_bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> stream, ByteStream::Open(path));
  const std::optional<uint64_t> size = stream->KnownSize();
  if (size && *size > max_bytes) {
    return InvalidArgumentError(path + ": " + std::to_string(*size) + " bytes; the limit is " +
                                std::to_string(max_bytes));
  }
  std::vector<uint8_t> bytes;
  bytes.reserve(static_cast<size_t>(size ? *size : std::min<uint64_t>(max_bytes, kFirstReserve)));
  // Up to one byte past the limit, to tell a file that reaches it from one that goes on.
  while (true) {
    const size_t piece = static_cast<size_t>(std::min<uint64_t>(max_bytes - bytes.size(), (1u << 20) - 1)) + 1;
    const size_t at = bytes.size();
    bytes.resize(at + piece);
    ASSIGN_OR_RETURN(const size_t got, stream->Read(bytes.data() + at, piece));
    bytes.resize(at + got);
    if (bytes.size() > max_bytes) {
      return InvalidArgumentError(path + ": holds more than " + std::to_string(max_bytes) +
                                  " bytes (inflated, if gzip); the limit is " + std::to_string(max_bytes));
    }
    if (got < piece) break;
  }
  return bytes;
}

Result<IdxImages> ReadIdxImages(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> stream, ByteStream::Open(path));
  return ReadImages(*stream, path);
}

Result<std::vector<uint8_t>> ReadIdxLabels(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> stream, ByteStream::Open(path));
  return ReadLabels(*stream, path);
}

Result<IdxImages> ReadIdxImagesHeader(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> stream, ByteStream::Open(path));
  ASSIGN_OR_RETURN(std::vector<uint32_t> dims, ReadHeader(*stream, path, kImageMagic, kImageKind));
  IdxImages images;
  images.source = path;
  images.count = dims[0];
  images.rows = static_cast<int>(dims[1]);
  images.cols = static_cast<int>(dims[2]);
  return images;
}

Result<IdxImages> ParseIdxImages(std::vector<uint8_t> bytes, const std::string& source) {
  ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> stream, ByteStream::OverBytes(source, bytes));
  return ReadImages(*stream, source);
}

Result<std::vector<uint8_t>> ParseIdxLabels(std::vector<uint8_t> bytes, const std::string& source) {
  ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> stream, ByteStream::OverBytes(source, bytes));
  return ReadLabels(*stream, source);
}

namespace {

// The labels of an image file holding `count` images: as many, each in [0, num_classes).
Status CheckLabels(const std::string& images_path, int64_t count, const std::string& labels_path,
                   const std::vector<uint8_t>& labels, int num_classes) {
  if (static_cast<int64_t>(labels.size()) != count) {
    return InvalidArgumentError("image/label count mismatch: " + images_path + " holds " + std::to_string(count) +
                                " images but " + labels_path + " holds " + std::to_string(labels.size()) + " labels");
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= num_classes) {
      return InvalidArgumentError(labels_path + ": label " + std::to_string(labels[i]) + " at index " +
                                  std::to_string(i) + " is outside [0, " + std::to_string(num_classes) + ")");
    }
  }
  return Status::Ok();
}

// A pair of no images read as a split of no samples: evaluated, it scored 0 on 0 samples;
// trained on (a worker's own files), it sent updates of 0 samples.
Status CheckSomeImages(const std::string& images_path, int64_t count) {
  if (count == 0) return InvalidArgumentError(images_path + ": holds no images; expected at least one");
  return Status::Ok();
}

// Reads and cross-checks an image/label file pair; the labels must be in [0, num_classes),
// and there must be at least one image.
Status ReadCheckedPair(const std::string& images_path, const std::string& labels_path, int num_classes,
                       IdxImages* images, std::vector<uint8_t>* labels) {
  if (num_classes < 1 || num_classes > 256) {
    return InvalidArgumentError("num_classes must be in [1, 256], got " + std::to_string(num_classes));
  }
  ASSIGN_OR_RETURN(*images, ReadIdxImages(images_path));
  ASSIGN_OR_RETURN(*labels, ReadIdxLabels(labels_path));
  RETURN_IF_ERROR(CheckLabels(images_path, images->count, labels_path, *labels, num_classes));
  return CheckSomeImages(images_path, images->count);
}

// The float each pixel byte stands for. A std so small that dividing by it overflows (a
// subnormal one has no finite reciprocal) would make pixels infinite: refused, naming data.std.
Result<std::array<float, 256>> PixelLookup(PixelNormalisation normalisation) {
  const std::string given =
      "mean " + FormatNumber(normalisation.mean) + ", std " + FormatNumber(normalisation.std);
  if (!std::isnormal(normalisation.std) || !(normalisation.std > 0) || !std::isfinite(1.0f / normalisation.std)) {
    return InvalidArgumentError("data.std: expected a positive finite number of at least " +
                                FormatNumber(std::numeric_limits<float>::min()) +
                                " (so that 1/std is finite) to normalise pixels with, got " + given);
  }
  std::array<float, 256> lookup;
  for (int x = 0; x < 256; ++x) {
    lookup[x] = (static_cast<float>(x) / 255.0f - normalisation.mean) / normalisation.std;
    if (!std::isfinite(lookup[x])) {
      return InvalidArgumentError("data.std: pixel value " + std::to_string(x) + " normalised with " + given +
                                  " is " + FormatNumber(lookup[x]) +
                                  "; expected finite values (a larger data.std, or a finite mean nearer [0, 1])");
    }
  }
  return lookup;
}

Dataset EmptyLike(const std::string& images_path, const IdxImages& images, int num_classes) {
  Dataset dataset;
  dataset.source = BaseName(images_path);
  dataset.channels = 1;
  dataset.rows = images.rows;
  dataset.cols = images.cols;
  dataset.num_classes = num_classes;
  return dataset;
}

}  // namespace

Result<Dataset> LoadIdxPair(const std::string& images_path, const std::string& labels_path, int num_classes,
                            PixelNormalisation normalisation) {
  IdxImages images;
  std::vector<uint8_t> labels;
  ASSIGN_OR_RETURN(const auto lookup, PixelLookup(normalisation));
  RETURN_IF_ERROR(ReadCheckedPair(images_path, labels_path, num_classes, &images, &labels));
  Dataset dataset = EmptyLike(images_path, images, num_classes);
  dataset.count = images.count;
  dataset.pixels = std::move(images.pixels);  // kept as bytes; pixel_values turns them into floats
  dataset.pixel_values = lookup;
  dataset.labels = std::move(labels);
  return dataset;
}

namespace {

// Puts the rows of `kept` in place: slot j goes to position to[j] (a permutation of
// [0, to.size())), moving each row once through one row of scratch.
void PermuteRows(std::vector<uint8_t>& kept, size_t sample, const std::vector<size_t>& to) {
  std::vector<size_t> from(to.size());  // from[position] = the slot that belongs there
  for (size_t j = 0; j < to.size(); ++j) from[to[j]] = j;
  std::vector<bool> done(to.size());
  std::vector<uint8_t> scratch(sample);
  for (size_t start = 0; start < from.size(); ++start) {
    if (done[start] || from[start] == start) continue;
    std::memcpy(scratch.data(), kept.data() + start * sample, sample);
    for (size_t k = start;;) {
      done[k] = true;
      const size_t s = from[k];
      if (s == start) {
        std::memcpy(kept.data() + k * sample, scratch.data(), sample);
        break;
      }
      std::memcpy(kept.data() + k * sample, kept.data() + s * sample, sample);
      k = s;
    }
  }
}

// LoadIdxPairRows on labels already read, with the rows `rows_of` picks from their count.
Result<Dataset> LoadRows(const std::string& images_path, const std::string& labels_path,
                         const std::function<std::vector<int64_t>(int64_t count)>& rows_of, int num_classes,
                         PixelNormalisation normalisation) {
  if (num_classes < 1 || num_classes > 256) {
    return InvalidArgumentError("num_classes must be in [1, 256], got " + std::to_string(num_classes));
  }
  ASSIGN_OR_RETURN(const auto lookup, PixelLookup(normalisation));
  ASSIGN_OR_RETURN(std::vector<uint8_t> labels, ReadIdxLabels(labels_path));
  const std::vector<int64_t> rows = rows_of(static_cast<int64_t>(labels.size()));
  // The image file is read as a stream: only the chosen rows are kept.
  ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> stream, ByteStream::Open(images_path));
  ASSIGN_OR_RETURN(std::vector<uint32_t> dims, ReadHeader(*stream, images_path, kImageMagic, kImageKind));
  IdxImages shape;
  shape.count = dims[0];
  shape.rows = static_cast<int>(dims[1]);
  shape.cols = static_cast<int>(dims[2]);
  RETURN_IF_ERROR(CheckLabels(images_path, shape.count, labels_path, labels, num_classes));
  RETURN_IF_ERROR(CheckSomeImages(images_path, shape.count));
  const size_t sample = static_cast<size_t>(shape.rows) * static_cast<size_t>(shape.cols);
  const uint64_t expected_size = IdxFileSize(dims);
  // (row, position in the result), in file order.
  std::vector<std::pair<int64_t, size_t>> wanted(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t row = rows[i];
    if (row < 0 || row >= shape.count) {
      return OutOfRangeError(images_path + ": row " + std::to_string(row) + " at position " + std::to_string(i) +
                             " is outside [0, " + std::to_string(shape.count) + ")");
    }
    wanted[i] = {row, i};
  }
  std::sort(wanted.begin(), wanted.end());

  Dataset dataset = EmptyLike(images_path, shape, num_classes);
  dataset.count = static_cast<int64_t>(rows.size());
  dataset.pixel_values = lookup;
  dataset.labels.resize(rows.size());
  // The wanted rows in file order, one copy per entry of `wanted`, read straight into the
  // buffer. A plain file's size is checked above, so its rows are there to be read; a gzip
  // stream's buffer grows as its rows arrive.
  std::vector<uint8_t> kept;
  const uint64_t kept_size = static_cast<uint64_t>(rows.size()) * sample;
  kept.reserve(static_cast<size_t>(stream->KnownSize() ? kept_size : std::min<uint64_t>(kept_size, kFirstReserve)));
  auto truncated = [&] { return DataLossError(SizeMismatch(images_path, dims, expected_size, stream->Position())); };
  int64_t next_row = 0;  // the next row of the file to read
  for (size_t j = 0; j < wanted.size();) {
    const int64_t row = wanted[j].first;
    const uint64_t gap = static_cast<uint64_t>(row - next_row) * sample;
    ASSIGN_OR_RETURN(const uint64_t skipped, stream->Skip(gap));
    if (skipped < gap) return truncated();
    for (size_t done = 0; done < sample;) {
      const size_t piece = std::min<size_t>(sample - done, size_t{1} << 20);
      const size_t at = kept.size();
      kept.resize(at + piece);
      ASSIGN_OR_RETURN(const size_t got, stream->Read(kept.data() + at, piece));
      if (got < piece) return truncated();
      done += piece;
    }
    next_row = row + 1;
    dataset.labels[wanted[j].second] = labels[static_cast<size_t>(row)];
    // The same row asked for again: a copy of the one just read.
    for (++j; j < wanted.size() && wanted[j].first == row; ++j) {
      const size_t at = kept.size();
      kept.resize(at + sample);
      std::memcpy(kept.data() + at, kept.data() + at - sample, sample);
      dataset.labels[wanted[j].second] = labels[static_cast<size_t>(row)];
    }
  }
  const uint64_t rest = static_cast<uint64_t>(shape.count - next_row) * sample;
  ASSIGN_OR_RETURN(const uint64_t skipped, stream->Skip(rest));
  if (skipped < rest) return truncated();
  // Anything after the last image is an error, as for a file read whole.
  RETURN_IF_ERROR(ExpectEnd(*stream, images_path, dims, expected_size));
  std::vector<size_t> to(wanted.size());
  for (size_t j = 0; j < wanted.size(); ++j) to[j] = wanted[j].second;
  PermuteRows(kept, sample, to);
  dataset.pixels = std::move(kept);
  return dataset;
}

}  // namespace

Result<Dataset> LoadIdxPairRows(const std::string& images_path, const std::string& labels_path,
                                const std::vector<int64_t>& rows, int num_classes,
                                PixelNormalisation normalisation) {
  return LoadRows(images_path, labels_path, [&](int64_t) { return rows; }, num_classes, normalisation);
}

Result<Dataset> LoadIdxPairFirst(const std::string& images_path, const std::string& labels_path, int64_t n,
                                 int num_classes, PixelNormalisation normalisation) {
  return LoadRows(
      images_path, labels_path,
      [&](int64_t count) {
        std::vector<int64_t> rows(static_cast<size_t>(n > 0 ? std::min(n, count) : count));
        for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
        return rows;
      },
      num_classes, normalisation);
}

Result<IdxPairPaths> FindIdxSplit(const std::string& dir, bool train, std::string_view dataset) {
  const std::filesystem::path base(dir);
  const std::string prefix = train ? "train" : "t10k";
  const std::string images_name = prefix + "-images-idx3-ubyte";
  const std::string labels_name = prefix + "-labels-idx1-ubyte";
  std::vector<std::string> tried;
  for (const char* suffix : {".gz", ""}) {
    IdxPairPaths paths{(base / (images_name + suffix)).string(), (base / (labels_name + suffix)).string()};
    std::error_code ec;
    if (std::filesystem::exists(paths.images, ec) && std::filesystem::exists(paths.labels, ec)) return paths;
    tried.push_back(paths.images + " + " + labels_name + suffix);
  }
  std::string message = std::string(dataset) + " " + (train ? "training" : "test") + " split not found in " +
                        base.string() + ": tried ";
  for (size_t i = 0; i < tried.size(); ++i) message += (i ? "; " : "") + tried[i];
  return NotFoundError(std::move(message));
}

Result<IdxPairPaths> FindFashionMnist(const std::string& dir, bool train) {
  return FindIdxSplit(dir.empty() ? std::string(kDefaultFashionMnistDir) : dir, train, "Fashion-MNIST");
}

Result<Dataset> LoadFashionMnist(const std::string& dir, bool train, PixelNormalisation normalisation) {
  ASSIGN_OR_RETURN(IdxPairPaths paths, FindFashionMnist(dir, train));
  return LoadIdxPair(paths.images, paths.labels, 10, normalisation);
}

Result<Dataset> Subset(const Dataset& dataset, const std::vector<int64_t>& indices) {
  Dataset out;
  out.source = dataset.source;
  out.count = static_cast<int64_t>(indices.size());
  out.channels = dataset.channels;
  out.rows = dataset.rows;
  out.cols = dataset.cols;
  out.num_classes = dataset.num_classes;
  const int64_t sample = dataset.SampleSize();
  const bool eight_bit = dataset.EightBit();
  if (eight_bit) {
    out.pixels.resize(static_cast<size_t>(out.count * sample));
    out.pixel_values = dataset.pixel_values;
  } else {
    out.images.resize(static_cast<size_t>(out.count * sample));
  }
  out.labels.resize(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    int64_t index = indices[i];
    if (index < 0 || index >= dataset.count) {
      return OutOfRangeError("subset of " + dataset.source + ": index " + std::to_string(index) + " at position " +
                             std::to_string(i) + " is outside [0, " + std::to_string(dataset.count) + ")");
    }
    if (eight_bit) {
      std::memcpy(out.pixels.data() + i * sample, dataset.pixels.data() + index * sample, static_cast<size_t>(sample));
    } else {
      std::memcpy(out.images.data() + i * sample, dataset.images.data() + index * sample,
                  static_cast<size_t>(sample) * sizeof(float));
    }
    out.labels[i] = dataset.labels[static_cast<size_t>(index)];
  }
  return out;
}

Dataset TakeFirst(const Dataset& dataset, int64_t n) {
  if (n <= 0 || n >= dataset.count) return dataset;
  std::vector<int64_t> first(static_cast<size_t>(n));
  std::iota(first.begin(), first.end(), int64_t{0});
  return std::move(Subset(dataset, first)).value();  // every index is in range
}

Status WriteMaybeGzipFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  if (EndsWith(path, ".gz")) {
    gzFile gz = gzopen(path.c_str(), "wb");
    if (gz == nullptr) return InvalidArgumentError("cannot open " + path + " for writing: " + std::strerror(errno));
    size_t written = 0;
    while (written < bytes.size()) {
      unsigned n = static_cast<unsigned>(std::min<size_t>(bytes.size() - written, 1u << 30));
      if (gzwrite(gz, bytes.data() + written, n) != static_cast<int>(n)) {
        gzclose(gz);
        return DataLossError("error writing " + path);
      }
      written += n;
    }
    if (gzclose(gz) != Z_OK) return DataLossError("error closing " + path);
    return Status::Ok();
  }
  FilePtr file(std::fopen(path.c_str(), "wb"));
  if (!file) return InvalidArgumentError("cannot open " + path + " for writing: " + std::strerror(errno));
  if (std::fwrite(bytes.data(), 1, bytes.size(), file.get()) != bytes.size()) {
    return DataLossError("error writing " + path + ": " + std::strerror(errno));
  }
  if (std::fclose(file.release()) != 0) return DataLossError("error closing " + path);
  return Status::Ok();
}

Status WriteIdxPair(const std::string& images_path, const std::string& labels_path, int rows, int cols,
                    const std::vector<uint8_t>& pixels, const std::vector<uint8_t>& labels) {
  if (rows <= 0 || cols <= 0) {
    return InvalidArgumentError("WriteIdxPair: rows and cols must be positive, got " + std::to_string(rows) + "x" +
                                std::to_string(cols));
  }
  const uint64_t expected = uint64_t{labels.size()} * static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  if (pixels.size() != expected) {
    return InvalidArgumentError("WriteIdxPair: expected " + std::to_string(expected) + " pixel bytes for " +
                                std::to_string(labels.size()) + " images of " + std::to_string(rows) + "x" +
                                std::to_string(cols) + ", got " + std::to_string(pixels.size()));
  }
  std::vector<uint8_t> image_bytes;
  image_bytes.reserve(16 + pixels.size());
  AppendBigEndian32(image_bytes, kImageMagic);
  AppendBigEndian32(image_bytes, static_cast<uint32_t>(labels.size()));
  AppendBigEndian32(image_bytes, static_cast<uint32_t>(rows));
  AppendBigEndian32(image_bytes, static_cast<uint32_t>(cols));
  image_bytes.insert(image_bytes.end(), pixels.begin(), pixels.end());
  RETURN_IF_ERROR(WriteMaybeGzipFile(images_path, image_bytes));

  std::vector<uint8_t> label_bytes;
  label_bytes.reserve(8 + labels.size());
  AppendBigEndian32(label_bytes, kLabelMagic);
  AppendBigEndian32(label_bytes, static_cast<uint32_t>(labels.size()));
  label_bytes.insert(label_bytes.end(), labels.begin(), labels.end());
  return WriteMaybeGzipFile(labels_path, label_bytes);
}

}  // namespace tessera
