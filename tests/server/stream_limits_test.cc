// The coordinator's stream bounds without gRPC: counts per caller and overall, the options'
// ranges, and the watchdog ending an idle stream (and leaving a held or alive one). The
// watchdog runs on a ManualClock: time moves when a test says so, and nothing sleeps.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <stdexcept>
#include <mutex>
#include <optional>
#include <thread>

#include "base/clock.h"
#include "server/rpc/stream_limits.h"

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

using std::chrono::milliseconds;

constexpr milliseconds kWaitLimit{60000};  // reached only when a test fails

struct Ended {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Status> why;
  int calls = 0;
  std::function<void(Status)> Callback() {
    return [this](const Status& status) {
      std::lock_guard<std::mutex> lock(mu);
      why = status;
      ++calls;
      cv.notify_all();
    };
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, kWaitLimit, [&] { return why.has_value(); });
  }
  bool happened() {
    std::lock_guard<std::mutex> lock(mu);
    return why.has_value();
  }
};

TEST(StreamWatchdogTest, EndsAStreamIdleForItsTimeoutOnceNamingTheLimit) {
  ManualClock clock;
  StreamWatchdog watchdog(&clock);
  Ended ended;
  const auto start = clock.Now();
  auto stream = std::make_shared<StreamDeadline>("upload from caller 'worker/w1'", milliseconds(100),
                                                 std::chrono::hours(1), "transfer timeout (transfer_timeout)",
                                                 ended.Callback(), &clock);
  watchdog.Watch(stream);
  // The watchdog sleeps until exactly the idle limit, and not a moment less.
  ASSERT_TRUE(clock.AwaitWaiters(1, kWaitLimit));
  EXPECT_EQ(clock.NextDeadline(), start + milliseconds(100));
  clock.Advance(milliseconds(99));
  ASSERT_TRUE(clock.AwaitWaiters(1, kWaitLimit));
  EXPECT_FALSE(ended.happened());
  EXPECT_FALSE(stream->Expired().has_value());
  clock.Advance(milliseconds(1));
  ASSERT_TRUE(ended.Wait());
  EXPECT_EQ(ended.why->code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ended.why->message(),
            "upload from caller 'worker/w1': nothing received or taken for 100 ms, its idle timeout (idle_timeout)");
  EXPECT_FALSE(stream->ClaimFinish());  // the watchdog claimed it
  clock.Advance(std::chrono::hours(2));
  ASSERT_TRUE(clock.AwaitWaiters(1, kWaitLimit));  // the watchdog waits for a new stream
  EXPECT_EQ(ended.calls, 1);
}

TEST(StreamWatchdogTest, ProgressStartsTheIdleClockAgain) {
  ManualClock clock;
  StreamWatchdog watchdog(&clock);
  Ended ended;
  const auto start = clock.Now();
  auto stream = std::make_shared<StreamDeadline>("download by worker 'w1'", milliseconds(100), std::chrono::hours(1),
                                                 "transfer timeout (transfer_timeout)", ended.Callback(), &clock);
  watchdog.Watch(stream);
  ASSERT_TRUE(clock.AwaitWaiters(1, kWaitLimit));
  clock.Advance(milliseconds(60));
  stream->Progress();
  clock.Advance(milliseconds(60));  // past the first look: the stream moved since
  ASSERT_TRUE(clock.AwaitWaiters(1, kWaitLimit));
  EXPECT_FALSE(ended.happened());
  EXPECT_EQ(clock.NextDeadline(), start + milliseconds(160));
  clock.Advance(milliseconds(40));
  ASSERT_TRUE(ended.Wait());
  EXPECT_NE(ended.why->message().find("nothing received or taken for 100 ms"), std::string::npos);
}

TEST(StreamWatchdogTest, AnIdleStreamThatIsAliveIsKeptAndEndsAtItsMaximumAge) {
  ManualClock clock;
  StreamWatchdog watchdog(&clock);
  Ended ended;
  auto stream = std::make_shared<StreamDeadline>("task channel of worker 'w1'", milliseconds(100), milliseconds(1000),
                                                 "maximum age (channel_max_age)", ended.Callback(), &clock);
  std::atomic<int> probes{0};
  stream->SetAliveProbe([&] {
    ++probes;
    return true;
  });
  watchdog.Watch(stream);
  for (int i = 0; i < 9; ++i) {
    ASSERT_TRUE(clock.AwaitWaiters(1, kWaitLimit));
    clock.Advance(milliseconds(100));
  }
  ASSERT_TRUE(clock.AwaitWaiters(1, kWaitLimit));
  EXPECT_FALSE(ended.happened());
  EXPECT_EQ(probes.load(), 9);
  clock.Advance(milliseconds(100));
  ASSERT_TRUE(ended.Wait());
  EXPECT_EQ(ended.why->message(), "task channel of worker 'w1': open longer than its maximum age (channel_max_age) of 1000 ms");
}

TEST(StreamWatchdogTest, AStreamEndsAtItsCapWithTheReason) {
  ManualClock clock;
  auto stream = std::make_shared<StreamDeadline>("upload from worker 'w1'", std::chrono::hours(1),
                                                 std::chrono::hours(2), "transfer timeout (transfer_timeout)",
                                                 [](const Status&) {}, &clock);
  stream->Cap(clock.Now() + milliseconds(10), "job job-1-abc round 1 attempt 1 reached its deadline");
  EXPECT_FALSE(stream->Expired().has_value());
  clock.Advance(milliseconds(10));
  EXPECT_EQ(stream->Expired()->message(), "upload from worker 'w1': job job-1-abc round 1 attempt 1 reached its deadline");
}

TEST(StreamWatchdogTest, AStreamDueBeforeTheWatchdogWakesWakesItAndOneDueLaterWaits) {
  ManualClock clock;
  StreamWatchdog watchdog(&clock);
  const auto start = clock.Now();
  auto stream = [&](milliseconds idle, Ended* ended) {
    return std::make_shared<StreamDeadline>("download", idle, std::chrono::hours(1), "transfer timeout",
                                            ended->Callback(), &clock);
  };
  // The thread's next wake-up, once it has gone back to sleep for `want`.
  auto sleeps_until = [&](Clock::TimePoint want) {
    const auto limit = std::chrono::steady_clock::now() + kWaitLimit;
    while (std::chrono::steady_clock::now() < limit) {
      if (clock.AwaitWaiters(1, kWaitLimit) && clock.NextDeadline() == want) return true;
      std::this_thread::sleep_for(milliseconds(1));
    }
    return false;
  };
  Ended first, later, sooner;
  auto a = stream(milliseconds(1000), &first);
  watchdog.Watch(a);
  ASSERT_TRUE(sleeps_until(start + milliseconds(1000)));
  auto b = stream(milliseconds(5000), &later);  // due after the wake-up: it waits for it
  watchdog.Watch(b);
  ASSERT_TRUE(sleeps_until(start + milliseconds(1000)));
  auto c = stream(milliseconds(100), &sooner);  // due before it: the thread wakes to sleep less
  watchdog.Watch(c);
  ASSERT_TRUE(sleeps_until(start + milliseconds(100)));
  clock.Advance(milliseconds(100));
  ASSERT_TRUE(sooner.Wait());
  EXPECT_FALSE(first.happened());
  clock.Advance(milliseconds(900));
  ASSERT_TRUE(first.Wait());
  EXPECT_FALSE(later.happened());
  clock.Advance(milliseconds(4000));
  ASSERT_TRUE(later.Wait());
}

TEST(StreamWatchdogTest, EntriesOfStreamsThatAreGoneAreSweptLongBeforeTheyComeDue) {
  ManualClock clock;
  StreamWatchdog watchdog(&clock);
  auto kept = StreamDeadline::Create("download kept", std::chrono::hours(1), std::chrono::hours(2), "transfer timeout",
                                     [](const Status&) {}, &clock);
  watchdog.Watch(kept);
  // Five thousand transfers that end (their reactors drop their deadlines) within the idle limit.
  std::weak_ptr<StreamDeadline> last;
  for (int i = 0; i < 5000; ++i) {
    auto stream = StreamDeadline::Create("upload " + std::to_string(i), std::chrono::hours(1), std::chrono::hours(2),
                                         "transfer timeout", [](const Status&) {}, &clock);
    watchdog.Watch(stream);
    last = stream;
  }
  EXPECT_TRUE(last.expired());  // the watchdog holds no stream alive
  EXPECT_LE(watchdog.entries(), 1024u);  // not 5,001: the gone ones were swept as entries doubled
  EXPECT_GE(watchdog.entries(), 1u);     // the live one is kept
  Ended ended;
  auto soon = StreamDeadline::Create("download soon", milliseconds(10), std::chrono::hours(2), "transfer timeout",
                                     ended.Callback(), &clock);
  watchdog.Watch(soon);
  ASSERT_TRUE(clock.AwaitWaiters(1, kWaitLimit));
  clock.Advance(milliseconds(10));
  ASSERT_TRUE(ended.Wait());  // the watchdog still ends what is due
  EXPECT_FALSE(kept->Expired().has_value());
}

TEST(StreamWatchdogTest, AHeldStreamIsNotEndedByTheWatchdog) {
  auto stream = std::make_shared<StreamDeadline>("upload", milliseconds(100), std::chrono::hours(1),
                                                 "transfer timeout", [](const Status&) { FAIL() << "expired"; });
  ASSERT_TRUE(stream->Hold());
  EXPECT_TRUE(stream->ClaimFinish());
  EXPECT_FALSE(stream->Hold());  // claimed: nothing to hold
}

TEST(StreamWatchdogTest, AStreamOnAnotherClockIsRefused) {
  ManualClock clock;
  StreamWatchdog watchdog(&clock);
  auto stream = std::make_shared<StreamDeadline>("upload", milliseconds(100), std::chrono::hours(1), "transfer timeout",
                                                 [](const Status&) {});
  EXPECT_THROW(watchdog.Watch(stream), std::invalid_argument);
}

}  // namespace
}  // namespace tessera::server
