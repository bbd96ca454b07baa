// The input format of the fuzzers that feed a decoder several messages in turn (a manifest,
// then chunks): a sequence of records, each a 2-byte little-endian length and that many bytes.
// A last record cut short by the end of the input is taken as far as it goes, so that every
// input means something and mutations that change a length still reach the decoder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::fuzz {

class RecordReader {
 public:
  RecordReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  // The next record, or false at the end of the input.
  bool Next(std::string_view* record) {
    if (size_ - offset_ < 2) return false;
    const size_t length = size_t{data_[offset_]} | (size_t{data_[offset_ + 1]} << 8);
    offset_ += 2;
    const size_t n = length < size_ - offset_ ? length : size_ - offset_;
    *record = std::string_view(reinterpret_cast<const char*>(data_ + offset_), n);
    offset_ += n;
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

// `bytes` as one record (at most 65535 bytes; longer ones are cut).
inline std::string Record(std::string_view bytes) {
  const size_t n = bytes.size() < 0xffff ? bytes.size() : 0xffff;
  std::string out;
  out.push_back(static_cast<char>(n & 0xff));
  out.push_back(static_cast<char>(n >> 8));
  out.append(bytes.substr(0, n));
  return out;
}

}  // namespace tessera::fuzz
