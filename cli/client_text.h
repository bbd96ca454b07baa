// Text helpers shared by the command line's subcommands (job_client.cc, watch_command.cc).
// Internal to tessera_cli.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tessera::cli {

// printf into a string as long as the text needs: a trace event or a table row holds strings
// from the coordinator (a worker's failure, a device's name) of several hundred bytes, and a
// cut one is JSON that does not parse or a row without its line end.
std::string Format(const char* format, ...) __attribute__((format(printf, 1, 2)));

// The most characters of a string from the coordinator that a line shows: a name (a worker's,
// a device's, as the coordinator keeps them: escaped, so up to four characters a byte), and a
// note or an error.
inline constexpr size_t kShownNameChars = 600;
inline constexpr size_t kShownTextChars = 2048;

// A string from the coordinator as the terminal is to show it: as it is when it holds no
// control or hidden character and has at most `max_chars` bytes (the coordinator's own texts
// and its escaped copies of workers' strings), else escaped and cut as base/escape.h does. No
// escape sequence of a coordinator's reply reaches the terminal, and no megabytes of it.
std::string Shown(std::string_view text, size_t max_chars);

}  // namespace tessera::cli
