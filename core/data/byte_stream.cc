#include "core/data/byte_stream.h"
#include "base/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>

namespace tessera {

// A regular file only, opened without blocking: a FIFO in the file's place held the open
// until some writer came, which might be never (a job's data.path names the directory).
Result<std::unique_ptr<ByteStream>> ByteStream::Open(const std::string& path) {
  const RegularFileOpen opened = OpenRegularFile(path);
  if (opened.open_errno != 0) {
    const int err = opened.open_errno;
    std::string message = "cannot open " + path + ": " + std::strerror(err);
    if (err == ENOENT) return NotFoundError(std::move(message));
    if (err == EACCES) return PermissionDeniedError(std::move(message));
    return InvalidArgumentError(std::move(message));
  }
  if (!opened.ok()) return InvalidArgumentError(path + ": not a regular file");
  const int fd = opened.fd;
  const struct stat& info = opened.info;
  FilePtr file(::fdopen(fd, "rb"));
  if (!file) {
    const int err = errno;
    ::close(fd);
    return InvalidArgumentError("cannot open " + path + ": " + std::strerror(err));
  }
  std::unique_ptr<ByteStream> stream(new ByteStream(path, std::move(file)));
  RETURN_IF_ERROR(stream->Fill());
  std::optional<uint64_t> size;
  if (info.st_size >= 0) size = static_cast<uint64_t>(info.st_size);
  RETURN_IF_ERROR(stream->Start(size));
  return stream;
}

Result<std::unique_ptr<ByteStream>> ByteStream::OverBytes(const std::string& source, std::span<const uint8_t> bytes) {
  std::unique_ptr<ByteStream> stream(new ByteStream(source, nullptr));
  stream->in_ = bytes;
  stream->file_done_ = true;
  RETURN_IF_ERROR(stream->Start(bytes.size()));
  return stream;
}

ByteStream::~ByteStream() {
  if (inflating_) inflateEnd(&zs_);
}

Result<size_t> ByteStream::Read(uint8_t* out, size_t n) {
  ASSIGN_OR_RETURN(const size_t produced, ReadSome(out, n));
  position_ += produced;
  return produced;
}

Result<uint64_t> ByteStream::Skip(uint64_t n) {
  std::array<uint8_t, 1 << 16> scratch;
  uint64_t skipped = 0;
  while (skipped < n) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(n - skipped, scratch.size()));
    ASSIGN_OR_RETURN(const size_t got, Read(scratch.data(), want));
    skipped += got;
    if (got < want) break;
  }
  return skipped;
}

Result<size_t> ByteStream::ReadSome(uint8_t* out, size_t n) {
  size_t produced = 0;
  while (produced < n && !finished_) {
    if (in_pos_ == in_.size()) {
      if (file_done_) {
        if (gzip_ && member_open_) {
          return DataLossError(path_ + ": gzip stream is truncated: expected the end of the stream, found end of "
                               "file after " + std::to_string(consumed_) + " compressed bytes (" +
                               std::to_string(inflated_) + " bytes inflated)");
        }
        finished_ = true;
        break;
      }
      RETURN_IF_ERROR(Fill());
      continue;
    }
    if (!gzip_) {
      const size_t take = std::min(n - produced, in_.size() - in_pos_);
      std::memcpy(out + produced, in_.data() + in_pos_, take);
      in_pos_ += take;
      produced += take;
      continue;
    }
    if (!member_open_) {
      // Between members: zeros are padding; anything else starts another member.
      if (in_[in_pos_] == 0) {
        ++in_pos_;
        ++consumed_;
        continue;
      }
      inflateReset(&zs_);
      member_open_ = true;
    }
    const size_t avail = in_.size() - in_pos_;
    zs_.next_in = const_cast<Bytef*>(in_.data() + in_pos_);
    zs_.avail_in = static_cast<uInt>(avail);
    const size_t room = std::min<size_t>(n - produced, std::numeric_limits<uInt>::max());
    zs_.next_out = out + produced;
    zs_.avail_out = static_cast<uInt>(room);
    const int rc = inflate(&zs_, Z_NO_FLUSH);
    const size_t used = avail - zs_.avail_in;
    in_pos_ += used;
    consumed_ += used;
    produced += room - zs_.avail_out;
    inflated_ += room - zs_.avail_out;
    if (rc == Z_STREAM_END) {
      member_open_ = false;
      continue;
    }
    if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT) {
      return DataLossError(path_ + ": corrupt gzip stream at compressed byte " + std::to_string(consumed_) + ": " +
                           (zs_.msg ? zs_.msg : "data error"));
    }
    if (rc == Z_MEM_ERROR) return ResourceExhaustedError(path_ + ": out of memory while inflating");
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return DataLossError(path_ + ": inflate failed with zlib code " + std::to_string(rc));
    }
  }
  return produced;
}

Status ByteStream::Start(std::optional<uint64_t> size) {
  gzip_ = in_.size() - in_pos_ >= 2 && in_[0] == 0x1f && in_[1] == 0x8b;
  if (!gzip_) {
    known_size_ = size;
    return Status::Ok();
  }
  if (inflateInit2(&zs_, 15 + 16) != Z_OK) return InternalError("inflateInit2 failed for " + path_);
  inflating_ = true;
  return Status::Ok();
}

Status ByteStream::Fill() {
  buffer_.resize(1 << 16);
  const size_t n = std::fread(buffer_.data(), 1, buffer_.size(), file_.get());
  if (std::ferror(file_.get())) return DataLossError("error reading " + path_ + ": " + std::strerror(errno));
  in_ = std::span<const uint8_t>(buffer_.data(), n);
  in_pos_ = 0;
  if (n == 0) file_done_ = true;
  return Status::Ok();
}

}  // namespace tessera
