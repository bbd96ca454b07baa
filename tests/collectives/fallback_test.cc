// FallbackCommunicator's own guarantees: its waits end at the call's deadline, naming the
// call, the peer and the deadline; the scratch it adds is sized without overflow; its framing
// and VerifiedCommunicator's headers keep tags of their own. And the message header's
// description of a peer's header that no build of this layer would send.
#include <gtest/gtest.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <regex>
#include <thread>

#include "collectives/message.h"
#include "collectives/mpi/factory.h"
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

// Hides every op but reduce-scatter and allgather (sum): an allreduce pads its input.
class ReduceScatterAllgatherOnly final : public Communicator {
 public:
  explicit ReduceScatterAllgatherOnly(std::unique_ptr<Communicator> base)
      : Communicator(base->rank(), base->size(), base->default_timeout()), base_(std::move(base)) {
    capabilities_ = base_->capabilities();
    capabilities_.native_ops = {CollectiveOp::kReduceScatter, CollectiveOp::kAllgather};
    capabilities_.native_reduce_ops = {ReduceOp::kSum};
  }
  std::string_view backend_name() const override { return "reduce-scatter-allgather-only"; }
  const CommunicatorCapabilities& capabilities() const override { return capabilities_; }

 protected:
  Status DoReduceScatter(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                         Deadline deadline) override {
    return CallReduceScatter(*base_, send, recv, count, type, op, deadline);
  }
  Status DoAllgather(const void* send, void* recv, size_t count, DataType type,
                     Deadline deadline) override {
    return CallAllgather(*base_, send, recv, count, type, deadline);
  }

 private:
  std::unique_ptr<Communicator> base_;
  CommunicatorCapabilities capabilities_;
};

// Counts the caller's buffers could hold (the call's own check passes) but whose scratch
// cannot be an object: refused by name before any byte is read, never an exception.
TEST(FallbackScratchTest, PaddingMoreThanAnObjectHoldsIsRefusedNamingTheRoute) {
  World world(1, RankMode::kThreads);
  auto base = world.Create("p2p", 0, 5000);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  FallbackCommunicator c(std::make_unique<ReduceScatterAllgatherOnly>(std::move(*base)),
                         BufferLocation::kHost);
  // The padded input plus this rank's block: on one rank, twice the count.
  float x = 0;
  const size_t count = size_t{PTRDIFF_MAX} / sizeof(float);
  const Status status = c.Allreduce(&x, &x, count, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
  EXPECT_TRUE(Mentions(status, "allreduce <- reduce_scatter + allgather needs scratch") &&
              Mentions(status, "more than an object can hold"))
      << status.ToString();
  EXPECT_TRUE(c.fallback_counts().empty());
}

TEST(FallbackScratchTest, AFloat16AverageWhoseFloat32CopyCannotBeAnObjectIsRefused) {
  World world(1, RankMode::kThreads);
  auto base = world.Create("p2p", 0, 5000);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  FallbackCommunicator c(std::make_unique<SumAllreduceOnly>(std::move(*base)),
                         BufferLocation::kHost);
  // Fits as float16, not widened to float32.
  uint16_t half = FloatToHalf(3.0f);
  const size_t count = size_t{PTRDIFF_MAX} / 2;
  const Status status = c.Allreduce(&half, &half, count, DataType::kFloat16, ReduceOp::kAvg);
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
  EXPECT_TRUE(Mentions(status, "allreduce(avg) float16 <- allreduce(avg) float32 needs scratch"))
      << status.ToString();
  // Still usable: the refusal moved nothing.
  ASSERT_TRUE(c.Allreduce(&half, &half, 1, DataType::kFloat16, ReduceOp::kAvg).ok());
  EXPECT_EQ(HalfToFloat(half), 3.0f);
}

TEST(TagTest, AWrapperTakesTheTopTagAndOffersTheRest) {
  CommunicatorCapabilities base;
  int reserved = 0;
  EXPECT_EQ(ReserveTopTag(base, &reserved).max_tag, INT_MAX - 1);
  EXPECT_EQ(reserved, INT_MAX);
  // On MPI with only the standard's 32767: the fallback's framing, then the call checks'
  // headers, both within MPI_TAG_UB.
  base.max_tag = 32767;
  int framing = 0, headers = 0;
  const CommunicatorCapabilities framed = ReserveTopTag(base, &framing);
  const CommunicatorCapabilities verified = ReserveTopTag(framed, &headers);
  EXPECT_EQ(framing, 32767);
  EXPECT_EQ(headers, 32766);
  EXPECT_EQ(verified.max_tag, 32765);
  EXPECT_TRUE(Mentions(InvalidArgumentError(verified.ToString()), "max_tag=32765"));
  base.max_tag = 0;  // nothing left for callers: every tag of theirs is refused
  EXPECT_EQ(ReserveTopTag(base, &reserved).max_tag, -1);
  EXPECT_EQ(reserved, 0);
}

TEST(TagTest, MpisBoundIsItsTagUpperBoundAndNeverBelowTheStandardsMinimum) {
  EXPECT_EQ(*MpiMaxTag(true, INT_MAX), INT_MAX);
  EXPECT_EQ(*MpiMaxTag(true, 8388607), 8388607);  // 2^23 - 1, as some transports have
  EXPECT_EQ(*MpiMaxTag(true, 32767), 32767);
  EXPECT_EQ(*MpiMaxTag(false, 0), 32767);
  const Result<int> low = MpiMaxTag(true, 4095);
  ASSERT_FALSE(low.ok());
  EXPECT_EQ(low.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Mentions(low.status(), "MPI_TAG_UB is 4095") && Mentions(low.status(), "32767"))
      << low.status().ToString();
}

// The fallback's framing takes the backend's top tag; verified-local's headers the one below.
// A caller's tag at or above them is refused naming the tag and the bound, before any traffic;
// the tags below still travel.
TEST(TagTest, TheLayersOwnTagsAreRefusedToCallersNamingTheTagAndTheBound) {
  for (const std::string backend : {"sendrecv-local", "verified-local"}) {
    const int bound = backend == "sendrecv-local" ? INT_MAX - 1 : INT_MAX - 2;
    World world(2, RankMode::kThreads);
    std::vector<Status> refused(2);
    auto results = RunRanks(2, RankMode::kThreads, [&](int rank) -> Status {
      ASSIGN_OR_RETURN(auto c, world.Create(backend, rank, 10000));
      int32_t value = rank == 0 ? 42 : 0;
      if (rank == 0) {
        refused[0] = c->Send(&value, 1, DataType::kInt32, 1, INT_MAX);
        RETURN_IF_ERROR(c->Send(&value, 1, DataType::kInt32, 1, bound));
        return Status::Ok();
      }
      refused[1] = c->Recv(&value, 1, DataType::kInt32, 0, bound + 1);
      RETURN_IF_ERROR(c->Recv(&value, 1, DataType::kInt32, 0, bound));
      if (value != 42) return InternalError("received " + std::to_string(value));
      return Status::Ok();
    });
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(results[rank].ok()) << backend << " rank " << rank << ": " << results[rank].ToString();
      EXPECT_EQ(refused[rank].code(), StatusCode::kInvalidArgument) << refused[rank].ToString();
      const std::string tag = std::to_string(rank == 0 ? INT_MAX : bound + 1);
      EXPECT_TRUE(Mentions(refused[rank], "tag " + tag + " is out of range [0, " +
                                              std::to_string(bound) + "]"))
          << backend << ": " << refused[rank].ToString();
    }
  }
}

MessageHeader Header(uint8_t op, uint8_t dtype, uint8_t reduce_op) {
  MessageHeader header = MakeHeader(CollectiveOp::kAllreduce, DataType::kInt32, ReduceOp::kSum,
                                    -1, 3, 10, 40);
  header.op = op;
  header.dtype = dtype;
  header.reduce_op = reduce_op;
  return header;
}

// A peer's header is described by what came, never by a name the value does not have.
TEST(MessageHeaderTest, AFieldOutsideItsEnumIsDescribedByItsNumber) {
  EXPECT_EQ(DescribeHeader(Header(0, 2, 3)),
            "allreduce #3 (count 10, int64, min, 40-byte message)");
  EXPECT_EQ(DescribeHeader(Header(0, 200, 77)),
            "allreduce #3 (count 10, dtype 200, reduce op 77, 40-byte message)");
  EXPECT_EQ(DescribeHeader(Header(99, 4, 0)), "op 99 #3 (count 10, float32, 40-byte message)");
  MessageHeader corrupt = Header(0, 4, 0);
  corrupt.magic = 0xdeadbeef;
  EXPECT_EQ(DescribeHeader(corrupt),
            "a message with a corrupt header (magic 0xdeadbeef, expected 0x4d435354)");
  const Status mismatch = CheckHeader(Header(0, 4, 0), Header(0, 250, 0), 1, 0);
  EXPECT_EQ(mismatch.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Mentions(mismatch, "rank 0 sent allreduce #3 (count 10, dtype 250, sum"))
      << mismatch.ToString();
}

}  // namespace
}  // namespace tessera::collectives::testing
