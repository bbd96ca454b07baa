// Fuzzes HttpHeadReader (base/http_request.h), which reads a monitoring port's request heads
// from unauthenticated clients. The first byte picks how the rest is cut into pieces (1 to 64
// bytes): the same bytes fed whole and fed in pieces must give the same verdict, the same
// request and the same bytes left over. An accepted head's path starts with '/' and holds no
// NUL; the reader never keeps more than its limits allow.
#include <algorithm>
#include <string>
#include <string_view>

#include "base/http_request.h"
#include "fuzz_check.h"

namespace {

using tessera::HttpHeadReader;

std::string Describe(const HttpHeadReader& r) {
  std::string out = std::to_string(static_cast<int>(r.state())) + "/" + std::to_string(r.status()) + "/" + r.reason();
  if (r.state() == HttpHeadReader::State::kDone) {
    const auto& h = r.head();
    out += "/" + h.method + " " + h.path + " " + std::to_string(h.minor_version) + " " + h.authorization + " " +
           std::to_string(h.keep_alive) + std::to_string(h.has_body);
    for (const auto& [k, v] : h.params) out += "&" + k + "=" + v;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  tessera::HttpHeadLimits limits;
  limits.max_line_bytes = 256;  // small limits, so that the fuzzer reaches them
  limits.max_headers = 8;
  limits.max_head_bytes = 1024;

  HttpHeadReader whole(limits);
  whole.Feed(bytes);
  HttpHeadReader pieces(limits);
  size_t fed = 0;
  for (; fed < bytes.size() && pieces.state() == HttpHeadReader::State::kNeedMore; fed += piece) {
    pieces.Feed(bytes.substr(fed, piece));
  }
  fed = std::min(fed, bytes.size());
  if (whole.state() != HttpHeadReader::State::kNeedMore && pieces.state() != HttpHeadReader::State::kNeedMore) {
    FUZZ_CHECK(Describe(whole) == Describe(pieces), "whole: " + Describe(whole) + "\npieces: " + Describe(pieces));
  }
  if (whole.state() == HttpHeadReader::State::kDone && pieces.state() == HttpHeadReader::State::kDone) {
    // The pieces stop at the one that completed the head: its rest and what was never fed are
    // the whole's rest.
    FUZZ_CHECK(pieces.rest() + std::string(bytes.substr(fed)) == whole.rest(), "the rest is not the bytes after the head");
  }
  if (whole.state() == HttpHeadReader::State::kDone) {
    const auto& head = whole.head();
    FUZZ_CHECK(!head.path.empty() && head.path[0] == '/', "an accepted path does not start with '/'");
    FUZZ_CHECK(head.path.find('\0') == std::string::npos, "an accepted path holds NUL");
    FUZZ_CHECK(head.minor_version == 0 || head.minor_version == 1, "a version other than 1.0 or 1.1");
    FUZZ_CHECK(bytes.size() - whole.rest().size() <= limits.max_head_bytes, "a head longer than its bound");
    // Reading on from the rest must not depend on what came before.
    HttpHeadReader next(limits);
    next.Feed(whole.rest());
    HttpHeadReader restarted(limits);
    restarted.Feed(bytes);
    restarted.Restart(restarted.rest());
    FUZZ_CHECK(Describe(next) == Describe(restarted), "Restart differs from a fresh reader");
  }
  if (whole.state() == HttpHeadReader::State::kRefused) {
    const int s = whole.status();
    FUZZ_CHECK(s == 400 || s == 414 || s == 431 || s == 505, "an unexpected status " + std::to_string(s));
  }
  return 0;
}
