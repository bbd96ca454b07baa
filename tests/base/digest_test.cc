// The two digests tensors travel with, against published values (SHA-256's FIPS 180-2
// example; XXH3-128 as the xxhsum tool of the same library prints it, `xxhsum -H2`), and the
// incremental forms against the one-shot ones across uneven pieces.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "base/sha256.h"
#include "base/xxh3.h"

namespace tessera {
namespace {

TEST(DigestTest, KnownValues) {
  EXPECT_EQ(Sha256Hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Xxh3Hex("", 0), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(Xxh3Hex("abc", 3), "06b05ab6733a618578af5f94892f3950");
  const std::string zeros(100000, '\0');
  EXPECT_EQ(Xxh3Hex(zeros.data(), zeros.size()), "e1f876364c6fec62315c72a64b7df4d2");
}

TEST(DigestTest, IncrementalMatchesOneShotAcrossUnevenPieces) {
  std::string bytes(70001, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
  Sha256 sha;
  Xxh3 xxh;
  for (size_t at = 0, step = 1; at < bytes.size(); at += step, step = step * 3 + 1) {
    const size_t n = std::min(step, bytes.size() - at);
    sha.Update(bytes.data() + at, n);
    xxh.Update(bytes.data() + at, n);
  }
  EXPECT_EQ(sha.FinishHex(), Sha256Hex(bytes.data(), bytes.size()));
  EXPECT_EQ(xxh.FinishHex(), Xxh3Hex(bytes.data(), bytes.size()));
  EXPECT_NE(Xxh3Hex(bytes.data(), bytes.size() - 1), Xxh3Hex(bytes.data(), bytes.size()));
  // The value libxxhash's portable (SSE2) entry point gives for these bytes: the vector
  // code the library picks at run time (base/xxh3.cc) must give the same.
  EXPECT_EQ(Xxh3Hex(bytes.data(), bytes.size()), "78abb9d4f4757899ef4cbad858a9c103");
}

}  // namespace
}  // namespace tessera
