// The names clients give the coordinator (a worker's name, a worker id, a cohort, a role's
// subject): letters, digits, '-', '_' and '.', which need no escaping in logs, file names or
// metric labels. One rule, used wherever such a name is taken in or read back.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <string_view>

namespace tessera {

// The most bytes a worker's name or a cohort's may have, and a job id.
inline constexpr size_t kMaxNameBytes = 128;
inline constexpr size_t kMaxJobIdBytes = 64;

inline bool IsNameCharacter(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
}

// 1 to `max_bytes` name characters.
inline bool IsName(std::string_view name, size_t max_bytes = kMaxNameBytes) {
  return !name.empty() && name.size() <= max_bytes && std::all_of(name.begin(), name.end(), IsNameCharacter);
}

}  // namespace tessera
