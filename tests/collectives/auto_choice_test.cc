// "auto" in a cohort whose members would choose differently on their own: every rank takes
// rank 0's choice, or fails at once saying why it cannot.
//
// Ranks run as forked processes, each registering a test backend in its own registry, so the
// registry of this process (and the other tests in it) keeps only the built-in backends.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "collectives/registry.h"
#include "collectives/store/hash_store.h"
#include "test_backends.h"

namespace tessera::collectives {
namespace {

// A backend ahead of all others that is viable on one rank only, as one built with a library
// the other members lack. Its rendezvous waits for a key nobody sets: no other rank joins it.
class OneRankBackend final : public CommunicatorBackend {
 public:
  explicit OneRankBackend(int viable_rank) : viable_rank_(viable_rank) {}
  std::string_view name() const override { return "eager"; }
  int priority() const override { return 1000; }
  Status Viable(const CommunicatorOptions& options) const override {
    if (options.rank == viable_rank_) return Status::Ok();
    return FailedPreconditionError("built without eager on rank " + std::to_string(options.rank));
  }
  Result<std::unique_ptr<Communicator>> Create(const CommunicatorOptions& options,
                                               std::shared_ptr<Store> store) const override {
    auto never = store->Get("peers", std::chrono::milliseconds(options.timeout_ms));
    if (!never.ok()) return never.status();
    return InternalError("eager has no communicator");
  }

 private:
  int viable_rank_;
};

// The backend this process would choose for host buffers of two ranks, for messages.
std::string LocalHostChoice() {
  CommunicatorOptions options;
  options.size = 2;
  auto chosen = CommunicatorRegistry::Global().Choose(options);
  return chosen.ok() ? std::string((*chosen)->name()) : "none";
}

TEST(AutoChoiceTest, EveryRankUsesRankZerosChoiceWhenItPrefersAnother) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) GTEST_SKIP() << "running under mpirun";
  testing::World world(2, testing::RankMode::kProcesses);
  const std::string expected = LocalHostChoice();
  auto results = testing::RunRanks(2, testing::RankMode::kProcesses, [&](int rank) -> Status {
    // Rank 1 alone could use eager and would choose it.
    CommunicatorRegistry::Global().Register(std::make_unique<OneRankBackend>(1));
    ASSIGN_OR_RETURN(auto c, world.Create("auto", rank, 20000));
    if (c->backend_name() != expected) {
      return InternalError("rank " + std::to_string(rank) + " runs over " + std::string(c->backend_name()) +
                           ", expected " + expected);
    }
    double x = rank + 1;
    RETURN_IF_ERROR(c->Allreduce(&x, &x, 1, DataType::kFloat64, ReduceOp::kSum));
    if (x != 3) return InternalError("allreduce gave " + std::to_string(x));
    return Status::Ok();
  });
  for (int rank = 0; rank < 2; ++rank) EXPECT_TRUE(results[rank].ok()) << results[rank].ToString();
}

TEST(AutoChoiceTest, ARankThatCannotUseRankZerosChoiceFailsAtOnceNamingBothChoices) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) GTEST_SKIP() << "running under mpirun";
  testing::World world(2, testing::RankMode::kProcesses);
  const std::string local = LocalHostChoice();
  // Rank 0's rendezvous ends at this timeout; rank 1 must not wait for anything.
  auto results = testing::RunRanks(2, testing::RankMode::kProcesses, [&](int rank) -> Status {
    CommunicatorRegistry::Global().Register(std::make_unique<OneRankBackend>(0));
    auto c = world.Create("auto", rank, 3000);
    if (c.ok()) return InternalError("rank " + std::to_string(rank) + " created a communicator");
    return c.status();
  });
  const std::string refused = results[1].message();
  EXPECT_NE(refused.find("FAILED_PRECONDITION: rank 1 of 2: backend 'eager', which rank 0 chose for 'auto', "
                         "is not viable here (FAILED_PRECONDITION: built without eager on rank 1); 'auto' here "
                         "would choose '" + local + "'"),
            std::string::npos)
      << refused;
  const std::string leader = results[0].message();
  EXPECT_NE(leader.find("rank 0 chose 'eager' for 'auto' and another member refused it: rank 1 of 2: backend "),
            std::string::npos)
      << leader;
  EXPECT_NE(leader.find("DEADLINE_EXCEEDED"), std::string::npos) << leader;
}

TEST(AutoChoiceTest, AChoiceThisBuildDoesNotKnowIsRefusedEscapedAndLeftForRankZero) {
  auto store = std::make_shared<HashStore>();
  ASSERT_TRUE(store->Set("cohort/auto/backend", "carrier\npigeon").ok());
  CommunicatorOptions options;
  options.rank = 1;
  options.size = 2;
  options.prefix = "cohort";
  options.timeout_ms = 3000;
  auto created = CreateCommunicator(options, store);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), StatusCode::kFailedPrecondition) << created.status().ToString();
  EXPECT_NE(created.status().message().find("backend 'carrier\\npigeon', which rank 0 chose for 'auto', is not "
                                            "viable here (UNIMPLEMENTED: this build has no backend of that name)"),
            std::string::npos)
      << created.status().ToString();
  auto left = store->Get("cohort/auto/refused", std::chrono::milliseconds(0));
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_EQ(*left, created.status().message());
}

TEST(AutoChoiceTest, ANamedBackendNeedsNoChoiceFromRankZero) {
  auto store = std::make_shared<HashStore>();
  ASSERT_TRUE(store->Set("named/auto/backend", "carrier-pigeon").ok());
  auto results = testing::RunRanks(2, testing::RankMode::kThreads, [&](int rank) -> Status {
    CommunicatorOptions options;
    options.backend = "p2p";
    options.rank = rank;
    options.size = 2;
    options.prefix = "named";
    options.timeout_ms = 20000;
    ASSIGN_OR_RETURN(auto c, CreateCommunicator(options, store));
    return c->Barrier();
  });
  for (int rank = 0; rank < 2; ++rank) EXPECT_TRUE(results[rank].ok()) << results[rank].ToString();
}

TEST(AutoChoiceTest, ARankZeroThatNeverPublishesAChoiceIsNamedWithTheKey) {
  auto store = std::make_shared<HashStore>();
  CommunicatorOptions options;
  options.rank = 1;
  options.size = 2;
  options.prefix = "cohort";
  options.timeout_ms = 200;
  auto created = CreateCommunicator(options, store);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), StatusCode::kDeadlineExceeded) << created.status().ToString();
  EXPECT_NE(created.status().message().find(
                "rank 1 of 2: rank 0 did not publish a backend choice for 'auto' at "
                "'cohort/auto/backend' within 200 ms: rank 0 may run an older version that does "
                "not publish one, or may not have started"),
            std::string::npos)
      << created.status().ToString();
}

// A backend that records the timeout its Create is given. Viable only for its own cohort, and
// below every built-in backend, so that nothing else chooses it.
std::atomic<int> recorded_timeout_ms{0};

class RecordingBackend final : public CommunicatorBackend {
 public:
  std::string_view name() const override { return "recording"; }
  int priority() const override { return 1; }
  Status Viable(const CommunicatorOptions& options) const override {
    if (options.prefix == "recorded") return Status::Ok();
    return FailedPreconditionError("only for the recorded cohort");
  }
  Result<std::unique_ptr<Communicator>> Create(const CommunicatorOptions& options,
                                               std::shared_ptr<Store>) const override {
    recorded_timeout_ms = options.timeout_ms;
    auto hub = std::make_shared<LocalHub>(options.size);
    return std::unique_ptr<Communicator>(new LocalCommunicator(
        hub, options.rank, std::chrono::milliseconds(options.timeout_ms)));
  }
};

TEST(AutoChoiceTest, WaitingForRankZerosChoiceComesOutOfTheTimeoutNotOnTopOfIt) {
  auto results = testing::RunRanks(1, testing::RankMode::kProcesses, [](int) -> Status {
    CommunicatorRegistry::Global().Register(std::make_unique<RecordingBackend>());
    auto store = std::make_shared<HashStore>();
    // Rank 0 publishes its choice 300 ms into rank 1's creation.
    std::thread rank0([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      (void)store->Set("recorded/auto/backend", "recording");
    });
    CommunicatorOptions options;
    options.rank = 1;
    options.size = 2;
    options.prefix = "recorded";
    options.timeout_ms = 60000;
    auto created = CreateCommunicator(options, store);
    rank0.join();
    if (!created.ok()) return created.status();
    if (recorded_timeout_ms > 60000 - 300) {
      return InternalError("the backend's rendezvous was given " +
                           std::to_string(recorded_timeout_ms) + " ms of the 60000");
    }
    if ((*created)->default_timeout() != std::chrono::milliseconds(60000)) {
      return InternalError("the default call timeout is " +
                           std::to_string((*created)->default_timeout().count()) + " ms");
    }
    return Status::Ok();
  });
  EXPECT_TRUE(results[0].ok()) << results[0].ToString();
}

}  // namespace
}  // namespace tessera::collectives
