#include "core/data/numpy_format.h"
#include "base/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>

#include "base/escape.h"
#include "base/whole_file.h"

namespace tessera {
namespace {

constexpr std::string_view kNpyMagic = "\x93NUMPY";
constexpr uint32_t kLocalHeader = 0x04034b50, kCentralHeader = 0x02014b50, kEndRecord = 0x06054b50;
constexpr uint32_t kZip64EndRecord = 0x06064b50, kZip64Locator = 0x07064b50;
constexpr uint16_t kZip64Extra = 0x0001;
constexpr uint32_t kMaxArchiveEntries = 100000;
constexpr uint32_t kMaxHeaderBytes = 1 << 16;  // numpy's own headers are far smaller
// A deflated member's first buffer; it doubles as the data inflates, up to the size claimed.
constexpr uint64_t kFirstInflateBytes = uint64_t{1} << 20;

std::string Quote(std::string_view text) { return QuoteUntrusted(text); }

uint16_t Le16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t Le32(const unsigned char* p) { return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24; }
uint64_t Le64(const unsigned char* p) { return uint64_t{Le32(p)} | uint64_t{Le32(p + 4)} << 32; }
void Put16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>(v >> 8));
}
void Put32(std::string* out, uint32_t v) {
  Put16(out, static_cast<uint16_t>(v & 0xffff));
  Put16(out, static_cast<uint16_t>(v >> 16));
}

// Bytes per element of a supported descriptor; 0 when it is not supported.
size_t ItemSize(std::string_view dtype) {
  if (dtype == "<f4" || dtype == "<i4") return 4;
  if (dtype == "<f8" || dtype == "<i8") return 8;
  if (dtype == "|u1" || dtype == "|i1") return 1;
  return 0;
}

// The header's Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& what) : text_(text), what_(what) {}

  Status Parse(NumpyArray* array) {
    bool have_descr = false, have_order = false, have_shape = false;
    Skip();
    if (!Take('{')) return Error("expected '{' at the start of the header");
    while (true) {
      Skip();
      if (Take('}')) break;
      std::string key;
      RETURN_IF_ERROR(String(&key));
      Skip();
      if (!Take(':')) return Error("expected ':' after key " + Quote(key));
      Skip();
      if (key == "descr") {
        RETURN_IF_ERROR(String(&array->dtype));
        have_descr = true;
      } else if (key == "fortran_order") {
        bool fortran = false;
        RETURN_IF_ERROR(Bool(&fortran));
        if (fortran) return Error("Fortran-order arrays are not supported: save it in C order (np.ascontiguousarray)");
        have_order = true;
      } else if (key == "shape") {
        RETURN_IF_ERROR(Shape(&array->shape));
        have_shape = true;
      } else {
        return Error("unexpected key " + Quote(key) + " (expected descr, fortran_order and shape)");
      }
      Skip();
      if (Take(',')) continue;
      Skip();
      if (Take('}')) break;
      return Error("expected ',' or '}' after the value of " + Quote(key));
    }
    if (!have_descr || !have_order || !have_shape) return Error("the header lacks one of descr, fortran_order, shape");
    return Status::Ok();
  }

 private:
  Status Error(const std::string& message) const { return InvalidArgumentError(what_ + ": .npy header: " + message); }
  void Skip() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t')) ++pos_;
  }
  bool Take(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  Status String(std::string* out) {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return Error("expected a quoted string");
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos || end - pos_ > 64) return Error("unterminated or over-long string");
    *out = std::string(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return Status::Ok();
  }
  Status Bool(bool* out) {
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      *out = true;
    } else if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      *out = false;
    } else {
      return Error("expected True or False for fortran_order");
    }
    return Status::Ok();
  }
  Status Shape(std::vector<int64_t>* shape) {
    if (!Take('(')) return Error("expected '(' to open the shape");
    while (true) {
      Skip();
      if (Take(')')) return Status::Ok();
      int64_t dim = 0;
      size_t digits = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        if (++digits > 12) return Error("a dimension of the shape is too large");
        dim = dim * 10 + (text_[pos_++] - '0');
      }
      if (digits == 0) return Error("expected a non-negative integer in the shape");
      if (shape->size() >= 32) return Error("more than 32 dimensions");
      shape->push_back(dim);
      Skip();
      if (Take(',')) continue;
      Skip();
      if (Take(')')) return Status::Ok();
      return Error("expected ',' or ')' in the shape");
    }
  }

  std::string_view text_;
  const std::string& what_;
  size_t pos_ = 0;
};

// One member of an archive as its central directory describes it.
struct ZipEntry {
  std::string name;
  uint16_t method = 0;
  uint16_t flags = 0;
  uint32_t crc = 0;
  uint64_t compressed = 0, size = 0, local_offset = 0;
};

Status ReadZip64Extra(std::string_view extra, ZipEntry* e, bool need_size, bool need_compressed, bool need_offset,
                      const std::string& what) {
  const auto* p = reinterpret_cast<const unsigned char*>(extra.data());
  size_t pos = 0;
  while (pos + 4 <= extra.size()) {
    const uint16_t id = Le16(p + pos), len = Le16(p + pos + 2);
    if (pos + 4 + len > extra.size()) break;
    if (id == kZip64Extra) {
      size_t at = pos + 4;
      auto take = [&](uint64_t* field) {
        if (at + 8 > pos + 4 + len) return false;
        *field = Le64(p + at);
        at += 8;
        return true;
      };
      if ((need_size && !take(&e->size)) || (need_compressed && !take(&e->compressed)) ||
          (need_offset && !take(&e->local_offset))) {
        return InvalidArgumentError(what + ": member " + Quote(e->name) + ": zip64 extra field too short");
      }
      return Status::Ok();
    }
    pos += 4 + len;
  }
  return InvalidArgumentError(what + ": member " + Quote(e->name) + ": sizes say zip64 but it has no zip64 field");
}

Result<std::vector<ZipEntry>> CentralDirectory(std::string_view bytes, const std::string& what) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < 22) return InvalidArgumentError(what + ": not a zip archive (" + std::to_string(bytes.size()) + " bytes)");
  // The end record is within the last 22 + 65535 bytes (its comment is at most 64 KiB).
  size_t end = std::string_view::npos;
  const size_t lowest = bytes.size() > 22 + 65535 ? bytes.size() - 22 - 65535 : 0;
  for (size_t at = bytes.size() - 22 + 1; at-- > lowest;) {
    if (Le32(p + at) == kEndRecord) {
      end = at;
      break;
    }
  }
  if (end == std::string_view::npos) return InvalidArgumentError(what + ": not a zip archive (no end-of-directory record)");
  uint64_t entries = Le16(p + end + 10), dir_size = Le32(p + end + 12), dir_offset = Le32(p + end + 16);
  if (entries == 0xffff || dir_size == 0xffffffff || dir_offset == 0xffffffff) {
    if (end < 20 || Le32(p + end - 20) != kZip64Locator) {
      return InvalidArgumentError(what + ": zip64 archive without its locator");
    }
    const uint64_t record = Le64(p + end - 20 + 8);
    if (record > bytes.size() || bytes.size() - record < 56 || Le32(p + record) != kZip64EndRecord) {
      return InvalidArgumentError(what + ": zip64 end record out of the file");
    }
    entries = Le64(p + record + 32);
    dir_size = Le64(p + record + 40);
    dir_offset = Le64(p + record + 48);
  }
  if (entries > kMaxArchiveEntries) {
    return InvalidArgumentError(what + ": " + std::to_string(entries) + " members; at most " +
                                std::to_string(kMaxArchiveEntries) + " are read");
  }
  if (dir_offset > bytes.size() || dir_size > bytes.size() - dir_offset) {
    return InvalidArgumentError(what + ": central directory (offset " + std::to_string(dir_offset) + ", " +
                                std::to_string(dir_size) + " bytes) lies outside the " +
                                std::to_string(bytes.size()) + "-byte file");
  }
  std::vector<ZipEntry> out;
  size_t at = dir_offset;
  const size_t dir_end = dir_offset + dir_size;
  for (uint64_t i = 0; i < entries; ++i) {
    if (at + 46 > dir_end || Le32(p + at) != kCentralHeader) {
      return InvalidArgumentError(what + ": central directory entry " + std::to_string(i) + " is damaged");
    }
    ZipEntry e;
    e.flags = Le16(p + at + 8);
    e.method = Le16(p + at + 10);
    e.crc = Le32(p + at + 16);
    e.compressed = Le32(p + at + 20);
    e.size = Le32(p + at + 24);
    const uint16_t name_len = Le16(p + at + 28), extra_len = Le16(p + at + 30), comment_len = Le16(p + at + 32);
    e.local_offset = Le32(p + at + 42);
    if (at + 46 + name_len + extra_len + comment_len > dir_end) {
      return InvalidArgumentError(what + ": central directory entry " + std::to_string(i) + " runs past the directory");
    }
    e.name = std::string(bytes.substr(at + 46, name_len));
    const bool size64 = e.size == 0xffffffff, compressed64 = e.compressed == 0xffffffff,
               offset64 = e.local_offset == 0xffffffff;
    if (size64 || compressed64 || offset64) {
      RETURN_IF_ERROR(ReadZip64Extra(bytes.substr(at + 46 + name_len, extra_len), &e, size64, compressed64, offset64, what));
    }
    out.push_back(std::move(e));
    at += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

Result<std::string> MemberBytes(std::string_view bytes, const ZipEntry& e, const std::string& what, uint64_t max_bytes) {
  const std::string member = what + ": member " + Quote(e.name);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (e.flags & 1) return InvalidArgumentError(member + " is encrypted");
  if (e.size > max_bytes) {
    return InvalidArgumentError(member + " expands to " + std::to_string(e.size) + " bytes; the limit is " +
                                std::to_string(max_bytes));
  }
  if (e.local_offset > bytes.size() || bytes.size() - e.local_offset < 30 || Le32(p + e.local_offset) != kLocalHeader) {
    return InvalidArgumentError(member + ": local header missing at offset " + std::to_string(e.local_offset));
  }
  const uint64_t data_at = e.local_offset + 30 + Le16(p + e.local_offset + 26) + Le16(p + e.local_offset + 28);
  if (data_at > bytes.size() || e.compressed > bytes.size() - data_at) {
    return InvalidArgumentError(member + ": its " + std::to_string(e.compressed) + " bytes run past the end of the file");
  }
  std::string out;
  if (e.method == 0) {
    if (e.compressed != e.size) return InvalidArgumentError(member + ": stored member with different sizes");
    out.assign(bytes.data() + data_at, e.size);
  } else if (e.method == 8) {
    // The buffer grows as the data inflates, not to the size the directory claims: a few bytes
    // of archive that claim gigabytes cost what they really expand to.
    out.resize(static_cast<size_t>(std::min<uint64_t>(e.size, kFirstInflateBytes)));
    z_stream z{};
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK) return InternalError(member + ": zlib could not start");
    uint64_t in_left = e.compressed, out_done = 0;
    const unsigned char* in = p + data_at;
    int rc = Z_OK;
    while (rc == Z_OK) {
      if (out_done == out.size() && out.size() < e.size) {
        out.resize(static_cast<size_t>(std::min<uint64_t>(e.size, uint64_t{out.size()} * 2)));
      }
      const uInt in_chunk = static_cast<uInt>(std::min<uint64_t>(in_left, 1u << 30));
      const uInt out_chunk = static_cast<uInt>(std::min<uint64_t>(out.size() - out_done, 1u << 30));
      z.next_in = const_cast<unsigned char*>(in);
      z.avail_in = in_chunk;
      z.next_out = reinterpret_cast<unsigned char*>(out.data()) + out_done;
      z.avail_out = out_chunk;
      rc = inflate(&z, Z_NO_FLUSH);
      in += in_chunk - z.avail_in;
      in_left -= in_chunk - z.avail_in;
      out_done += out_chunk - z.avail_out;
      if (rc == Z_OK && z.avail_out == out_chunk && z.avail_in == in_chunk) rc = Z_BUF_ERROR;  // no progress
    }
    inflateEnd(&z);
    if (rc != Z_STREAM_END || out_done != e.size) {
      return InvalidArgumentError(member + ": deflate data is damaged or does not expand to the " +
                                  std::to_string(e.size) + " bytes its directory says");
    }
  } else {
    return InvalidArgumentError(member + ": compression method " + std::to_string(e.method) +
                                " (expected 0, stored, or 8, deflated)");
  }
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t done = 0; done < out.size();) {
    const uInt n = static_cast<uInt>(std::min<size_t>(out.size() - done, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(out.data() + done), n);
    done += n;
  }
  if (static_cast<uint32_t>(crc) != e.crc) return InvalidArgumentError(member + ": CRC-32 mismatch (damaged archive)");
  return out;
}

// A regular file only, opened without blocking: a FIFO in the file's place (an external
// trainer's "out", say) held the open until some writer came, which might be never.
Result<std::string> ReadWholeFile(const std::string& path, uint64_t max_bytes) {
  const RegularFileOpen opened = OpenRegularFile(path);
  if (opened.open_errno != 0) return NotFoundError("cannot open " + path + ": " + std::strerror(opened.open_errno));
  if (opened.stat_errno != 0) return InvalidArgumentError("cannot size " + path + ": " + std::strerror(opened.stat_errno));
  if (opened.not_regular) return InvalidArgumentError(path + ": not a regular file");
  const int fd = opened.fd;
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  const struct stat& info = opened.info;
  const auto size = static_cast<uint64_t>(info.st_size);
  if (size > max_bytes) {
    return InvalidArgumentError(path + ": " + std::to_string(size) + " bytes; the limit is " + std::to_string(max_bytes));
  }
  std::string bytes(static_cast<size_t>(size), '\0');
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return DataLossError("cannot read " + path + ": " + std::strerror(errno));
    if (n == 0) return DataLossError("cannot read " + path + ": it ended after " + std::to_string(done) + " bytes");
    done += static_cast<size_t>(n);
  }
  return bytes;
}

template <typename T>
T LoadLe(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // little-endian host (x86-64, aarch64)
  return v;
}

}  // namespace

int64_t NumpyArray::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<std::vector<float>> NumpyArray::ToFloat32(const std::string& what) const {
  const int64_t n = NumElements();
  std::vector<float> out(static_cast<size_t>(n));
  const char* p = data.data();
  if (dtype == "<f4") {
    std::memcpy(out.data(), p, out.size() * sizeof(float));
  } else if (dtype == "<f8") {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(LoadLe<double>(p + 8 * i));
  } else if (dtype == "|u1") {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(p[i]);
  } else if (dtype == "|i1") {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<signed char>(p[i]);
  } else if (dtype == "<i4") {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(LoadLe<int32_t>(p + 4 * i));
  } else if (dtype == "<i8") {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(LoadLe<int64_t>(p + 8 * i));
  } else {
    return InvalidArgumentError(what + ": dtype " + Quote(dtype) + " cannot be read as float32");
  }
  return out;
}

Result<std::vector<int64_t>> NumpyArray::ToInt64(const std::string& what) const {
  const int64_t n = NumElements();
  std::vector<int64_t> out(static_cast<size_t>(n));
  const char* p = data.data();
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == "|u1") {
      out[i] = static_cast<unsigned char>(p[i]);
    } else if (dtype == "|i1") {
      out[i] = static_cast<signed char>(p[i]);
    } else if (dtype == "<i4") {
      out[i] = LoadLe<int32_t>(p + 4 * i);
    } else if (dtype == "<i8") {
      out[i] = LoadLe<int64_t>(p + 8 * i);
    } else if (dtype == "<f4" || dtype == "<f8") {
      const double v = dtype == "<f4" ? LoadLe<float>(p + 4 * i) : LoadLe<double>(p + 8 * i);
      if (!(std::fabs(v) < 9.0e15) || v != std::floor(v)) {
        return InvalidArgumentError(what + ": element " + std::to_string(i) + " is " + std::to_string(v) +
                                    "; expected a whole number");
      }
      out[i] = static_cast<int64_t>(v);
    } else {
      return InvalidArgumentError(what + ": dtype " + Quote(dtype) + " cannot be read as integers");
    }
  }
  return out;
}

Result<NumpyArray> ParseNpy(std::string_view bytes, const std::string& what, uint64_t max_bytes) {
  if (bytes.size() < 10 || bytes.substr(0, kNpyMagic.size()) != kNpyMagic) {
    return InvalidArgumentError(what + ": not a .npy file (expected the magic \\x93NUMPY)");
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const int major = p[6];
  size_t header_len = 0, header_at = 0;
  if (major == 1) {
    header_len = Le16(p + 8);
    header_at = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return InvalidArgumentError(what + ": truncated .npy header");
    header_len = Le32(p + 8);
    header_at = 12;
  } else {
    return InvalidArgumentError(what + ": .npy format version " + std::to_string(major) + " (expected 1, 2 or 3)");
  }
  if (header_len > kMaxHeaderBytes || header_at + header_len > bytes.size()) {
    return InvalidArgumentError(what + ": .npy header of " + std::to_string(header_len) + " bytes does not fit the " +
                                std::to_string(bytes.size()) + "-byte file");
  }
  NumpyArray array;
  RETURN_IF_ERROR(HeaderParser(bytes.substr(header_at, header_len), what).Parse(&array));
  const size_t item = ItemSize(array.dtype);
  if (item == 0) {
    return InvalidArgumentError(what + ": dtype " + Quote(array.dtype) +
                                " is not supported (expected little-endian float32, float64, int32, int64, or uint8/int8)");
  }
  uint64_t count = 1;
  for (int64_t d : array.shape) {
    if (d != 0 && count > max_bytes / static_cast<uint64_t>(d)) {
      return InvalidArgumentError(what + ": shape " + ShapeToString(array.shape) + " exceeds the " +
                                  std::to_string(max_bytes) + "-byte limit");
    }
    count *= static_cast<uint64_t>(d);
  }
  if (count > max_bytes / item) {
    return InvalidArgumentError(what + ": shape " + ShapeToString(array.shape) + " exceeds the " +
                                std::to_string(max_bytes) + "-byte limit");
  }
  const uint64_t data_bytes = count * item;
  const size_t data_at = header_at + header_len;
  if (bytes.size() - data_at != data_bytes) {
    return InvalidArgumentError(what + ": shape " + ShapeToString(array.shape) + " of " + array.dtype + " needs " +
                                std::to_string(data_bytes) + " data bytes, the file has " +
                                std::to_string(bytes.size() - data_at));
  }
  array.data = std::string(bytes.substr(data_at));
  return array;
}

std::string EncodeNpy(const NumpyArray& array) {
  std::string shape = "(";
  for (size_t i = 0; i < array.shape.size(); ++i) shape += std::to_string(array.shape[i]) + (array.shape.size() == 1 ? "," : (i + 1 < array.shape.size() ? ", " : ""));
  shape += ")";
  std::string header = "{'descr': '" + array.dtype + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // Padded with spaces and a newline so that the data starts on a 64-byte boundary.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string out(kNpyMagic);
  out.push_back('\x01');
  out.push_back('\x00');
  Put16(&out, static_cast<uint16_t>(header.size()));
  out += header;
  out += array.data;
  return out;
}

Result<NumpyArray> ReadNpy(const std::string& path, uint64_t max_bytes) {
  ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path, max_bytes + kMaxHeaderBytes + 12));
  return ParseNpy(bytes, path, max_bytes);
}

Result<std::vector<NumpyArray>> ParseNpz(std::string_view bytes, const std::string& what, uint64_t max_bytes) {
  ASSIGN_OR_RETURN(std::vector<ZipEntry> entries, CentralDirectory(bytes, what));
  std::vector<NumpyArray> arrays;
  std::set<std::string> names;
  uint64_t total = 0;
  for (const ZipEntry& e : entries) {
    if (!e.name.empty() && e.name.back() == '/') continue;  // a directory entry
    if (e.name.size() < 5 || e.name.compare(e.name.size() - 4, 4, ".npy") != 0) {
      return InvalidArgumentError(what + ": member " + Quote(e.name) + " is not a .npy array");
    }
    if (e.size > max_bytes - total) {
      return InvalidArgumentError(what + ": the arrays expand to more than the " + std::to_string(max_bytes) +
                                  "-byte limit");
    }
    ASSIGN_OR_RETURN(std::string member, MemberBytes(bytes, e, what, max_bytes - total));
    total += member.size();
    const std::string name = e.name.substr(0, e.name.size() - 4);
    ASSIGN_OR_RETURN(NumpyArray array, ParseNpy(member, what + ": " + Quote(name), max_bytes));
    array.name = name;
    if (!names.insert(name).second) return InvalidArgumentError(what + ": array " + Quote(name) + " appears twice");
    arrays.push_back(std::move(array));
  }
  return arrays;
}

Result<std::vector<NumpyArray>> ReadNpz(const std::string& path, uint64_t max_bytes) {
  // A deflated archive may be smaller than what it expands to; the file itself is bounded
  // by the same limit.
  ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path, max_bytes));
  return ParseNpz(bytes, path, max_bytes);
}

Result<std::string> EncodeNpz(const std::vector<NumpyArray>& arrays) {
  std::string out, directory;
  std::set<std::string> names;
  for (const NumpyArray& array : arrays) {
    if (array.name.empty() || array.name.size() > 4000) {
      return InvalidArgumentError("npz: array names must have 1 to 4000 characters, got " + std::to_string(array.name.size()));
    }
    if (!names.insert(array.name).second) return InvalidArgumentError("npz: array " + Quote(array.name) + " appears twice");
    const std::string member = EncodeNpy(array);
    const std::string name = array.name + ".npy";
    if (out.size() + member.size() + name.size() + 30 >= 0xffffffffull) {
      return InvalidArgumentError("npz: the archive would reach 4 GiB (zip64 is not written)");
    }
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(member.data()), static_cast<uInt>(member.size()));
    const auto offset = static_cast<uint32_t>(out.size());
    auto common = [&](std::string* to) {
      Put16(to, 20);  // version needed: 2.0
      Put16(to, 0);   // flags
      Put16(to, 0);   // stored
      Put16(to, 0);   // time
      Put16(to, 0x21);  // date: 1980-01-01
      Put32(to, static_cast<uint32_t>(crc));
      Put32(to, static_cast<uint32_t>(member.size()));
      Put32(to, static_cast<uint32_t>(member.size()));
      Put16(to, static_cast<uint16_t>(name.size()));
      Put16(to, 0);  // extra
    };
    Put32(&out, kLocalHeader);
    common(&out);
    out += name;
    out += member;
    Put32(&directory, kCentralHeader);
    Put16(&directory, 20);  // made by
    common(&directory);
    Put16(&directory, 0);  // comment
    Put16(&directory, 0);  // disk
    Put16(&directory, 0);  // internal attributes
    Put32(&directory, 0);  // external attributes
    Put32(&directory, offset);
    directory += name;
  }
  // 0xffff entries is the end record's mark for "see the zip64 record", which is not written:
  // readers (ParseNpz among them) would look for it and refuse the archive.
  if (arrays.size() >= 0xffff || out.size() + directory.size() + 22 >= 0xffffffffull) {
    return InvalidArgumentError("npz: too many arrays or bytes for an archive without zip64");
  }
  const auto dir_offset = static_cast<uint32_t>(out.size());
  out += directory;
  Put32(&out, kEndRecord);
  Put16(&out, 0);
  Put16(&out, 0);
  Put16(&out, static_cast<uint16_t>(arrays.size()));
  Put16(&out, static_cast<uint16_t>(arrays.size()));
  Put32(&out, static_cast<uint32_t>(directory.size()));
  Put32(&out, dir_offset);
  Put16(&out, 0);
  return out;
}

Status WriteNpz(const std::string& path, const std::vector<NumpyArray>& arrays, bool sync) {
  ASSIGN_OR_RETURN(std::string bytes, EncodeNpz(arrays));
  return WriteFileWhole(path, bytes, WholeFileOptions{.sync = sync});
}

NumpyArray ToNumpy(const NamedTensor& tensor) {
  NumpyArray array;
  array.name = tensor.name;
  array.dtype = "<f4";
  array.shape = tensor.shape;
  array.data.assign(reinterpret_cast<const char*>(tensor.values.data()), tensor.ByteSize());
  return array;
}

std::vector<NumpyArray> ToNumpy(const TensorSet& tensors) {
  std::vector<NumpyArray> arrays;
  arrays.reserve(tensors.size());
  for (const NamedTensor& t : tensors) arrays.push_back(ToNumpy(t));
  return arrays;
}

Result<NamedTensor> ToTensor(const NumpyArray& array, const std::string& what) {
  NamedTensor tensor;
  tensor.name = array.name;
  tensor.shape = array.shape;
  ASSIGN_OR_RETURN(tensor.values, array.ToFloat32(what + ": array " + Quote(array.name)));
  return tensor;
}

}  // namespace tessera
