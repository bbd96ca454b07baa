// The coordinator's rendezvous store: waiting for a key with and without a thread, its
// deadline, shutdown, and counters that refuse what is not a counter.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "server/rendezvous_store.h"

namespace tessera::server {
namespace {

// Collects one asynchronous answer.
struct Answer {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Result<std::string>> value;
  int calls = 0;
  RendezvousStore::GetCallback Callback() {
    return [this](Result<std::string> r) {
      std::lock_guard<std::mutex> lock(mu);
      value = std::move(r);
      ++calls;
      cv.notify_all();
    };
  }
  bool Wait() {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return value.has_value(); });
  }
};

TEST(RendezvousStoreTest, AnAsynchronousGetIsAnsweredBySetWithoutAThreadOfItsOwn) {
  RendezvousStore store;
  Answer answer;
  store.GetAsync("rendezvous/j/1/1/c/addr0", std::chrono::seconds(10), answer.Callback());
  {
    std::lock_guard<std::mutex> lock(answer.mu);
    EXPECT_FALSE(answer.value.has_value());
  }
  store.Set("rendezvous/j/1/1/c/addr0", "127.0.0.1:4000");
  ASSERT_TRUE(answer.Wait());
  ASSERT_TRUE(answer.value->ok()) << answer.value->status().ToString();
  EXPECT_EQ(**answer.value, "127.0.0.1:4000");
  EXPECT_EQ(answer.calls, 1);
}

TEST(RendezvousStoreTest, AKeyAlreadySetAnswersAtOnce) {
  RendezvousStore store;
  store.Set("k", "v");
  Answer answer;
  store.GetAsync("k", std::chrono::milliseconds(0), answer.Callback());
  ASSERT_TRUE(answer.Wait());
  EXPECT_EQ(**answer.value, "v");
}

TEST(RendezvousStoreTest, AnUnsetKeyExpiresWithItsName) {
  RendezvousStore store;
  Answer answer;
  store.GetAsync("rendezvous/j/1/1/c/missing", std::chrono::milliseconds(50), answer.Callback());
  ASSERT_TRUE(answer.Wait());
  ASSERT_FALSE(answer.value->ok());
  EXPECT_EQ(answer.value->status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(answer.value->status().message().find("rendezvous/j/1/1/c/missing"), std::string::npos);
}

TEST(RendezvousStoreTest, ShutdownAnswersEveryWaiter) {
  RendezvousStore store;
  Answer a, b;
  store.GetAsync("x", std::chrono::seconds(600), a.Callback());
  store.GetAsync("y", std::chrono::seconds(600), b.Callback());
  store.Shutdown();
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(b.Wait());
  EXPECT_EQ(a.value->status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(b.value->status().code(), StatusCode::kUnavailable);
}

TEST(RendezvousStoreTest, CountersAddAndRefuseWhatIsNotACounter) {
  RendezvousStore store;
  Answer answer;
  store.GetAsync("n", std::chrono::seconds(10), answer.Callback());
  ASSERT_EQ(*store.Add("n", 2), 2);
  ASSERT_TRUE(answer.Wait());
  EXPECT_EQ(**answer.value, "2");
  EXPECT_EQ(*store.Add("n", 3), 5);
  store.Set("text", "not a number");
  auto refused = store.Add("text", 1);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  store.Set("big", std::to_string(std::numeric_limits<int64_t>::max()));
  EXPECT_EQ(store.Add("big", 1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::server
