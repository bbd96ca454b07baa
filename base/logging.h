// How the daemons log: the level, and one line per event as text or as JSON.
//
// Text: "2024-05-01 12:00:00.123 [coordinator] info worker edge-01 joined".
// JSON: {"time":"2024-05-01T12:00:00.123Z","level":"info","source":"coordinator",
//        "message":"worker edge-01 joined"} — one object per line, UTC time, the message
// JSON-escaped (control characters as \uXXXX, bytes that are not UTF-8 as \\xNN text), so a
// log shipper can parse every line whatever a message holds.
//
// Text that came from the wire is escaped where it is logged (base/escape.h); this layer only
// guarantees that one event is one line.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace tessera {

// The values --log-level and --log-format accept, for FlagSet::Choice.
const std::vector<std::string>& LogLevelChoices();   // trace, debug, info, warn, error, off
const std::vector<std::string>& LogFormatChoices();  // text, json

// Sets the process's default logger: its level, and its format with `source` (the daemon,
// "coordinator", or the worker's name) on every line. InvalidArgument for a level or format
// outside the choices above. Call once, before the daemon's threads start.
Status ConfigureLogging(const std::string& source, const std::string& level, const std::string& format);

// One JSON log line (without the newline) as the JSON format writes it; for tests.
std::string JsonLogLine(const std::string& time, const std::string& level, const std::string& source,
                        std::string_view message);

}  // namespace tessera
