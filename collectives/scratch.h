// Scratch buffers of the composed collectives (algorithms.h, fallback.h): kept between calls
// and only grown, so that steady state allocates nothing, and sized with checked arithmetic
// before any data moves. More bytes than an object can hold (PTRDIFF_MAX), or than can be
// allocated, is RESOURCE_EXHAUSTED naming the call, never an exception leaving it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera::collectives {

// `value` in decimal (std::to_string stops at 64 bits).
inline std::string DecimalText(unsigned __int128 value) {
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(value % 10)));
    value /= 10;
  } while (value != 0);
  return digits;
}

// Grows `buffer` to at least `blocks` x `block_elements` elements. An error reads "WHO needs
// scratch of N bytes[ for USE], more than an object can hold" (or ", which could not be
// allocated"): `who()` names the rank and the call or route, and is called only then, so a
// call that fits builds no text; `use` (or null) says what the scratch holds. The size is
// computed in 128 bits: with `blocks` a small count (ranks) or T a byte, it cannot wrap.
template <typename T, typename Who>
Result<T*> GrowScratch(std::vector<T>& buffer, size_t blocks, size_t block_elements, const Who& who,
                       const char* use = nullptr) {
  const unsigned __int128 elements = static_cast<unsigned __int128>(blocks) * block_elements;
  const bool fits = elements <= static_cast<unsigned __int128>(PTRDIFF_MAX) / sizeof(T);
  if (fits) {
    if (buffer.size() >= static_cast<size_t>(elements)) return buffer.data();
    try {
      buffer.resize(static_cast<size_t>(elements));
      return buffer.data();
    } catch (const std::bad_alloc&) {
    } catch (const std::length_error&) {
    }
  }
  return ResourceExhaustedError(who() + " needs scratch of " + DecimalText(elements * sizeof(T)) + " bytes" +
                                (use != nullptr ? std::string(" for ") + use : std::string()) +
                                (fits ? ", which could not be allocated" : ", more than an object can hold"));
}

}  // namespace tessera::collectives
