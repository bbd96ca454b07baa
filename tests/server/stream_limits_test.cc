// The coordinator's stream bounds without gRPC: counts per caller and overall, the options'
// ranges, and the watchdog ending an idle stream (and leaving a held or alive one).
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <optional>

#include "server/stream_limits.h"

namespace tessera::server {
namespace {

TEST(StreamCounterTest, RefusesOneMoreStreamPerCallerAndOverallNamingTheLimit) {
  StreamLimits limits;
  limits.max_streams_per_caller = 2;
  limits.max_streams = 3;
  StreamCounter counter(limits);
  auto a1 = counter.Open("caller 'worker/a'", "upload");
  auto a2 = counter.Open("caller 'worker/a'", "upload");
  ASSERT_TRUE(a1.ok() && a2.ok());
  auto a3 = counter.Open("caller 'worker/a'", "upload");
  EXPECT_EQ(a3.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a3.status().message(),
            "upload refused: caller 'worker/a' has 2 streams open, the limit per caller (max_streams_per_caller) is 2");
  auto b1 = counter.Open("caller 10.0.0.7", "watch");
  ASSERT_TRUE(b1.ok());
  auto b2 = counter.Open("caller 10.0.0.7", "watch");
  EXPECT_EQ(b2.status().message(), "watch refused: the coordinator has 3 streams open, its limit (max_streams) is 3");
  a1->reset();
  EXPECT_EQ(counter.open(), 2u);
  EXPECT_TRUE(counter.Open("caller 10.0.0.7", "watch").ok());
}

TEST(StreamLimitsTest, OptionsOutsideTheirRangesAreRefused) {
  StreamLimits limits;
  EXPECT_TRUE(limits.Validate().ok());
  limits.idle_timeout = std::chrono::milliseconds(0);
  EXPECT_EQ(limits.Validate().message(), "coordinator option stream idle_timeout: expected 100 to 3600000 ms, got 0");
  limits = StreamLimits();
  limits.max_streams = 10;
  EXPECT_EQ(limits.Validate().message(), "coordinator option max_streams: expected 4096 to 1000000, got 10");
}

TEST(CallerKeyTest, ACertificateNamesTheCallerElseItsAddressWithoutThePort) {
  EXPECT_EQ(CallerKey(true, "worker", "w1", "ipv4:10.0.0.7:5000"), "caller 'worker/w1'");
  EXPECT_EQ(CallerKey(false, "", "", "ipv4:10.0.0.7:5000"), "caller 10.0.0.7");
  EXPECT_EQ(CallerKey(false, "", "", "ipv6:[::1]:5000"), "caller [::1]");
}

struct Ended {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Status> why;
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return why.has_value(); });
  }
};

TEST(StreamWatchdogTest, EndsAStreamIdleForItsTimeoutOnceNamingTheLimit) {
  StreamWatchdog watchdog;
  Ended ended;
  auto stream = std::make_shared<StreamDeadline>("upload from caller 'worker/w1'", std::chrono::milliseconds(100),
                                                 std::chrono::hours(1), "transfer timeout (transfer_timeout)",
                                                 [&](const Status& why) {
                                                   std::lock_guard<std::mutex> lock(ended.mu);
                                                   ended.why = why;
                                                   ended.cv.notify_all();
                                                 });
  watchdog.Watch(stream);
  ASSERT_TRUE(ended.Wait());
  EXPECT_EQ(ended.why->code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ended.why->message(),
            "upload from caller 'worker/w1': nothing received or taken for 100 ms, its idle timeout (idle_timeout)");
  EXPECT_FALSE(stream->ClaimFinish());  // the watchdog claimed it
}

TEST(StreamWatchdogTest, AStreamEndsAtItsCapWithTheReason) {
  StreamWatchdog watchdog;
  Ended ended;
  auto stream = std::make_shared<StreamDeadline>("upload from worker 'w1'", std::chrono::hours(1),
                                                 std::chrono::hours(2), "transfer timeout (transfer_timeout)",
                                                 [&](const Status& why) {
                                                   std::lock_guard<std::mutex> lock(ended.mu);
                                                   ended.why = why;
                                                   ended.cv.notify_all();
                                                 });
  stream->Cap(StreamDeadline::Clock::now(), "job job-1-abc round 1 attempt 1 reached its deadline");
  EXPECT_EQ(stream->Expired(StreamDeadline::Clock::now())->message(),
            "upload from worker 'w1': job job-1-abc round 1 attempt 1 reached its deadline");
  EXPECT_FALSE(stream->Expired(StreamDeadline::Clock::now() - std::chrono::seconds(1)).has_value());
}

TEST(StreamWatchdogTest, AHeldStreamIsNotEndedByTheWatchdog) {
  auto stream = std::make_shared<StreamDeadline>("upload", std::chrono::milliseconds(100), std::chrono::hours(1),
                                                 "transfer timeout", [](const Status&) { FAIL() << "expired"; });
  ASSERT_TRUE(stream->Hold());
  EXPECT_TRUE(stream->ClaimFinish());
  EXPECT_FALSE(stream->Hold());  // claimed: nothing to hold
}

}  // namespace
}  // namespace tessera::server
