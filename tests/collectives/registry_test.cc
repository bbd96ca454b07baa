// The registry: viability with reasons, the auto choice, fallback accounting.
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <cstring>

#include "collectives/fallback.h"
#include "collectives/mpi/factory.h"
#include "collectives/registry.h"
#include "collectives/store/hash_store.h"
#include "collectives/verified.h"
#include "test_backends.h"

namespace tessera::collectives {
namespace {

TEST(RegistryTest, ListsBuiltInBackendsByPriority) {
  auto backends = CommunicatorRegistry::Global().Backends();
  std::vector<std::string> names;
  for (const auto* backend : backends) names.emplace_back(backend->name());
  EXPECT_EQ(names, (std::vector<std::string>{"nccl", "mpi", "gloo", "p2p"}));
}

TEST(RegistryTest, AutoPicksAHostBackendOutsideMpirun) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) GTEST_SKIP() << "running under mpirun";
  CommunicatorOptions options;
  options.size = 2;
  auto chosen = CommunicatorRegistry::Global().Choose(options);
  ASSERT_TRUE(chosen.ok()) << chosen.status().ToString();
  const bool gloo = CommunicatorRegistry::Global().Find("gloo")->Viable(options).ok();
  EXPECT_EQ((*chosen)->name(), gloo ? "gloo" : "p2p");
}

TEST(RegistryTest, NonViableBackendsSayWhy) {
  CommunicatorOptions options;
  options.size = 2;
  Status mpi = CommunicatorRegistry::Global().Find("mpi")->Viable(options);
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) {
    EXPECT_FALSE(mpi.ok());
    EXPECT_FALSE(mpi.message().empty());
  }
  Status nccl = CommunicatorRegistry::Global().Find("nccl")->Viable(options);
  EXPECT_FALSE(nccl.ok()) << "nccl must refuse host buffers";
  options.location = BufferLocation::kDevice;
  Status p2p = CommunicatorRegistry::Global().Find("p2p")->Viable(options);
  EXPECT_FALSE(p2p.ok());
}

// mpirun's variables are parsed whole: "2abc" is not 2, and the value is shown escaped.
TEST(RegistryTest, MpiWorldVariablesAreParsedStrictlyNamingTheVariable) {
  EXPECT_TRUE(CheckMpiWorld("2", "1", 1, 2).ok());
  EXPECT_TRUE(CheckMpiWorld("1", "0", 0, 1).ok());
  const struct {
    const char* size;
    const char* rank;
    const char* expected;
  } cases[] = {
      {"2abc", "0", "OMPI_COMM_WORLD_SIZE is '2abc': expected a whole number from 1 to 2147483647"},
      {"", "0", "OMPI_COMM_WORLD_SIZE is '': expected"},
      {" 2", "0", "OMPI_COMM_WORLD_SIZE is ' 2': expected"},
      {"+2", "0", "OMPI_COMM_WORLD_SIZE is '+2': expected"},
      {"0", "0", "OMPI_COMM_WORLD_SIZE is '0': expected"},
      {"99999999999", "0", "OMPI_COMM_WORLD_SIZE is '99999999999': expected"},
      {"2", "0x1", "OMPI_COMM_WORLD_RANK is '0x1': expected a whole number from 0 to 1"},
      {"2", "-0", "OMPI_COMM_WORLD_RANK is '-0': expected"},
      {"2", "2", "OMPI_COMM_WORLD_RANK is '2': expected a whole number from 0 to 1"},
      {"2", "1\n", "OMPI_COMM_WORLD_RANK is '1\\n': expected"},
      {"2", "1\x1b[2J", "OMPI_COMM_WORLD_RANK is '1\\x1b[2J': expected"},
      {"3", "0", "mpirun launched rank 0 of 3, options ask for rank 0 of 2"},
      {nullptr, "0", "not launched by mpirun (OMPI_COMM_WORLD_SIZE is unset)"},
      {"2", nullptr, "not launched by mpirun (OMPI_COMM_WORLD_RANK is unset)"},
  };
  for (const auto& c : cases) {
    Status checked = CheckMpiWorld(c.size, c.rank, 0, 2);
    EXPECT_EQ(checked.code(), StatusCode::kFailedPrecondition) << (c.size ? c.size : "null");
    EXPECT_NE(checked.message().find(c.expected), std::string::npos) << checked.ToString();
  }
}

// The mpi backend takes its viability from that check: "2abc" ranks are not mpirun's.
TEST(RegistryTest, MpiIsNotViableWhenMpirunsVariablesAreMalformed) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) GTEST_SKIP() << "running under mpirun";
  CommunicatorOptions options;
  options.size = 2;
  if (CommunicatorRegistry::Global().Find("mpi")->Viable(options).code() == StatusCode::kUnimplemented) {
    GTEST_SKIP() << "built without MPI";
  }
  ::setenv("OMPI_COMM_WORLD_SIZE", "2abc", 1);
  ::setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  Status viable = CommunicatorRegistry::Global().Find("mpi")->Viable(options);
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(viable.code(), StatusCode::kFailedPrecondition) << viable.ToString();
  EXPECT_NE(viable.message().find("OMPI_COMM_WORLD_SIZE is '2abc'"), std::string::npos) << viable.ToString();
}

TEST(RegistryTest, UnknownOrNonViableNamedBackendIsAnError) {
  auto store = std::make_shared<HashStore>();
  CommunicatorOptions options;
  options.backend = "carrier-pigeon";
  auto created = CreateCommunicator(options, store);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument);
  options.backend = "p2p";
  options.rank = 3;
  options.size = 2;
  EXPECT_EQ(CreateCommunicator(options, store).status().code(), StatusCode::kInvalidArgument);
}

TEST(RegistryTest, AutoCommunicatorOfOneRankWorks) {
  auto store = std::make_shared<HashStore>();
  CommunicatorOptions options;
  options.prefix = "single";
  auto created = CreateCommunicator(options, store);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  double x = 3;
  EXPECT_TRUE((*created)->Allreduce(&x, &x, 1, DataType::kFloat64, ReduceOp::kAvg).ok());
  EXPECT_EQ(x, 3);
}

TEST(FallbackTest, CountsEveryComposedCall) {
  testing::World world(2, testing::RankMode::kThreads);
  std::vector<std::map<std::string, uint64_t>> counts(2);
  auto results = testing::RunRanks(2, testing::RankMode::kThreads, [&](int rank) -> Status {
    ASSIGN_OR_RETURN(auto c, world.Create("sendrecv-local", rank, 10000));
    float x[4] = {1, 2, 3, 4};
    RETURN_IF_ERROR(c->Allreduce(x, x, 4, DataType::kFloat32, ReduceOp::kSum));
    RETURN_IF_ERROR(c->Barrier());
    counts[rank] = static_cast<FallbackCommunicator&>(*c).fallback_counts();
    return Status::Ok();
  });
  ASSERT_TRUE(results[0].ok()) << results[0].ToString();
  EXPECT_EQ(counts[0]["allreduce <- send/recv"], 1u);
  EXPECT_EQ(counts[0]["barrier <- send/recv"], 1u);
}

// An allgather composed from a sum of zero-padded blocks copies every rank's bytes exactly:
// a -0.0 stays negative and a NaN keeps its payload (a float sum would give +0.0).
TEST(FallbackTest, AnAllgatherThroughAllreduceCopiesEveryBitOfEachBlock) {
  testing::World world(2, testing::RankMode::kThreads);
  uint32_t nan_bits = 0x7fc01234u;
  float nan;
  std::memcpy(&nan, &nan_bits, sizeof(nan));
  const float blocks[2][2] = {{-0.0f, nan}, {1.5f, -0.0f}};
  std::vector<std::array<float, 4>> gathered(2);
  std::vector<uint64_t> routed(2, 0);
  auto results = testing::RunRanks(2, testing::RankMode::kThreads, [&](int rank) -> Status {
    ASSIGN_OR_RETURN(auto base, world.Create("p2p", rank, 10000));
    FallbackCommunicator c(std::make_unique<testing::SumAllreduceOnly>(std::move(base)), BufferLocation::kHost);
    RETURN_IF_ERROR(c.Allgather(blocks[rank], gathered[rank].data(), 2, DataType::kFloat32));
    const auto counts = c.fallback_counts();
    const auto it = counts.find("allgather <- allreduce(sum) of zero-padded blocks");
    routed[rank] = it == counts.end() ? 0 : it->second;
    return Status::Ok();
  });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(results[rank].ok()) << results[rank].ToString();
    EXPECT_EQ(routed[rank], 1u);
    EXPECT_EQ(std::memcmp(gathered[rank].data(), blocks, sizeof(blocks)), 0)
        << "rank " << rank << ": the gathered bytes differ from the blocks sent";
  }
}

TEST(FallbackTest, GlooReduceScatterAndAvgAreComposed) {
  const std::string reason = testing::SkipReason("gloo");
  if (!reason.empty()) GTEST_SKIP() << reason;
  testing::World world(2, testing::RankMode::kThreads);
  std::vector<std::map<std::string, uint64_t>> counts(2);
  auto results = testing::RunRanks(2, testing::RankMode::kThreads, [&](int rank) -> Status {
    ASSIGN_OR_RETURN(auto c, world.Create("gloo", rank, 10000));
    auto* verified = dynamic_cast<VerifiedCommunicator*>(c.get());
    if (verified == nullptr) return InternalError("gloo was not wrapped in the verifier");
    auto* fallback = dynamic_cast<FallbackCommunicator*>(&verified->base());
    if (fallback == nullptr) return InternalError("gloo was not wrapped in the fallback");
    int32_t all[4] = {1, 2, 3, 4}, mine[2];
    RETURN_IF_ERROR(c->ReduceScatter(all, mine, 2, DataType::kInt32, ReduceOp::kSum));
    if (mine[0] != 2 * all[2 * rank] || mine[1] != 2 * all[2 * rank + 1]) {
      return InternalError("wrong reduce-scatter result");
    }
    RETURN_IF_ERROR(c->Allreduce(all, all, 4, DataType::kInt32, ReduceOp::kAvg));
    counts[rank] = fallback->fallback_counts();
    return Status::Ok();
  });
  ASSERT_TRUE(results[0].ok()) << results[0].ToString();
  ASSERT_TRUE(results[1].ok()) << results[1].ToString();
  EXPECT_EQ(counts[0]["reduce_scatter <- allreduce"], 1u);
  EXPECT_EQ(counts[0]["allreduce(avg) <- allreduce(sum) + divide"], 1u);
}

// Gloo cannot detect mismatched calls, so CreateCommunicator verifies them unless told not
// to; p2p checks its own message headers and is never wrapped.
TEST(RegistryTest, WrapsBackendsThatCannotVerifyCallsUnlessTurnedOff) {
  const std::string reason = testing::SkipReason("gloo");
  if (!reason.empty()) GTEST_SKIP() << reason;
  for (const char* backend : {"gloo", "p2p"}) {
    for (bool verify : {true, false}) {
      testing::World world(1, testing::RankMode::kThreads);
      auto c = world.Create(backend, 0, 10000, verify);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      const bool wrapped = dynamic_cast<VerifiedCommunicator*>(c->get()) != nullptr;
      EXPECT_EQ(wrapped, verify && std::string(backend) == "gloo") << backend << " verify " << verify;
      EXPECT_EQ((*c)->capabilities().verifies_calls, std::string(backend) == "p2p") << backend;
    }
  }
}

}  // namespace
}  // namespace tessera::collectives
