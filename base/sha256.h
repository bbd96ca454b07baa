// Content hashes for tensors, models and files.
#pragma once

#include <cstddef>
#include <string>

namespace tessera {

// Lower-case hex SHA-256 of `size` bytes at `data`.
std::string Sha256Hex(const void* data, size_t size);

// Incremental SHA-256. Not thread-safe; one hasher per stream.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(const void* data, size_t size);
  std::string FinishHex();  // the hasher cannot be updated afterwards

 private:
  void* ctx_;  // EVP_MD_CTX*
};

}  // namespace tessera
