#include "base/http_request.h"

#include <algorithm>
#include <charconv>

#include "base/escape.h"

namespace tessera {

namespace {

bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool IsToken(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), IsTokenChar); }

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      const int hi = HexValue(in[i + 1]), lo = HexValue(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      const char decoded = static_cast<char>(hi * 16 + lo);
      if (decoded == '\0') return false;
      out->push_back(decoded);
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out->push_back(' ');
    } else {
      out->push_back(c);
    }
  }
  return true;
}

HttpHeadReader::State HttpHeadReader::Refuse(int status, std::string reason) {
  status_ = status;
  reason_ = std::move(reason);
  state_ = State::kRefused;
  return state_;
}

void HttpHeadReader::Restart(std::string rest) {
  buffer_.clear();
  scanned_ = 0;
  line_start_ = 0;
  line_spans_.clear();
  state_ = State::kNeedMore;
  head_ = HttpRequestHead{};
  rest_.clear();
  status_ = 0;
  reason_.clear();
  if (!rest.empty()) Feed(rest);
}

HttpHeadReader::State HttpHeadReader::Feed(std::string_view bytes) {
  if (state_ != State::kNeedMore) return state_;
  // Only as much as a head may hold is kept; what lies past it is refused below anyway.
  const size_t room = limits_.max_head_bytes + 1 > buffer_.size() ? limits_.max_head_bytes + 1 - buffer_.size() : 0;
  buffer_.append(bytes.substr(0, std::min(bytes.size(), room)));
  const std::string_view bytes_held = bytes.size() > room ? bytes.substr(room) : std::string_view();
  for (; scanned_ < buffer_.size(); ++scanned_) {
    if (buffer_[scanned_] != '\n') continue;
    size_t length = scanned_ - line_start_;
    if (length > 0 && buffer_[scanned_ - 1] == '\r') --length;
    const bool request_line = line_spans_.empty();
    if (length > limits_.max_line_bytes) {
      return request_line ? Refuse(414, "the request line is longer than " + std::to_string(limits_.max_line_bytes) + " bytes")
                          : Refuse(431, "a header line is longer than " + std::to_string(limits_.max_line_bytes) + " bytes");
    }
    if (length == 0 && request_line) {  // blank lines before a request are skipped (RFC 9112, 2.2)
      line_start_ = scanned_ + 1;
      continue;
    }
    if (length == 0) {  // the head's end
      ++scanned_;
      if (scanned_ > limits_.max_head_bytes) {  // its last byte was the one kept past the limit
        return Refuse(431, "the request's head is longer than " + std::to_string(limits_.max_head_bytes) + " bytes");
      }
      rest_.assign(buffer_, scanned_);
      rest_.append(bytes_held);
      return Parse();
    }
    if (line_spans_.size() > limits_.max_headers) {
      return Refuse(431, "more than " + std::to_string(limits_.max_headers) + " header lines");
    }
    line_spans_.emplace_back(line_start_, length);
    line_start_ = scanned_ + 1;
  }
  if (buffer_.size() - line_start_ > limits_.max_line_bytes + 1) {
    return line_spans_.empty()
               ? Refuse(414, "the request line is longer than " + std::to_string(limits_.max_line_bytes) + " bytes")
               : Refuse(431, "a header line is longer than " + std::to_string(limits_.max_line_bytes) + " bytes");
  }
  if (buffer_.size() > limits_.max_head_bytes) {
    return Refuse(431, "the request's head is longer than " + std::to_string(limits_.max_head_bytes) + " bytes");
  }
  return state_;
}

HttpHeadReader::State HttpHeadReader::Parse() {
  const std::string_view all(buffer_);
  // The request line: METHOD SP target SP HTTP/1.x
  const std::string_view line = all.substr(line_spans_[0].first, line_spans_[0].second);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return Refuse(400, "the request line is not METHOD TARGET HTTP/1.x");
  }
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method) || method.size() > 16) return Refuse(400, "the request's method is not a token");
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || version[6] != '.' || version[5] < '0' ||
      version[5] > '9' || version[7] < '0' || version[7] > '9') {
    return Refuse(400, "the request line does not end in HTTP/1.x");
  }
  if (version[5] != '1') return Refuse(505, "only HTTP/1.0 and HTTP/1.1 are served");
  head_.method = std::string(method);
  head_.minor_version = version[7] == '0' ? 0 : 1;  // a later 1.x is answered as 1.1 (RFC 9110, 2.5)
  head_.keep_alive = head_.minor_version >= 1;
  if (target.empty() || target[0] != '/') return Refuse(400, "the request's target is not a path starting with '/'");
  for (const char c : target) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) return Refuse(400, "the request's target holds a control character");
  }
  const size_t question = target.find('?');
  const size_t hash = target.find('#');
  const std::string_view raw_path = target.substr(0, std::min(question, hash));
  if (!PercentDecode(raw_path, false, &head_.path)) return Refuse(400, "the request's path has a malformed %-escape");
  if (question != std::string_view::npos && (hash == std::string_view::npos || question < hash)) {
    std::string_view query = target.substr(question + 1, hash == std::string_view::npos ? std::string_view::npos : hash - question - 1);
    while (!query.empty()) {
      const size_t amp = query.find('&');
      const std::string_view pair = query.substr(0, amp);
      query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
      if (pair.empty()) continue;
      const size_t eq = pair.find('=');
      std::string key, value;
      if (!PercentDecode(pair.substr(0, eq), true, &key) ||
          !PercentDecode(eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1), true, &value)) {
        return Refuse(400, "the request's query has a malformed %-escape");
      }
      head_.params.emplace(std::move(key), std::move(value));
    }
  }
  bool saw_authorization = false, saw_length = false, close = false, keep_alive = false;
  for (size_t i = 1; i < line_spans_.size(); ++i) {
    const std::string_view header = all.substr(line_spans_[i].first, line_spans_[i].second);
    if (header[0] == ' ' || header[0] == '\t') return Refuse(400, "a header line is folded (obsolete line folding)");
    const size_t colon = header.find(':');
    if (colon == std::string_view::npos || !IsToken(header.substr(0, colon))) {
      return Refuse(400, "header line " + std::to_string(i) + " is not NAME: VALUE");
    }
    const std::string_view name = header.substr(0, colon);
    const std::string_view value = Trim(header.substr(colon + 1));
    for (const char c : value) {
      const auto u = static_cast<unsigned char>(c);
      if ((u < 0x20 && c != '\t') || u == 0x7f) {
        return Refuse(400, "header " + QuoteUntrusted(name, 64) + " holds a control character");
      }
    }
    if (EqualsIgnoringCase(name, "authorization")) {
      if (saw_authorization) return Refuse(400, "more than one Authorization header");
      saw_authorization = true;
      head_.authorization = std::string(value);
    } else if (EqualsIgnoringCase(name, "content-length")) {
      if (saw_length) return Refuse(400, "more than one Content-Length header");
      saw_length = true;
      if (value.empty() || !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return Refuse(400, "Content-Length is not a number");
      }
      if (value.find_first_not_of('0') != std::string_view::npos) head_.has_body = true;
    } else if (EqualsIgnoringCase(name, "transfer-encoding")) {
      head_.has_body = true;
    } else if (EqualsIgnoringCase(name, "connection")) {
      std::string_view options = value;
      while (!options.empty()) {
        const size_t comma = options.find(',');
        const std::string_view option = Trim(options.substr(0, comma));
        options = comma == std::string_view::npos ? std::string_view() : options.substr(comma + 1);
        close = close || EqualsIgnoringCase(option, "close");
        keep_alive = keep_alive || EqualsIgnoringCase(option, "keep-alive");
      }
    }
  }
  // "close" wins over "keep-alive"; HTTP/1.0 keeps the connection only when asked to.
  head_.keep_alive = !close && (head_.minor_version >= 1 || keep_alive);
  state_ = State::kDone;
  return state_;
}

}  // namespace tessera
