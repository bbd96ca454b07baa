// XXH3's 128-bit hash (libxxhash): the checksum an update's tensors travel with. It detects
// corruption between a worker's encoder and the coordinator's assembler at 15-30x the speed
// of SHA-256; it is not a cryptographic hash, and needs not be one there: the worker that
// sends the bytes computes their digest, so any digest proves only that they arrived as sent.
// Who sent them is the transport's to prove (TLS, mutual TLS). Models keep SHA-256, which
// names a model version.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace tessera {

// Lower-case hex (32 digits, the high 64 bits first, as XXH128's canonical form) of the
// XXH3 128-bit hash of `size` bytes at `data`, seed 0.
std::string Xxh3Hex(const void* data, size_t size);

// Incremental XXH3-128. Not thread-safe; one hasher per stream.
class Xxh3 {
 public:
  Xxh3();
  ~Xxh3();
  Xxh3(const Xxh3&) = delete;
  Xxh3& operator=(const Xxh3&) = delete;
  void Update(const void* data, size_t size);
  // Starts a new hash: one state serves tensor after tensor without an allocation each.
  void Reset();
  std::string FinishHex() const;

 private:
  void* state_;  // XXH3_state_t*
};

}  // namespace tessera
