// Numbers as messages and logs show them.
#pragma once

#include <charconv>
#include <cstdio>
#include <string>

namespace tessera {

// `value` with six significant digits ("%.6g"): 0.001, 1e+09, 3.14159, inf, nan.
inline std::string FormatNumber(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

// The fewest digits that read back as `value` exactly (std::to_chars): a message that compares
// a value with a bound never shows the two alike when they differ (604800.0004, not 604800).
inline std::string FormatExact(double value) {
  char text[32];
  const auto [end, error] = std::to_chars(text, text + sizeof(text), value);
  return error == std::errc() ? std::string(text, end) : "?";
}

}  // namespace tessera
