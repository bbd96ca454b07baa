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

#include "server/workers/rendezvous_store.h"

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
  store.Open("rendezvous/j/1/1/");
  Answer answer;
  store.GetAsync("rendezvous/j/1/1/c/addr0", std::chrono::seconds(10), answer.Callback());
  {
    std::lock_guard<std::mutex> lock(answer.mu);
    EXPECT_FALSE(answer.value.has_value());
  }
  ASSERT_TRUE(store.Set("rendezvous/j/1/1/c/addr0", "127.0.0.1:4000").ok());
  ASSERT_TRUE(answer.Wait());
  ASSERT_TRUE(answer.value->ok()) << answer.value->status().ToString();
  EXPECT_EQ(**answer.value, "127.0.0.1:4000");
  EXPECT_EQ(answer.calls, 1);
}

TEST(RendezvousStoreTest, ACancelledWaitIsNeverAnsweredAndACancelAfterTheAnswerChangesNothing) {
  RendezvousStore store;
  store.Open("rendezvous/j/1/1/");
  Answer cancelled, answered;
  const uint64_t first = store.GetAsync("rendezvous/j/1/1/c/k", std::chrono::seconds(600), cancelled.Callback());
  const uint64_t second = store.GetAsync("rendezvous/j/1/1/c/k", std::chrono::seconds(600), answered.Callback());
  ASSERT_NE(first, 0u);
  ASSERT_NE(second, 0u);
  EXPECT_NE(first, second);
  EXPECT_TRUE(store.CancelGet("rendezvous/j/1/1/c/k", first));
  EXPECT_FALSE(store.CancelGet("rendezvous/j/1/1/c/k", first)) << "cancelled twice";
  ASSERT_TRUE(store.Set("rendezvous/j/1/1/c/k", "v").ok());
  ASSERT_TRUE(answered.Wait());
  EXPECT_EQ(**answered.value, "v");
  EXPECT_FALSE(store.CancelGet("rendezvous/j/1/1/c/k", second)) << "its answer was given";
  std::lock_guard<std::mutex> lock(cancelled.mu);
  EXPECT_EQ(cancelled.calls, 0);
  // A key already set answers at once, with no wait to cancel.
  EXPECT_EQ(store.GetAsync("rendezvous/j/1/1/c/k", std::chrono::seconds(1), Answer().Callback()), 0u);
}

// A wait for a key of a round that closes can never be answered (no write under its prefix
// is admitted any more): it used to hold its caller, and a StoreGet stream slot, until its
// own deadline. Clearing the round's prefix ends it at once; a wait under another round's
// prefix is left alone.
TEST(RendezvousStoreTest, ClearingARoundsPrefixEndsTheWaitsForItsKeys) {
  RendezvousStore store;
  store.Open("rendezvous/j/1/1/");
  store.Open("rendezvous/j/2/1/");
  Answer closed, other;
  ASSERT_NE(store.GetAsync("rendezvous/j/1/1/c/k", std::chrono::seconds(600), closed.Callback()), 0u);
  ASSERT_NE(store.GetAsync("rendezvous/j/2/1/c/k", std::chrono::seconds(600), other.Callback()), 0u);
  store.ClearPrefix("rendezvous/j/1/1/");
  ASSERT_TRUE(closed.Wait());
  ASSERT_FALSE(closed.value->ok());
  EXPECT_EQ(closed.value->status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(closed.value->status().message(),
            "rendezvous key 'rendezvous/j/1/1/c/k' will not be set: its round has closed");
  {
    std::lock_guard<std::mutex> lock(other.mu);
    EXPECT_FALSE(other.value.has_value()) << "a wait of a round still open ended";
  }
  ASSERT_TRUE(store.Set("rendezvous/j/2/1/c/k", "v").ok());
  ASSERT_TRUE(other.Wait());
  EXPECT_EQ(**other.value, "v");
  EXPECT_EQ(closed.calls, 1);
}

TEST(RendezvousStoreTest, AKeyAlreadySetAnswersAtOnce) {
  RendezvousStore store;
  store.Open("rendezvous/j/1/1/c/");
  ASSERT_TRUE(store.Set("rendezvous/j/1/1/c/k", "v").ok());
  Answer answer;
  store.GetAsync("rendezvous/j/1/1/c/k", std::chrono::milliseconds(0), answer.Callback());
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
  store.Open("rendezvous/j/1/1/");
  const std::string at = "rendezvous/j/1/1/c/";
  Answer answer;
  store.GetAsync(at + "n", std::chrono::seconds(10), answer.Callback());
  ASSERT_EQ(*store.Add(at + "n", 2), 2);
  ASSERT_TRUE(answer.Wait());
  EXPECT_EQ(**answer.value, "2");
  EXPECT_EQ(*store.Add(at + "n", 3), 5);
  ASSERT_TRUE(store.Set(at + "text", "not a number").ok());
  auto refused = store.Add(at + "text", 1);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(store.Set(at + "big", std::to_string(std::numeric_limits<int64_t>::max())).ok());
  EXPECT_EQ(store.Add(at + "big", 1).status().code(), StatusCode::kInvalidArgument);
}

TEST(RendezvousStoreTest, KeysAndValuesLargerThanTheirLimitsAreRefused) {
  RendezvousStore store;
  store.Open("rendezvous/j/1/1/");
  Status s = store.Set("rendezvous/j/1/1/c/" + std::string(513 - 19, 'k'), "v");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("of 513 bytes: the limit (max_key_bytes) is 512"), std::string::npos) << s.message();
  s = store.Set("rendezvous/j/1/1/c/x", std::string((64 << 10) + 1, 'v'));
  EXPECT_EQ(s.message(), "rendezvous value of 65537 bytes for key 'rendezvous/j/1/1/c/x': the limit (max_value_bytes) is 65536");
  EXPECT_EQ(store.size(), 0u);
}

TEST(RendezvousStoreTest, ACohortsRoundPrefixHasAQuotaOfKeysAndBytesAndSoDoesTheStore) {
  RendezvousLimits limits;
  limits.max_keys_per_prefix = 3;
  limits.max_bytes_per_prefix = 1000;
  limits.max_keys = 5;
  limits.max_value_bytes = 600;
  RendezvousStore store(limits);
  store.Open("rendezvous/j/1/1/");
  EXPECT_EQ(RendezvousStore::PrefixOf("rendezvous/j/1/1/c/rank0/addr"), "rendezvous/j/1/1/c/");
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store.Set("rendezvous/j/1/1/a/" + std::to_string(i), "v").ok());
  Status s = store.Set("rendezvous/j/1/1/a/3", "v");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "rendezvous key 'rendezvous/j/1/1/a/3' refused: the prefix 'rendezvous/j/1/1/a/' would hold "
                         "4 keys, the limit (max_keys_per_prefix) is 3");
  // Replacing a value is no new key; a counter counts too.
  EXPECT_TRUE(store.Set("rendezvous/j/1/1/a/0", "w").ok());
  EXPECT_EQ(store.Add("rendezvous/j/1/1/a/9", 1).status().code(), StatusCode::kResourceExhausted);
  // Bytes: key plus value.
  ASSERT_TRUE(store.Set("rendezvous/j/1/1/b/0", std::string(500, 'x')).ok());
  s = store.Set("rendezvous/j/1/1/b/1", std::string(500, 'x'));
  EXPECT_EQ(s.message(), "rendezvous key 'rendezvous/j/1/1/b/1' refused: the prefix 'rendezvous/j/1/1/b/' would hold "
                         "1040 bytes, the limit (max_bytes_per_prefix) is 1000");
  ASSERT_TRUE(store.Set("rendezvous/j/1/1/c/0", "v").ok());
  s = store.Set("rendezvous/j/1/1/d/0", "v");
  EXPECT_EQ(s.message(), "rendezvous key 'rendezvous/j/1/1/d/0' refused: the store would hold 6 keys, the limit "
                         "(max_keys) is 5");
  // What a closed round held is given back.
  store.ClearPrefix("rendezvous/j/1/1/a/");
  EXPECT_EQ(store.size(), 2u);
  EXPECT_TRUE(store.Set("rendezvous/j/1/1/a/3", "v").ok());
  store.ClearPrefix("rendezvous/j/");
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.bytes(), 0u);
}

// A write admitted while its round was open (the coordinator checks the caller first) can
// arrive after the round closed and its keys were dropped: it used to land then, and stay,
// counted against the store's quota, until the job ended. Clearing a prefix closes it with
// its keys, in one step, and a write under no open prefix is refused, changing nothing.
TEST(RendezvousStoreTest, AKeyWrittenAfterItsRoundClosedIsRefused) {
  RendezvousStore store;
  store.Open("rendezvous/j/1/1/");
  store.Open("rendezvous/j/7/1/c/");  // an asynchronous task's cohort
  ASSERT_TRUE(store.Set("rendezvous/j/1/1/c/0", "v").ok());
  ASSERT_TRUE(store.Set("rendezvous/j/7/1/c/0", "v").ok());
  store.ClearPrefix("rendezvous/j/1/1/");
  Status s = store.Set("rendezvous/j/1/1/c/1", "v");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "rendezvous key 'rendezvous/j/1/1/c/1' refused: no round in progress holds it (its round "
                         "has closed)");
  EXPECT_EQ(store.Add("rendezvous/j/1/1/c/n", 1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Set("rendezvous/j/2/1/c/0", "v").code(), StatusCode::kFailedPrecondition);  // never opened
  EXPECT_EQ(store.Set("rendezvous/j/7/1/d/0", "v").code(), StatusCode::kFailedPrecondition);  // another cohort's
  EXPECT_EQ(store.size(), 1u);
  ASSERT_TRUE(store.Set("rendezvous/j/7/1/c/1", "v").ok());  // the other round is still open
  store.ClearPrefix("rendezvous/j/");  // the job ends
  EXPECT_EQ(store.Set("rendezvous/j/7/1/c/2", "v").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.bytes(), 0u);
}

}  // namespace
}  // namespace tessera::server
