#include "base/xxh3.h"

#include <xxhash.h>
// On x86, libxxhash picks the widest vector unit at run time (AVX2 or AVX-512) behind
// these names; the plain entry points run its SSE2 code, 1.7-2.4x slower on the update
// sizes the coordinator checks. The same hash either way.
#if defined(__x86_64__) || defined(__i386__)
#include <xxh_x86dispatch.h>
#endif

#include <new>

namespace tessera {
namespace {

std::string Hex(XXH128_hash_t hash) {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, hash);
  static const char kHex[] = "0123456789abcdef";
  std::string out(sizeof(canonical.digest) * 2, '0');
  for (size_t i = 0; i < sizeof(canonical.digest); ++i) {
    out[2 * i] = kHex[canonical.digest[i] >> 4];
    out[2 * i + 1] = kHex[canonical.digest[i] & 15];
  }
  return out;
}

}  // namespace

std::string Xxh3Hex(const void* data, size_t size) { return Hex(XXH3_128bits(data, size)); }

Xxh3::Xxh3() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3::~Xxh3() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3::Reset() { XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_)); }

void Xxh3::Update(const void* data, size_t size) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}

std::string Xxh3::FinishHex() const { return Hex(XXH3_128bits_digest(static_cast<const XXH3_state_t*>(state_))); }

}  // namespace tessera
