#include "base/escape.h"

#include <algorithm>
#include <cstdint>

namespace tessera {
namespace {

// The length of the UTF-8 sequence at text[i] and its code point, or 0 when it is not valid
// UTF-8 (overlong forms, surrogates and code points past U+10FFFF are not valid).
size_t DecodeUtf8(std::string_view text, size_t i, uint32_t* code_point) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  size_t length = 0;
  uint32_t cp = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    cp = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    cp = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    cp = lead & 0x07;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  if ((length == 3 && cp < 0x800) || (length == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
  *code_point = cp;
  return length;
}

// C1 controls, and the characters that reorder, join or hide text without showing.
bool IsHiddenCharacter(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x061C || (cp >= 0x200B && cp <= 0x200F) || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2060 && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x2069) || cp == 0xFEFF;
}

void AppendHexByte(std::string& out, unsigned char b) {
  static const char kHex[] = "0123456789abcdef";
  out += "\\x";
  out += kHex[b >> 4];
  out += kHex[b & 0xF];
}

}  // namespace

std::string EscapeUntrusted(std::string_view text, size_t max_chars) {
  std::string out;
  out.reserve(std::min(text.size(), max_chars) + 16);
  size_t chars = 0;
  size_t i = 0;
  while (i < text.size()) {
    if (chars == max_chars) {
      out += "\xE2\x80\xA6(" + std::to_string(text.size()) + " bytes)";
      return out;
    }
    ++chars;
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F) {
      if (c == '\\') out += '\\';
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x80) {
      AppendHexByte(out, c);
    } else {
      uint32_t cp = 0;
      const size_t length = DecodeUtf8(text, i, &cp);
      if (length == 0) {
        AppendHexByte(out, c);
      } else {
        for (size_t k = 0; k < length; ++k) {
          if (IsHiddenCharacter(cp)) {
            AppendHexByte(out, static_cast<unsigned char>(text[i + k]));
          } else {
            out += text[i + k];
          }
        }
        i += length;
        continue;
      }
    }
    ++i;
  }
  return out;
}

bool HasHiddenCharacters(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7F) return true;
    if (c < 0x80) {
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t length = DecodeUtf8(text, i, &cp);
    if (length == 0 || IsHiddenCharacter(cp)) return true;
    i += length;
  }
  return false;
}

std::string EscapeHiddenInJson(std::string_view json) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(json.size());
  size_t i = 0;
  while (i < json.size()) {
    const unsigned char c = static_cast<unsigned char>(json[i]);
    uint32_t cp = 0;
    const size_t length = c < 0x80 ? 0 : DecodeUtf8(json, i, &cp);
    if (length > 0 && IsHiddenCharacter(cp)) {  // every one is below U+10000: one escape
      out += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(cp >> shift) & 0xF];
      i += length;
      continue;
    }
    const size_t keep = length > 0 ? length : 1;
    out.append(json.substr(i, keep));
    i += keep;
  }
  return out;
}

std::string ValidUtf8(std::string_view text, size_t max_bytes) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  size_t i = 0;
  while (i < text.size()) {
    size_t length = 1;
    uint32_t cp = 0;
    const bool ascii = static_cast<unsigned char>(text[i]) < 0x80;
    if (!ascii) length = DecodeUtf8(text, i, &cp);
    const std::string_view character = ascii || length > 0 ? text.substr(i, length) : kReplacement;
    if (out.size() + character.size() > max_bytes) break;
    out += character;
    i += std::max<size_t>(length, 1);
  }
  return out;
}

std::string QuoteUntrusted(std::string_view text, size_t max_chars) {
  return "'" + EscapeUntrusted(text, max_chars) + "'";
}

}  // namespace tessera
