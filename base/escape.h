// Untrusted text made safe to log or to put in an error message.
//
// Anything that came from the wire or from a file (a worker's name, a job's name, a device
// property, a job id asked for, a flag's value) may hold newlines that forge log lines,
// terminal escapes, or megabytes. EscapeUntrusted() shows it as one bounded line:
//  - printable ASCII stays; a backslash becomes "\\";
//  - \n, \r and \t become "\n", "\r" and "\t"; other control bytes, DEL, bytes that are not
//    UTF-8, C1 controls and the Unicode format characters that reorder or hide text
//    (U+061C, U+200B-U+200F, U+202A-U+202E, U+2060-U+2064, U+2066-U+2069, U+FEFF) become
//    "\xNN" per byte; other UTF-8 characters stay;
//  - past `max_chars` characters of the input, the rest is cut and "…(N bytes)" says how
//    long the whole input was.
// Thread-safe (a pure function).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tessera {

inline constexpr size_t kUntrustedMaxChars = 64;

std::string EscapeUntrusted(std::string_view text, size_t max_chars = kUntrustedMaxChars);

// Whether `text` holds what EscapeUntrusted would show escaped other than a backslash: a
// control byte (C0, DEL), bytes that are not UTF-8, a C1 control or a character that reorders or
// hides text. Names and labels that are shown as they are (a job's name) must hold none.
bool HasHiddenCharacters(std::string_view text);

// `text` as valid UTF-8 of at most `max_bytes` bytes, for formats that must be UTF-8 but show
// text as it is (a Prometheus label value): each byte that is not part of a valid UTF-8
// character becomes U+FFFD, and the text is cut between characters, never inside one.
std::string ValidUtf8(std::string_view text, size_t max_bytes);

// JSON text with every C1 control and character that reorders or hides text (as
// HasHiddenCharacters finds them) written as a "\uXXXX" escape: the same JSON to a parser, and
// nothing a terminal acts on or a reader cannot see when it is printed. Other bytes are kept
// as they are (the input is JSON: C0 controls are escaped already).
std::string EscapeHiddenInJson(std::string_view json);

// "'<escaped>'": EscapeUntrusted in single quotes, as error messages name an input.
std::string QuoteUntrusted(std::string_view text, size_t max_chars = kUntrustedMaxChars);

}  // namespace tessera
