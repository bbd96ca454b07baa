// FUZZ_CHECK(condition, message): a property the decoder promises (a round trip, a verified
// hash) that does not hold. Prints where and why, then aborts so that libFuzzer keeps the input.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(condition, message)                                                       \
  do {                                                                                       \
    if (!(condition)) {                                                                      \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #condition, \
                   std::string(message).c_str());                                           \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
