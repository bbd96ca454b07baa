// One deadline for a rendezvous that waits for several keys in turn (DeadlineStore, which
// Gloo's rendezvous goes through): each wait gets what is left of it, not a timeout of its own,
// and the key missing at the deadline is named with the time waited in all.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
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

}  // namespace
}  // namespace tessera::collectives
