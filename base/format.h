// Numbers as messages and logs show them.
#pragma once

#include <cstdio>
#include <string>

namespace tessera {

// `value` with six significant digits ("%.6g"): 0.001, 1e+09, 3.14159, inf, nan.
inline std::string FormatNumber(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

}  // namespace tessera
