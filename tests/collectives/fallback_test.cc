// FallbackCommunicator's own guarantees: its waits end at the call's deadline, naming the
// call, the peer and the deadline.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <regex>
#include <thread>

#include "test_backends.h"

namespace tessera::collectives::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Generous: only keeps a test that fails from hanging; nothing asserts how long a call took.
constexpr auto kBound = seconds(20);

bool Mentions(const Status& status, const std::string& text) {
  return status.message().find(text) != std::string::npos;
}

// "... before the call's deadline, 1000 ms after it began ...": the deadline, in the unit
// the options give it in (the exact figure depends on when the call began).
bool NamesTheDeadline(const Status& status) {
  return std::regex_search(status.message(),
                           std::regex("before the call's deadline, [0-9]+ ms after it began"));
}

// Ranks 0 and 1 of `backend`; rank 1 creates its communicator and then never calls, so it
// never sends what rank 0's allreduce waits for.
class WithheldSendTest : public ::testing::TestWithParam<std::string> {};

TEST_P(WithheldSendTest, TheReceiveEndsAtTheDeadlineNamingTheCallThePeerAndTheDeadline) {
  World world(2, RankMode::kThreads);
  std::atomic<bool> done{false};
  Status seen;
  auto results = RunRanks(2, RankMode::kThreads, [&](int rank) -> Status {
    ASSIGN_OR_RETURN(auto c, world.Create(GetParam(), rank, 30000));
    if (rank == 1) {
      while (!done) std::this_thread::sleep_for(milliseconds(10));
      return Status::Ok();
    }
    std::vector<int32_t> data(100, 1);
    seen = c->Allreduce(data.data(), data.data(), data.size(), DataType::kInt32, ReduceOp::kSum,
                        CallOptions{milliseconds(300)});
    done = true;
    return Status::Ok();
  });
  ASSERT_TRUE(results[0].ok()) << results[0].ToString();
  EXPECT_EQ(seen.code(), StatusCode::kDeadlineExceeded) << seen.ToString();
  EXPECT_TRUE(Mentions(seen, "rank 0: timed out waiting for rank 1 to send allreduce #0 (count 100, "
                             "int32, sum"))
      << seen.ToString();
  EXPECT_TRUE(NamesTheDeadline(seen)) << seen.ToString();
}

INSTANTIATE_TEST_SUITE_P(Backends, WithheldSendTest,
                         ::testing::Values("sendrecv-local", "sendrecv-p2p"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

// Opened once; Wait returns when it is.
class Gate {
 public:
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }
  bool is_open() {
    std::lock_guard<std::mutex> lock(mutex_);
    return open_;
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    opened_.wait(lock, [&] { return open_; });
  }
  // False when `timeout` passed first.
  bool WaitFor(std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return opened_.wait_for(lock, timeout, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

// A send/recv backend whose Send returns only once `gate` opens, whatever its deadline: a
// transport whose send to a peer that never receives overruns the deadline it was given.
class HeldSend final : public Communicator {
 public:
  HeldSend(std::unique_ptr<Communicator> base, Gate* gate)
      : Communicator(base->rank(), base->size(), base->default_timeout()),
        base_(std::move(base)),
        gate_(gate) {}
  std::string_view backend_name() const override { return "held-send"; }
  const CommunicatorCapabilities& capabilities() const override { return base_->capabilities(); }

 protected:
  Status DoSend(const void* buffer, size_t count, DataType type, int peer, int tag,
                Deadline deadline) override {
    gate_->Wait();
    return CallSend(*base_, buffer, count, type, peer, tag, deadline);
  }
  Status DoRecv(void* buffer, size_t count, DataType type, int peer, int tag,
                Deadline deadline) override {
    return CallRecv(*base_, buffer, count, type, peer, tag, deadline);
  }

 private:
  std::unique_ptr<Communicator> base_;
  Gate* gate_;
};

TEST(FallbackDeadlineTest, ASendTheBackendHoldsPastTheDeadlineIsAbandonedThere) {
  auto hub = std::make_shared<LocalHub>(2);  // rank 1 never comes: it never sends or receives
  Gate gate;
  std::thread watchdog([&] {
    if (!gate.WaitFor(kBound)) gate.Open();  // a call that waits for the send ends, failing
  });
  {
    FallbackCommunicator c(
        std::make_unique<HeldSend>(std::make_unique<LocalCommunicator>(hub, 0, seconds(30)), &gate),
        BufferLocation::kHost);
    int32_t data[4] = {1, 2, 3, 4};
    const Status status =
        c.Allreduce(data, data, 4, DataType::kInt32, ReduceOp::kSum, CallOptions{milliseconds(200)});
    EXPECT_FALSE(gate.is_open()) << "the call waited for the backend's send past its deadline";
    EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status.ToString();
    EXPECT_TRUE(Mentions(status, "rank 0: timed out waiting for rank 1 to send allreduce #0") &&
                Mentions(status, "the send to rank 1 had not returned either"))
        << status.ToString();
    EXPECT_TRUE(NamesTheDeadline(status)) << status.ToString();

    // The abandoned send is still in the backend: a later call fails at once with its error
    // instead of sending beside it (the held send would block that call too).
    const Status later = c.Barrier(CallOptions{milliseconds(200)});
    EXPECT_FALSE(gate.is_open());
    EXPECT_EQ(later.code(), StatusCode::kDeadlineExceeded) << later.ToString();
    EXPECT_TRUE(Mentions(later, "timed out waiting for rank 1 to take allreduce #0") &&
                Mentions(later, "held-send's send had not returned") && NamesTheDeadline(later))
        << later.ToString();
    gate.Open();
  }  // destroying the communicator waits for the released send
  watchdog.join();
}

}  // namespace
}  // namespace tessera::collectives::testing
