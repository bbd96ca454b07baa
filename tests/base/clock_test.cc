// The clock seam: ManualClock stands still until advanced, and a wait on it ends when its
// condition is notified or when Advance() reaches its deadline, without polling or sleeping
// real time; the steady clock's wait is the condition variable's own.
#include "base/clock.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>

namespace tessera {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kWaitLimit{60000};  // reached only when a test fails

TEST(ManualClockTest, StandsStillUntilAdvanced) {
  ManualClock clock;
  const auto start = clock.Now();
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(milliseconds(1500));
  EXPECT_EQ(clock.Now() - start, milliseconds(1500));
  clock.Advance(milliseconds(-5));  // time does not go back
  EXPECT_EQ(clock.Now() - start, milliseconds(1500));
}

TEST(ManualClockTest, AWaitEndsWhenAdvancePassesItsDeadlineAndNotBefore) {
  ManualClock clock;
  std::mutex mu;
  std::condition_variable cv;
  const auto deadline = clock.Now() + milliseconds(100);
  auto waited = std::async(std::launch::async, [&] {
    std::unique_lock<std::mutex> lock(mu);
    return clock.WaitUntil(lock, cv, deadline, [] { return false; });
  });
  ASSERT_TRUE(clock.AwaitWaiters(1, kWaitLimit));
  EXPECT_EQ(clock.NextDeadline(), deadline);
  clock.Advance(milliseconds(99));
  ASSERT_TRUE(clock.AwaitWaiters(1, kWaitLimit)) << "woken one millisecond early";
  clock.Advance(milliseconds(1));
  // Whether or not the waiter has woken yet, it is no longer asleep until a deadline ahead.
  EXPECT_EQ(clock.waiters(), 0u);
  EXPECT_EQ(clock.NextDeadline(), std::nullopt);
  ASSERT_EQ(waited.wait_for(kWaitLimit), std::future_status::ready);
  EXPECT_FALSE(waited.get());
}

TEST(ManualClockTest, AWaitEndsWhenItsConditionIsNotifiedWhateverTheTime) {
  ManualClock clock;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  auto waited = std::async(std::launch::async, [&] {
    std::unique_lock<std::mutex> lock(mu);
    return clock.WaitUntil(lock, cv, Clock::TimePoint::max(), [&] { return done; });
  });
  // A wait without a deadline is not counted as asleep until a deadline: look at the
  // condition instead.
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  ASSERT_EQ(waited.wait_for(kWaitLimit), std::future_status::ready);
  EXPECT_TRUE(waited.get());
}

TEST(ManualClockTest, ManyWaitersOnOneMutexAllWakeAtTheirDeadlines) {
  ManualClock clock;
  std::mutex mu;
  std::condition_variable cv;
  const auto start = clock.Now();
  std::vector<std::future<bool>> waits;
  for (int i = 1; i <= 4; ++i) {
    waits.push_back(std::async(std::launch::async, [&, i] {
      std::unique_lock<std::mutex> lock(mu);
      return clock.WaitUntil(lock, cv, start + milliseconds(10 * i), [] { return false; });
    }));
  }
  ASSERT_TRUE(clock.AwaitWaiters(4, kWaitLimit));
  EXPECT_EQ(clock.NextDeadline(), start + milliseconds(10));
  clock.Advance(milliseconds(25));  // the first two deadlines pass
  ASSERT_TRUE(clock.AwaitWaiters(2, kWaitLimit));
  EXPECT_EQ(clock.NextDeadline(), start + milliseconds(30));
  EXPECT_EQ(waits[0].wait_for(kWaitLimit), std::future_status::ready);
  EXPECT_EQ(waits[1].wait_for(kWaitLimit), std::future_status::ready);
  clock.Advance(milliseconds(100));
  for (auto& wait : waits) {
    ASSERT_EQ(wait.wait_for(kWaitLimit), std::future_status::ready);
    EXPECT_FALSE(wait.get());
  }
}

// Many advances racing waits that come and go: no wake-up is lost (every wait ends), and no
// advance touches a waiter that has left (the sanitizer builds would say).
TEST(ManualClockTest, AdvancesRacingShortWaitsLoseNoWakeUp) {
  ManualClock clock;
  std::atomic<bool> stop{false};
  std::thread advancer([&] {
    while (!stop.load()) clock.Advance(milliseconds(1));
  });
  for (int i = 0; i < 2000; ++i) {
    std::mutex mu;  // a new mutex and condition each time, gone when the wait returns
    std::condition_variable cv;
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_FALSE(clock.WaitUntil(lock, cv, clock.Now() + milliseconds(2), [] { return false; }));
  }
  stop = true;
  advancer.join();
}

TEST(SteadyClockTest, AWaitReturnsTheConditionAtOnceWhenItHolds) {
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  EXPECT_TRUE(SteadyClock().WaitUntil(lock, cv, SteadyClock().Now() + std::chrono::hours(1), [] { return true; }));
  EXPECT_TRUE(SteadyClock().WaitUntil(lock, cv, Clock::TimePoint::max(), [] { return true; }));
  EXPECT_FALSE(SteadyClock().WaitUntil(lock, cv, SteadyClock().Now(), [] { return false; }));
}

}  // namespace
}  // namespace tessera
