// HttpHeadReader: what a request's head may hold, read from bytes as they arrive.
#include "base/http_request.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

using State = HttpHeadReader::State;

TEST(HttpHeadReaderTest, ReadsAHeadFedAByteAtATime) {
  const std::string request =
      "GET /api/job?id=j%2D1&from=3&id=second&flag&q=a+b HTTP/1.1\r\nHost: x\r\nAuthorization:  Bearer t0k \r\n\r\nGET /next";
  HttpHeadReader reader;
  size_t fed = 0;
  for (; fed < request.size() && reader.state() == State::kNeedMore; ++fed) reader.Feed(request.substr(fed, 1));
  ASSERT_EQ(reader.state(), State::kDone) << reader.reason();
  EXPECT_EQ(fed, request.size() - 9) << "done at the blank line";
  const HttpRequestHead& head = reader.head();
  EXPECT_EQ(head.method, "GET");
  EXPECT_EQ(head.path, "/api/job");
  EXPECT_EQ(head.params.at("id"), "j-1") << "decoded, and the first of two kept";
  EXPECT_EQ(head.params.at("from"), "3");
  EXPECT_EQ(head.params.at("flag"), "");
  EXPECT_EQ(head.params.at("q"), "a b");
  EXPECT_EQ(head.authorization, "Bearer t0k");
  EXPECT_TRUE(head.keep_alive);
  EXPECT_FALSE(head.has_body);
  EXPECT_EQ(head.minor_version, 1);
}

TEST(HttpHeadReaderTest, KeepsWhatFollowsTheHeadForTheNextRequest) {
  HttpHeadReader reader;
  ASSERT_EQ(reader.Feed("\r\nGET /a HTTP/1.1\n\nGET /b HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET"), State::kDone);
  EXPECT_EQ(reader.head().path, "/a") << "a blank line before the request is skipped; bare line feeds end lines";
  reader.Restart(reader.rest());
  ASSERT_EQ(reader.state(), State::kDone);
  EXPECT_EQ(reader.head().path, "/b");
  EXPECT_EQ(reader.head().minor_version, 0);
  EXPECT_TRUE(reader.head().keep_alive);
  reader.Restart(reader.rest());
  EXPECT_EQ(reader.state(), State::kNeedMore);
  EXPECT_FALSE(reader.empty());
}

TEST(HttpHeadReaderTest, ConnectionAndBodyHeaders) {
  auto read = [](const std::string& headers) {
    HttpHeadReader reader;
    reader.Feed("GET / HTTP/1.1\r\n" + headers + "\r\n");
    return reader;
  };
  EXPECT_FALSE(read("Connection: keep-alive, Close\r\n").head().keep_alive) << "close wins";
  EXPECT_TRUE(read("Content-Length: 000\r\n").state() == State::kDone && !read("Content-Length: 0\r\n").head().has_body);
  EXPECT_TRUE(read("Content-Length: 12\r\n").head().has_body);
  EXPECT_TRUE(read("Transfer-Encoding: chunked\r\n").head().has_body);
  HttpHeadReader old;
  old.Feed("GET / HTTP/1.0\r\n\r\n");
  EXPECT_FALSE(old.head().keep_alive) << "HTTP/1.0 closes unless asked";
  for (const char* refused : {"Content-Length: 1\r\nContent-Length: 1\r\n", "Content-Length: -1\r\n",
                              "Content-Length: 1e3\r\n", "Authorization: a\r\nAuthorization: b\r\n", "No colon\r\n",
                              " folded: line\r\n", "Bad Name: x\r\n", ": empty name\r\n", "X: nul\x01here\r\n"}) {
    HttpHeadReader r = read(refused);
    EXPECT_EQ(r.state(), State::kRefused) << refused;
    EXPECT_EQ(r.status(), 400) << refused;
  }
}

TEST(HttpHeadReaderTest, RefusesMalformedRequestLines) {
  for (const char* line : {"GET\r\n\r\n", "GET /\r\n\r\n", "GET  / HTTP/1.1\r\n\r\n", "GET / HTTP/1.1 x\r\n\r\n",
                           "G(T / HTTP/1.1\r\n\r\n", "GET http://host/ HTTP/1.1\r\n\r\n", "GET * HTTP/1.1\r\n\r\n",
                           "GET /a%zz HTTP/1.1\r\n\r\n", "GET /a%0 HTTP/1.1\r\n\r\n", "GET /a%00b HTTP/1.1\r\n\r\n",
                           "GET /?q=%G1 HTTP/1.1\r\n\r\n", "GET / HTTP/1.x\r\n\r\n", "GET / http/1.1\r\n\r\n",
                           "GET /a\x7f HTTP/1.1\r\n\r\n", "VERYLONGMETHODNAMEX / HTTP/1.1\r\n\r\n"}) {
    HttpHeadReader reader;
    EXPECT_EQ(reader.Feed(line), State::kRefused) << line;
    EXPECT_EQ(reader.status(), 400) << line << ": " << reader.reason();
  }
  HttpHeadReader later;
  EXPECT_EQ(later.Feed("GET / HTTP/1.9\r\n\r\n"), State::kDone);
  EXPECT_EQ(later.head().minor_version, 1) << "a later HTTP/1.x is answered as 1.1";
  HttpHeadReader two;
  EXPECT_EQ(two.Feed("GET / HTTP/2.0\r\n\r\n"), State::kRefused);
  EXPECT_EQ(two.status(), 505);
}

TEST(HttpHeadReaderTest, BoundsLinesTheirNumberAndTheWholeHead) {
  HttpHeadLimits limits;
  limits.max_line_bytes = 64;
  limits.max_headers = 4;
  limits.max_head_bytes = 200;
  {
    HttpHeadReader reader(limits);
    EXPECT_EQ(reader.Feed("GET /" + std::string(100, 'a')), State::kRefused) << "before the line ends";
    EXPECT_EQ(reader.status(), 414);
  }
  {
    HttpHeadReader reader(limits);
    EXPECT_EQ(reader.Feed("GET / HTTP/1.1\r\nX: " + std::string(70, 'v') + "\r\n"), State::kRefused);
    EXPECT_EQ(reader.status(), 431);
  }
  {
    HttpHeadReader reader(limits);
    std::string head = "GET / HTTP/1.1\r\n";
    for (int i = 0; i < 4; ++i) head += "X-" + std::to_string(i) + ": v\r\n";
    EXPECT_EQ(reader.Feed(head), State::kNeedMore) << "four header lines are allowed";
    EXPECT_EQ(reader.Feed("X-4: v\r\n"), State::kRefused) << "a fifth is not";
    EXPECT_EQ(reader.status(), 431);
    EXPECT_EQ(reader.reason(), "more than 4 header lines");
    EXPECT_EQ(reader.Feed("\r\n"), State::kRefused) << "stays refused";
  }
  {
    HttpHeadLimits many = limits;
    many.max_headers = 100;
    HttpHeadReader reader(many);
    std::string head = "GET / HTTP/1.1\r\n";
    State state = reader.Feed(head);
    for (int i = 0; i < 20 && state == State::kNeedMore; ++i) state = reader.Feed("X: " + std::string(40, 'v') + "\r\n");
    EXPECT_EQ(state, State::kRefused) << "200 bytes in all";
    EXPECT_EQ(reader.status(), 431);
  }
  {
    HttpHeadReader reader(limits);
    EXPECT_EQ(reader.Feed(std::string(300, '\n')), State::kRefused) << "blank lines count toward the head too";
  }
  // A head of exactly 200 bytes is read; one of 201, fed whole or a byte at a time, is not.
  for (const size_t size : {size_t{200}, size_t{201}}) {
    std::string head = "GET / HTTP/1.1\r\n";
    for (int i = 0; i < 3; ++i) head += "X: " + std::string(40, 'v') + "\r\n";
    head += "X: " + std::string(size - head.size() - 7, 'v') + "\r\n\r\n";
    ASSERT_EQ(head.size(), size);
    HttpHeadReader whole(limits);
    EXPECT_EQ(whole.Feed(head), size == 200 ? State::kDone : State::kRefused) << size;
    HttpHeadReader bytes(limits);
    State state = State::kNeedMore;
    for (size_t i = 0; i < head.size() && state == State::kNeedMore; ++i) state = bytes.Feed(head.substr(i, 1));
    EXPECT_EQ(state, size == 200 ? State::kDone : State::kRefused) << size;
    if (size == 201) {
      EXPECT_EQ(bytes.reason(), "the request's head is longer than 200 bytes");
    }
  }
}

TEST(HttpHeadReaderTest, PercentDecoding) {
  std::string out;
  EXPECT_TRUE(PercentDecode("a%20b+c%2b", true, &out));
  EXPECT_EQ(out, "a b c+");
  EXPECT_TRUE(PercentDecode("a+b", false, &out));
  EXPECT_EQ(out, "a+b");
  EXPECT_FALSE(PercentDecode("%", false, &out));
  EXPECT_FALSE(PercentDecode("%4", false, &out));
  EXPECT_FALSE(PercentDecode("%00", false, &out));
}

}  // namespace
}  // namespace tessera
