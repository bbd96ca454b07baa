// Log lines: JSON that a shipper can parse whatever a message holds, and a budget for
// repeated refusals.
#include <gtest/gtest.h>

#include "base/logging.h"
#include "base/rate_limit.h"

namespace tessera {
namespace {

TEST(LoggingTest, AJsonLineIsOneLineOfValidJsonWhateverTheMessageHolds) {
  EXPECT_EQ(JsonLogLine("2024-05-01T12:00:00.123Z", "info", "coordinator", "worker edge-01 joined"),
            R"({"time":"2024-05-01T12:00:00.123Z","level":"info","source":"coordinator","message":"worker edge-01 joined"})");
  EXPECT_EQ(JsonLogLine("t", "warning", "w\"1", "a \"quoted\" \\ path\nsecond line\x01"),
            R"({"time":"t","level":"warning","source":"w\"1","message":"a \"quoted\" \\ path\nsecond line\u0001"})");
  EXPECT_EQ(JsonLogLine("t", "info", "c", "caf\xC3\xA9 \xFF"), R"({"time":"t","level":"info","source":"c","message":"caf)"
                                                                   "\xC3\xA9"
                                                                   R"( \\xff"})");
}

TEST(LoggingTest, UnknownLevelsAndFormatsAreRefused) {
  EXPECT_EQ(ConfigureLogging("t", "verbose", "text").message(),
            "flag --log-level: expected trace, debug, info, warn, error or off, got 'verbose'");
  EXPECT_EQ(ConfigureLogging("t", "info", "xml").message(), "flag --log-format: expected text or json, got 'xml'");
  EXPECT_TRUE(ConfigureLogging("t", "info", "json").ok());
  EXPECT_TRUE(ConfigureLogging("t", "info", "text").ok());
}

TEST(RateLimitTest, ABurstIsLetThroughThenTheRestAreCountedAndReported) {
  LogRateLimiter limiter(3, std::chrono::seconds(10));
  const auto t0 = LogRateLimiter::Clock::time_point() + std::chrono::hours(1);
  uint64_t suppressed = 99;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(limiter.Allow(t0 + std::chrono::milliseconds(i), &suppressed));
    EXPECT_EQ(suppressed, 0u);
  }
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(limiter.Allow(t0 + std::chrono::milliseconds(100 + i), &suppressed));
  // The next window lets a line through, and it says how many were held back.
  ASSERT_TRUE(limiter.Allow(t0 + std::chrono::seconds(10), &suppressed));
  EXPECT_EQ(suppressed, 50u);
  ASSERT_TRUE(limiter.Allow(t0 + std::chrono::seconds(11), &suppressed));
  EXPECT_EQ(suppressed, 0u);
}

}  // namespace
}  // namespace tessera
