// The head of an HTTP/1.x request, read from untrusted bytes as they arrive: the request line
// and header lines, each bounded, their number bounded, the whole head bounded. Only what the
// endpoint (base/http_endpoint.h) acts on is kept: method, path and query, the first
// Authorization header, whether the connection stays open, whether a body follows.
//
// Nothing here does I/O; HttpHeadReader is fed bytes and says when a head is complete, or why
// it is refused (with the HTTP status to answer).
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

struct HttpHeadLimits {
  size_t max_line_bytes = 8192;   // the request line and each header line, without its line end
  size_t max_headers = 64;        // header lines
  size_t max_head_bytes = 32768;  // everything up to and including the blank line
};

struct HttpRequestHead {
  std::string method;                         // as sent: GET, HEAD, ...
  std::string path;                           // percent-decoded; starts with '/'
  std::map<std::string, std::string> params;  // the query string's, decoded, first value of each
  int minor_version = 1;                      // HTTP/1.minor_version
  std::string authorization;                  // the Authorization header, if any
  bool keep_alive = true;                     // HTTP/1.1 unless "Connection: close"; 1.0 only with keep-alive
  bool has_body = false;                      // a Content-Length above 0, or a Transfer-Encoding
};

class HttpHeadReader {
 public:
  enum class State { kNeedMore, kDone, kRefused };

  explicit HttpHeadReader(HttpHeadLimits limits = {}) : limits_(limits) {}

  // Takes the bytes that arrived next. Once kDone, head() holds the request and rest() the bytes
  // after its blank line (a pipelined request); once kRefused, status() and reason() say why.
  // Feeding after either is a no-op that returns the same state.
  State Feed(std::string_view bytes);

  // Starts on the next request, with the bytes already read past the last head.
  void Restart(std::string rest);

  State state() const { return state_; }
  bool empty() const { return buffer_.empty(); }
  const HttpRequestHead& head() const { return head_; }
  const std::string& rest() const { return rest_; }
  int status() const { return status_; }  // 400, 414, 431 or 505
  const std::string& reason() const { return reason_; }

 private:
  State Refuse(int status, std::string reason);
  State Parse();

  HttpHeadLimits limits_;
  std::string buffer_;
  size_t scanned_ = 0;                 // bytes of buffer_ already searched for a line end
  size_t line_start_ = 0;              // where the line being read starts
  std::vector<std::pair<size_t, size_t>> line_spans_;  // each line's start and length, without its end
  State state_ = State::kNeedMore;
  HttpRequestHead head_;
  std::string rest_;
  int status_ = 0;
  std::string reason_;
};

// Decodes %XX escapes (and '+' as a space when `plus_is_space`, as in a query). False on a
// malformed escape or one that decodes to NUL.
bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out);

}  // namespace tessera
