// Failure semantics: dead and stalled peers fail pending calls within the timeout, naming
// the peer; calls that do not match across ranks are detected; other cohorts are refused.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "collectives/p2p/communicator.h"
#include "collectives/p2p/tcp_mesh.h"
#include "test_backends.h"

namespace tessera::collectives::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Generous: a failing call must return well before this, whatever the machine's load.
constexpr auto kBound = seconds(20);

bool Mentions(const Status& status, const std::string& text) {
  return status.message().find(text) != std::string::npos;
}

class DeadPeerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string reason = SkipReason(GetParam());
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
};

TEST_P(DeadPeerTest, PendingCallsFailNamingTheDeadRank) {
  const std::string backend = GetParam();
  World world(3, RankMode::kProcesses);
  auto results = RunRanks(3, RankMode::kProcesses, [&](int rank) -> Status {
    ASSIGN_OR_RETURN(auto c, world.Create(backend, rank, 2000));
    RETURN_IF_ERROR(c->Barrier());  // everyone is connected (Gloo's rendezvous is not a barrier)
    if (rank == 2) ::_exit(0);      // dies holding its connections
    std::vector<float> data(1 << 20, 1.0f);
    const auto start = Clock::now();
    Status status = c->Allreduce(data.data(), data.data(), data.size(), DataType::kFloat32,
                                 ReduceOp::kSum);
    if (status.ok()) return InternalError("allreduce succeeded although rank 2 died");
    if (Clock::now() - start > kBound) return InternalError("took too long: " + status.ToString());
    if (backend != "gloo" && !Mentions(status, "rank ")) {
      return InternalError("no peer named: " + status.ToString());
    }
    // The communicator stays failed: a later call fails too, promptly.
    if (c->Barrier(CallOptions{milliseconds(500)}).ok()) {
      return InternalError("barrier after a failure succeeded");
    }
    // Expected outcome; the message travels back to the parent as this rank's status.
    return UnavailableError("observed: " + status.ToString());
  });
  // Survivors may name the dead rank or a survivor that aborted after seeing it die; at
  // least one names rank 2 itself.
  bool named = false;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(Mentions(results[rank], "observed: ")) << "rank " << rank << ": "
                                                       << results[rank].ToString();
    named = named || Mentions(results[rank], "rank 2");
  }
  EXPECT_TRUE(results[2].ok()) << results[2].ToString();
  if (backend != "gloo") {
    EXPECT_TRUE(named) << results[0].ToString() << "\n" << results[1].ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DeadPeerTest,
                         ::testing::Values("p2p", "sendrecv-p2p", "gloo"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

class StalledPeerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string reason = SkipReason(GetParam());
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
};

TEST_P(StalledPeerTest, CallTimesOutNamingTheStalledRank) {
  const std::string backend = GetParam();
  World world(2, RankMode::kThreads);
  std::atomic<bool> done{false};
  Status seen;
  auto results = RunRanks(2, RankMode::kThreads, [&](int rank) -> Status {
    ASSIGN_OR_RETURN(auto c, world.Create(backend, rank, 30000));
    if (rank == 1) {  // alive but never calls
      while (!done) std::this_thread::sleep_for(milliseconds(10));
      return Status::Ok();
    }
    std::vector<int32_t> data(100, 1);
    const auto start = Clock::now();
    seen = c->Allreduce(data.data(), data.data(), data.size(), DataType::kInt32, ReduceOp::kSum,
                        CallOptions{milliseconds(1000)});
    const auto elapsed = Clock::now() - start;
    done = true;
    if (seen.ok()) return InternalError("allreduce succeeded with a stalled peer");
    if (elapsed > kBound) return InternalError("took too long");
    return Status::Ok();
  });
  EXPECT_TRUE(results[0].ok()) << results[0].ToString();
  EXPECT_EQ(seen.code(), StatusCode::kDeadlineExceeded) << seen.ToString();
  if (backend != "gloo") {
    EXPECT_TRUE(Mentions(seen, "rank 1")) << seen.ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, StalledPeerTest,
                         ::testing::Values("p2p", "sendrecv-local", "sendrecv-p2p", "gloo"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

class MismatchTest : public ::testing::TestWithParam<std::string> {};

// Runs `call(rank, communicator)` on two thread ranks; expects both to fail and at least
// one to report the mismatch with both sides' descriptions.
void ExpectMismatch(const std::string& backend,
                    const std::function<Status(int, Communicator&)>& call,
                    const std::string& mine, const std::string& theirs) {
  World world(2, RankMode::kThreads);
  std::vector<Status> seen(2);
  RunRanks(2, RankMode::kThreads, [&](int rank) -> Status {
    auto c = world.Create(backend, rank, 30000);
    if (!c.ok()) return seen[rank] = c.status();
    seen[rank] = call(rank, **c);
    return Status::Ok();
  });
  bool reported = false;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_FALSE(seen[rank].ok()) << "rank " << rank << " did not notice the mismatch";
    if (seen[rank].code() == StatusCode::kFailedPrecondition && Mentions(seen[rank], "mismatch") &&
        Mentions(seen[rank], mine) && Mentions(seen[rank], theirs)) {
      reported = true;
    }
  }
  EXPECT_TRUE(reported) << "rank 0: " << seen[0].ToString() << "\nrank 1: " << seen[1].ToString();
}

TEST_P(MismatchTest, DifferentCountsAreReported) {
  ExpectMismatch(
      GetParam(),
      [](int rank, Communicator& c) {
        std::vector<float> data(rank == 0 ? 10 : 20, 1.0f);
        return c.Allreduce(data.data(), data.data(), data.size(), DataType::kFloat32,
                           ReduceOp::kSum, CallOptions{milliseconds(2000)});
      },
      "count 10", "count 20");
}

TEST_P(MismatchTest, DifferentOpsAreReported) {
  ExpectMismatch(
      GetParam(),
      [](int rank, Communicator& c) {
        std::vector<float> data(8, 1.0f), out(16);
        if (rank == 0) {
          return c.Allreduce(data.data(), data.data(), 8, DataType::kFloat32, ReduceOp::kSum,
                             CallOptions{milliseconds(2000)});
        }
        return c.Allgather(data.data(), out.data(), 8, DataType::kFloat32,
                           CallOptions{milliseconds(2000)});
      },
      "allreduce", "allgather");
}

TEST_P(MismatchTest, DifferentReduceOpsAreReported) {
  ExpectMismatch(
      GetParam(),
      [](int rank, Communicator& c) {
        std::vector<int64_t> data(8, 1);
        return c.Allreduce(data.data(), data.data(), 8, DataType::kInt64,
                           rank == 0 ? ReduceOp::kSum : ReduceOp::kMax,
                           CallOptions{milliseconds(2000)});
      },
      "sum", "max");
}

INSTANTIATE_TEST_SUITE_P(Backends, MismatchTest,
                         ::testing::Values("p2p", "sendrecv-local", "sendrecv-p2p"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

TEST(P2PTest, RefusesAPeerFromAnotherCohort) {
  auto store = std::make_shared<HashStore>();
  Status rank1_status;
  std::thread rank0([&] {
    TcpMeshOptions options;
    options.rank = 0;
    options.size = 2;
    options.cohort = "cohort-a";
    options.connect_timeout = milliseconds(1500);
    auto mesh = TcpMesh::Connect(options, *store);
    EXPECT_FALSE(mesh.ok());
  });
  TcpMeshOptions options;
  options.rank = 1;
  options.size = 2;
  options.cohort = "cohort-b";
  options.connect_timeout = milliseconds(1500);
  auto mesh = TcpMesh::Connect(options, *store);
  rank0.join();
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), StatusCode::kFailedPrecondition) << mesh.status().ToString();
  EXPECT_TRUE(Mentions(mesh.status(), "cohort")) << mesh.status().ToString();
}

TEST(P2PTest, ScratchIsReusedInSteadyState) {
  World world(3, RankMode::kThreads);
  std::vector<size_t> first(3), last(3);
  auto results = RunRanks(3, RankMode::kThreads, [&](int rank) -> Status {
    ASSIGN_OR_RETURN(auto c, world.Create("p2p", rank, 20000));
    auto* p2p = dynamic_cast<P2PCommunicator*>(c.get());
    if (p2p == nullptr) return InternalError("not a P2PCommunicator");
    std::vector<float> data(300000, 1.0f), out(data.size() * 3);
    for (int i = 0; i < 5; ++i) {
      RETURN_IF_ERROR(c->Allreduce(data.data(), data.data(), data.size(), DataType::kFloat32,
                                   ReduceOp::kSum));
      RETURN_IF_ERROR(c->ReduceScatter(out.data(), data.data(), data.size(), DataType::kFloat32,
                                       ReduceOp::kSum));
      if (i == 0) first[rank] = p2p->algorithms().scratch_bytes();
    }
    last[rank] = p2p->algorithms().scratch_bytes();
    return Status::Ok();
  });
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(results[rank].ok()) << results[rank].ToString();
    EXPECT_EQ(first[rank], last[rank]);
  }
}

TEST(CommunicatorTest, InvalidArgumentsAreRejectedBeforeAnyTraffic) {
  World world(1, RankMode::kThreads);
  auto c = world.Create("p2p", 0, 1000);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  float x = 0;
  EXPECT_EQ((*c)->Allreduce(nullptr, &x, 4, DataType::kFloat32, ReduceOp::kSum).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*c)->Broadcast(&x, 1, DataType::kFloat32, 3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*c)->Send(&x, 1, DataType::kFloat32, 0, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*c)->Recv(&x, 1, DataType::kFloat32, 0, -1).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::collectives::testing
