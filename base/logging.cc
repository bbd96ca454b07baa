#include "base/logging.h"

#include <spdlog/formatter.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <ctime>

#include "base/escape.h"
#include "base/flags.h"

namespace tessera {
namespace {

// JSON string content: quotes, backslashes and control characters escaped; bytes that are
// not UTF-8 shown as the text \xNN so that the line stays valid UTF-8.
void AppendJsonString(std::string& out, std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  out += '"';
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      // Let EscapeUntrusted judge the UTF-8 sequence: valid characters come back unchanged.
      size_t length = (c >= 0xF0) ? 4 : (c >= 0xE0) ? 3 : (c >= 0xC0) ? 2 : 1;
      length = std::min(length, text.size() - i);
      const std::string_view sequence = text.substr(i, length);
      const std::string shown = EscapeUntrusted(sequence, 1);
      if (shown == sequence) {
        out += sequence;
        i += length - 1;
      } else {
        out += "\\\\x";
        out += kHex[c >> 4];
        out += kHex[c & 0xF];
      }
    }
  }
  out += '"';
}

std::string Iso8601Utc(spdlog::log_clock::time_point time) {
  const auto since_epoch = time.time_since_epoch();
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
  const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch - seconds).count();
  const std::time_t t = static_cast<std::time_t>(seconds.count());
  std::tm utc{};
  gmtime_r(&t, &utc);
  char buffer[40];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%S", &utc);
  char with_millis[48];
  std::snprintf(with_millis, sizeof(with_millis), "%s.%03dZ", buffer, static_cast<int>(millis));
  return with_millis;
}

class JsonFormatter final : public spdlog::formatter {
 public:
  explicit JsonFormatter(std::string source) : source_(std::move(source)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto level = spdlog::level::to_string_view(msg.level);
    std::string line = JsonLogLine(Iso8601Utc(msg.time), std::string(level.data(), level.size()), source_,
                                   std::string_view(msg.payload.data(), msg.payload.size()));
    line += '\n';
    dest.append(line.data(), line.data() + line.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(source_); }

 private:
  std::string source_;
};

}  // namespace

const std::vector<std::string>& LogLevelChoices() {
  static const std::vector<std::string> choices{"trace", "debug", "info", "warn", "error", "off"};
  return choices;
}

const std::vector<std::string>& LogFormatChoices() {
  static const std::vector<std::string> choices{"text", "json"};
  return choices;
}

std::string JsonLogLine(const std::string& time, const std::string& level, const std::string& source,
                        std::string_view message) {
  std::string line = "{\"time\":";
  AppendJsonString(line, time);
  line += ",\"level\":";
  AppendJsonString(line, level);
  line += ",\"source\":";
  AppendJsonString(line, source);
  line += ",\"message\":";
  AppendJsonString(line, message);
  line += '}';
  return line;
}

Status ConfigureLogging(const std::string& source, const std::string& level, const std::string& format) {
  bool known_level = false;
  for (const auto& l : LogLevelChoices()) known_level = known_level || l == level;
  if (!known_level) {
    return InvalidArgumentError("flag --log-level: expected " + JoinChoices(LogLevelChoices()) + ", got " +
                                QuoteUntrusted(level));
  }
  if (format != "text" && format != "json") {
    return InvalidArgumentError("flag --log-format: expected " + JoinChoices(LogFormatChoices()) + ", got " +
                                QuoteUntrusted(format));
  }
  spdlog::set_level(spdlog::level::from_str(level));
  if (format == "json") {
    spdlog::set_formatter(std::make_unique<JsonFormatter>(source));
  } else {
    std::string tag;
    for (char c : EscapeUntrusted(source)) tag += c == '%' ? std::string("%%") : std::string(1, c);
    spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e [" + tag + "] %^%l%$ %v");
  }
  return Status::Ok();
}

}  // namespace tessera
