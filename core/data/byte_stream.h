// A file's bytes in order (or bytes already in memory), inflated as they are read when they are
// gzip-compressed, for the IDX readers (core/data/idx.cc): they read a header first and then
// only what it promises, so that neither a short file's header nor a gzip bomb sets how much
// memory they use.
//
// Not thread-safe: one reader at a time.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera {

// Whether the bytes are gzip is decided by their first two bytes. A gzip stream may hold one
// or more members; zeros after the last are tolerated. A reader keeps only what it asks for:
// 64 KiB of input at a time, whatever the file's size, and never more output than it reads.
class ByteStream {
 public:
  // A regular file, opened without blocking: kInvalidArgument for anything else (a FIFO, a
  // directory, a device); kNotFound or kPermissionDenied when the file cannot be opened.
  static Result<std::unique_ptr<ByteStream>> Open(const std::string& path);
  // Over `bytes`, which must outlive the stream; `source` stands for them in messages.
  static Result<std::unique_ptr<ByteStream>> OverBytes(const std::string& source, std::span<const uint8_t> bytes);
  ~ByteStream();
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  // The number of bytes Read will give in all, where that is known before reading them: a
  // plain file's size, or plain bytes in memory. Nothing for a gzip stream.
  std::optional<uint64_t> KnownSize() const { return known_size_; }
  // The bytes Read has given so far.
  uint64_t Position() const { return position_; }

  // Up to n bytes into `out`; fewer only at the end of the (inflated) stream. kDataLoss for a
  // corrupt or cut-off gzip stream, naming the file.
  Result<size_t> Read(uint8_t* out, size_t n);
  // Reads and drops up to n bytes; fewer only at the end of the stream.
  Result<uint64_t> Skip(uint64_t n);

 private:
  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

  ByteStream(std::string path, FilePtr file) : path_(std::move(path)), file_(std::move(file)) {}
  Result<size_t> ReadSome(uint8_t* out, size_t n);
  // Looks at the first bytes for the gzip magic; `size` is the plain size, where known.
  Status Start(std::optional<uint64_t> size);
  Status Fill();

  const std::string path_;
  FilePtr file_;
  std::vector<uint8_t> buffer_;  // what Fill read from the file
  std::span<const uint8_t> in_;  // input not yet used up: the buffer's, or the bytes in memory
  size_t in_pos_ = 0;
  bool file_done_ = false;
  bool gzip_ = false;
  bool inflating_ = false;
  bool member_open_ = true;
  bool finished_ = false;
  z_stream zs_{};
  uint64_t consumed_ = 0;
  uint64_t inflated_ = 0;
  uint64_t position_ = 0;
  std::optional<uint64_t> known_size_;
};

}  // namespace tessera
