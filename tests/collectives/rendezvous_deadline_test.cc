// One deadline for a rendezvous that waits for several keys in turn (DeadlineStore, which
// Gloo's rendezvous goes through): each wait gets what is left of it, not a timeout of its own,
// and the key missing at the deadline is named with the time waited in all.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/registry.h"
#include "collectives/store/hash_store.h"
#include "collectives/store/store.h"
#include "test_backends.h"

namespace tessera::collectives {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;

// A HashStore that records the timeout of every Get it is asked for.
class RecordingStore final : public Store {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    return base_.Set(key, value);
  }
  Result<std::string> Get(const std::string& key, milliseconds timeout) override {
    timeouts.push_back(timeout);
    return base_.Get(key, timeout);
  }
  Result<int64_t> Add(const std::string& key, int64_t delta) override {
    return base_.Add(key, delta);
  }
  std::vector<milliseconds> timeouts;

 private:
  HashStore base_;
};

TEST(DeadlineStoreTest, NoWaitOutlastsTheDeadlineWhateverItAsksFor) {
  RecordingStore base;
  DeadlineStore store(base, milliseconds(0), "test rendezvous");
  Status waited = store.Wait({"1", "2"}, hours(2));
  EXPECT_EQ(waited.code(), StatusCode::kDeadlineExceeded) << waited.ToString();
  auto got = store.Get("2", hours(2));
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded) << got.status().ToString();
  EXPECT_EQ(base.timeouts, (std::vector<milliseconds>{milliseconds(0), milliseconds(0)}));
}

TEST(DeadlineStoreTest, AKeyMissingAtTheDeadlineIsNamedWithTheTimeWaitedInAll) {
  RecordingStore base;
  ASSERT_TRUE(base.Set("0", "rank 0's address").ok());
  DeadlineStore store(base, milliseconds(300), "test rendezvous");
  ASSERT_TRUE(store.Wait({"0"}, hours(1)).ok());
  auto first = store.Get("1", hours(1));
  ASSERT_EQ(first.status().code(), StatusCode::kDeadlineExceeded) << first.status().ToString();
  EXPECT_NE(first.status().message().find("test rendezvous timed out waiting for key '1': waited "),
            std::string::npos)
      << first.status().ToString();
  EXPECT_NE(first.status().message().find(" ms in all, for a deadline of 300 ms (store key '1' "
                                          "not set within "),
            std::string::npos)
      << first.status().ToString();
  // The deadline has passed: the next key gets no time of its own.
  Status second = store.Wait({"2"}, hours(1));
  EXPECT_EQ(second.code(), StatusCode::kDeadlineExceeded) << second.ToString();
  EXPECT_NE(second.message().find("waiting for key '2'"), std::string::npos) << second.ToString();
  EXPECT_EQ(base.timeouts.back(), milliseconds(0));
}

TEST(DeadlineStoreTest, AShorterWaitOfItsOwnEndsWithTheStoresOwnError) {
  HashStore base;
  DeadlineStore store(base, hours(1), "test rendezvous");
  auto got = store.Get("absent", milliseconds(0));
  ASSERT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(got.status().message(), "store key 'absent' not set within 0 ms");
  ASSERT_TRUE(base.Set("present", "value").ok());
  auto present = store.Get("present", hours(1));
  ASSERT_TRUE(present.ok()) << present.status().ToString();
  EXPECT_EQ(*present, "value");
}

// Gloo's rendezvous, three ranks of which only rank 0 comes: it ends at the one deadline,
// naming the peer's key it was waiting for.
TEST(GlooRendezvousTest, AMissingPeerIsNamedWithTheTimeWaitedInAll) {
  if (const std::string reason = testing::SkipReason("gloo"); !reason.empty()) {
    GTEST_SKIP() << reason;
  }
  CommunicatorOptions options;
  options.backend = "gloo";
  options.rank = 0;
  options.size = 3;
  options.prefix = "lonely";
  options.timeout_ms = 400;
  auto created = CreateCommunicator(options, std::make_shared<HashStore>());
  ASSERT_FALSE(created.ok());
  const Status& failed = created.status();
  EXPECT_EQ(failed.code(), StatusCode::kDeadlineExceeded) << failed.ToString();
  EXPECT_NE(failed.message().find("gloo rank 0 rendezvous failed: gloo rendezvous timed out "
                                  "waiting for key '"),
            std::string::npos)
      << failed.ToString();
  EXPECT_NE(failed.message().find(" ms in all, for a deadline of "), std::string::npos)
      << failed.ToString();
}

// A rank's view of a shared store that stops answering once the rank has published `key`:
// its waits after that hold until the test lets them go, then fail. A Gloo rank behind it
// publishes its pairs' addresses and never connects any.
class SilentAfterPublishing final : public Store {
 public:
  SilentAfterPublishing(std::shared_ptr<Store> base, std::string key)
      : base_(std::move(base)), key_(std::move(key)) {}
  Status Set(const std::string& key, const std::string& value) override {
    RETURN_IF_ERROR(base_->Set(key, value));
    std::lock_guard<std::mutex> lock(mutex_);
    if (key == key_) published_ = true;
    return Status::Ok();
  }
  Result<std::string> Get(const std::string& key, milliseconds timeout) override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (published_) {
        changed_.wait(lock, [&] { return released_; });
        return UnavailableError("the test's peer stopped here");
      }
    }
    return base_->Get(key, timeout);
  }
  Result<int64_t> Add(const std::string& key, int64_t delta) override { return base_->Add(key, delta); }
  void Release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released_ = true;
    changed_.notify_all();
  }

 private:
  std::shared_ptr<Store> base_;
  const std::string key_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool published_ = false;  // guarded by mutex_
  bool released_ = false;   // guarded by mutex_
};

// Gloo's rendezvous, with a peer that publishes its address and never connects: once the keys
// are in, the pairs' own connection is bounded by the same one deadline (Gloo's would wait
// five times the whole timeout for each such pair), and the rank that did not connect is
// named. Rank 1 listens on 127.0.0.2 so that rank 0's pair is the side that waits to be
// connected to (Gloo has the lower address wait).
TEST(GlooRendezvousTest, APeerThatNeverConnectsIsNamedAtTheDeadline) {
  if (const std::string reason = testing::SkipReason("gloo"); !reason.empty()) {
    GTEST_SKIP() << reason;
  }
  auto shared = std::make_shared<HashStore>();
  CommunicatorOptions options;
  options.backend = "gloo";
  options.size = 2;
  options.prefix = "silent";
  auto silent = std::make_shared<SilentAfterPublishing>(shared, "silent/gloo/1");
  std::thread peer([&, options]() mutable {
    options.rank = 1;
    options.bind_address = "127.0.0.2";
    options.timeout_ms = 600000;
    (void)CreateCommunicator(options, silent);
  });
  options.rank = 0;
  options.bind_address = "127.0.0.1";
  options.timeout_ms = 2000;
  const auto start = std::chrono::steady_clock::now();
  auto created = CreateCommunicator(options, shared);
  const auto took = std::chrono::steady_clock::now() - start;
  silent->Release();
  peer.join();
  ASSERT_FALSE(created.ok());
  const Status& failed = created.status();
  EXPECT_EQ(failed.code(), StatusCode::kDeadlineExceeded) << failed.ToString();
  EXPECT_NE(failed.message().find("gloo rank 0 rendezvous failed: rank 1 did not connect within "
                                  "the rendezvous deadline of "),
            std::string::npos)
      << failed.ToString();
  EXPECT_LT(took, std::chrono::seconds(60)) << failed.ToString();
}

}  // namespace
}  // namespace tessera::collectives
