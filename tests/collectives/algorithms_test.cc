// CollectiveAlgorithms' own guarantees, on p2p and on the send/recv fallback over the in-memory
// backend: the scratch it keeps is sized without overflow, and a call whose scratch cannot be
// had is refused naming the call and the rank, never an exception; the refusal moves nothing,
// so the ranks stay in step. And a segment size as large as a size_t holds still moves every
// byte.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/p2p/communicator.h"
#include "test_backends.h"
#include "tests/address_space.h"

namespace tessera::collectives::testing {
namespace {

bool Mentions(const Status& status, const std::string& text) {
  return status.message().find(text) != std::string::npos;
}

// Counts the caller's buffers could hold (the call's own check passes), but whose float32
// copy, the float16 average's working buffer, cannot be an object.
TEST(AlgorithmScratchTest, AFloat16AverageWhoseFloat32CopyCannotBeAnObjectIsRefused) {
  World world(1, RankMode::kThreads);
  auto c = world.Create("p2p", 0, 5000);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  uint16_t half = FloatToHalf(3.0f);
  const size_t count = size_t{PTRDIFF_MAX} / 2;
  const std::string count_text = "count " + std::to_string(count) + ", float16, avg";
  const Status allreduce =
      (*c)->Allreduce(&half, &half, count, DataType::kFloat16, ReduceOp::kAvg);
  EXPECT_EQ(allreduce.code(), StatusCode::kResourceExhausted) << allreduce.ToString();
  EXPECT_TRUE(Mentions(allreduce, "rank 0: allreduce #0 (" + count_text + ")") &&
              Mentions(allreduce, "more than an object can hold"))
      << allreduce.ToString();
  const Status reduce_scatter =
      (*c)->ReduceScatter(&half, &half, count, DataType::kFloat16, ReduceOp::kAvg);
  EXPECT_EQ(reduce_scatter.code(), StatusCode::kResourceExhausted) << reduce_scatter.ToString();
  EXPECT_TRUE(Mentions(reduce_scatter, "rank 0: reduce_scatter #1 (" + count_text + ")"))
      << reduce_scatter.ToString();
  // Still usable: the refusals moved nothing.
  ASSERT_TRUE((*c)->Allreduce(&half, &half, 1, DataType::kFloat16, ReduceOp::kAvg).ok());
  EXPECT_EQ(HalfToFloat(half), 3.0f);
}

// Reduce-scatter keeps three blocks of scratch (the one received and two accumulators): with
// two ranks the caller's input of two blocks fits an object where three blocks do not.
TEST(AlgorithmScratchTest, ReduceScatterScratchBeyondAnObjectIsRefusedOnEveryRank) {
  for (const char* backend : {"p2p", "sendrecv-local"}) {
    World world(2, RankMode::kThreads);
    std::vector<Status> refused(2);
    auto results = RunRanks(2, RankMode::kThreads, [&](int rank) -> Status {
      ASSIGN_OR_RETURN(auto c, world.Create(backend, rank, 5000));
      float x = 1.0f;
      const size_t count = size_t{PTRDIFF_MAX} / (2 * sizeof(float));  // two blocks fit
      refused[rank] = c->ReduceScatter(&x, &x, count, DataType::kFloat32, ReduceOp::kSum);
      RETURN_IF_ERROR(c->Allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum));
      if (x != 2.0f) return InternalError("allreduce after the refusal gave " + std::to_string(x));
      return Status::Ok();
    });
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(results[rank].ok()) << backend << ": " << results[rank].ToString();
      EXPECT_EQ(refused[rank].code(), StatusCode::kResourceExhausted)
          << backend << ": " << refused[rank].ToString();
      EXPECT_TRUE(Mentions(refused[rank], "rank " + std::to_string(rank) + ": reduce_scatter") &&
                  Mentions(refused[rank], "count " + std::to_string(size_t{PTRDIFF_MAX} / 8)) &&
                  Mentions(refused[rank], "more than an object can hold"))
          << backend << ": " << refused[rank].ToString();
    }
  }
}

// A count whose bytes fit an object, but whose ring chunk (2 EiB) no allocator can give:
// std::bad_alloc inside the call becomes RESOURCE_EXHAUSTED.
TEST(AlgorithmScratchTest, ScratchThatCannotBeAllocatedIsRefusedNotThrown) {
  if (tessera::testing::kSanitizerRuntime) {
    GTEST_SKIP() << "a sanitizer's allocator stops the process on an allocation this large "
                    "instead of failing it";
  }
  for (const char* backend : {"p2p", "sendrecv-local"}) {
    World world(2, RankMode::kThreads);
    std::vector<Status> refused(2);
    auto results = RunRanks(2, RankMode::kThreads, [&](int rank) -> Status {
      ASSIGN_OR_RETURN(auto c, world.Create(backend, rank, 5000));
      float x = 1.0f;
      const size_t count = size_t{1} << 60;  // 4 EiB of float32, chunks of 2 EiB
      refused[rank] = c->Allreduce(&x, &x, count, DataType::kFloat32, ReduceOp::kSum);
      RETURN_IF_ERROR(c->Allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum));
      if (x != 2.0f) return InternalError("allreduce after the refusal gave " + std::to_string(x));
      return Status::Ok();
    });
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_TRUE(results[rank].ok()) << backend << ": " << results[rank].ToString();
      EXPECT_EQ(refused[rank].code(), StatusCode::kResourceExhausted)
          << backend << ": " << refused[rank].ToString();
      EXPECT_TRUE(Mentions(refused[rank], "rank " + std::to_string(rank) + ": allreduce") &&
                  Mentions(refused[rank], "count 1152921504606846976, float32, sum") &&
                  Mentions(refused[rank], "could not be allocated"))
          << backend << ": " << refused[rank].ToString();
    }
  }
}

// A segment of SIZE_MAX bytes asks for each message in one piece. The chain broadcast (three
// ranks or more, 256 KiB or more) counted its segments as (bytes + segment - 1) / segment,
// which wrapped to none: every rank returned OK and the others never got the root's data.
TEST(AlgorithmSegmentTest, ASegmentAsLargeAsASizeTStillMovesEveryByte) {
  const int n = 3;
  const size_t count = 100000;  // int32: 400000 bytes, past the binomial tree
  auto store = std::make_shared<HashStore>();
  auto results = RunRanks(n, RankMode::kThreads, [&](int rank) -> Status {
    TcpMeshOptions options;
    options.rank = rank;
    options.size = n;
    ASSIGN_OR_RETURN(auto mesh, TcpMesh::Connect(options, *store));
    AlgorithmTuning tuning;
    tuning.segment_bytes = SIZE_MAX;
    P2PCommunicator c(std::move(mesh), std::chrono::milliseconds(20000), tuning);
    std::vector<int32_t> data(count, rank == 1 ? 0 : -1);
    if (rank == 1) {
      for (size_t i = 0; i < count; ++i) data[i] = static_cast<int32_t>(i);
    }
    RETURN_IF_ERROR(c.Broadcast(data.data(), count, DataType::kInt32, 1));
    for (size_t i = 0; i < count; ++i) {
      if (data[i] != static_cast<int32_t>(i)) {
        return InternalError("broadcast: element " + std::to_string(i) + " is " +
                             std::to_string(data[i]));
      }
    }
    RETURN_IF_ERROR(c.Allreduce(data.data(), data.data(), count, DataType::kInt32, ReduceOp::kSum));
    for (size_t i = 0; i < count; ++i) {
      if (data[i] != static_cast<int32_t>(i) * n) {
        return InternalError("allreduce: element " + std::to_string(i) + " is " +
                             std::to_string(data[i]));
      }
    }
    return Status::Ok();
  });
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank].ToString();
  }
}

}  // namespace
}  // namespace tessera::collectives::testing
