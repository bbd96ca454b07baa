// The pipelined ring (MessageChannel::ExchangeChain): out-of-place allreduce reads the input
// without writing it, results are bitwise identical on every rank with inexact float sums,
// and the chain works with segments that do not divide the chunks and with empty chunks.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "collectives/p2p/communicator.h"
#include "test_backends.h"

namespace tessera::collectives::testing {
namespace {

// Random floats, different on every rank, so sums round and any change in reduction order
// between ranks would show.
std::vector<float> RandomData(int rank, size_t count) {
  std::mt19937 generator(1234 + rank);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> data(count);
  for (float& x : data) x = value(generator);
  return data;
}

class RingTest : public ::testing::TestWithParam<int> {};

TEST_P(RingTest, OutOfPlaceAllreduceKeepsInputAndAgreesBitwise) {
  const int n = GetParam();
  // Odd count: chunks of unequal size; 5 ring calls of 300001 floats each.
  const size_t count = 300001;
  World world(n, RankMode::kThreads);
  std::vector<std::vector<float>> outputs(n);
  auto results = RunRanks(n, RankMode::kThreads, [&](int rank) -> Status {
    ASSIGN_OR_RETURN(auto c, world.Create("p2p", rank, 20000));
    const std::vector<float> input = RandomData(rank, count);
    std::vector<float> send = input, recv(count, 0.0f);
    for (int i = 0; i < 3; ++i) {
      RETURN_IF_ERROR(
          c->Allreduce(send.data(), recv.data(), count, DataType::kFloat32, ReduceOp::kSum));
      if (std::memcmp(send.data(), input.data(), count * sizeof(float)) != 0) {
        return InternalError("out-of-place allreduce changed its input");
      }
    }
    // In place gives the same bits as out of place.
    RETURN_IF_ERROR(
        c->Allreduce(send.data(), send.data(), count, DataType::kFloat32, ReduceOp::kSum));
    if (std::memcmp(send.data(), recv.data(), count * sizeof(float)) != 0) {
      return InternalError("in-place and out-of-place allreduce differ");
    }
    outputs[rank] = recv;
    return Status::Ok();
  });
  for (int rank = 0; rank < n; ++rank) ASSERT_TRUE(results[rank].ok()) << results[rank].ToString();
  // Every element within float rounding of the exact sum, and the same bits everywhere.
  std::vector<std::vector<float>> inputs;
  for (int rank = 0; rank < n; ++rank) inputs.push_back(RandomData(rank, count));
  for (size_t i = 0; i < count; i += 997) {
    double exact = 0;
    for (int rank = 0; rank < n; ++rank) exact += inputs[rank][i];
    EXPECT_NEAR(outputs[0][i], exact, 1e-5) << "element " << i;
  }
  for (int rank = 1; rank < n; ++rank) {
    EXPECT_EQ(std::memcmp(outputs[0].data(), outputs[rank].data(), count * sizeof(float)), 0)
        << "rank " << rank << " differs from rank 0";
  }
}

TEST_P(RingTest, SegmentsThatDoNotDivideTheChunks) {
  const int n = GetParam();
  const size_t count = 100003;  // int64: 800024 bytes, chunks not multiples of the segment
  auto store = std::make_shared<HashStore>();
  auto results = RunRanks(n, RankMode::kThreads, [&](int rank) -> Status {
    TcpMeshOptions options;
    options.rank = rank;
    options.size = n;
    ASSIGN_OR_RETURN(auto mesh, TcpMesh::Connect(options, *store));
    AlgorithmTuning tuning;
    tuning.segment_bytes = 24 << 10;
    P2PCommunicator c(std::move(mesh), std::chrono::milliseconds(20000), tuning);
    std::vector<int64_t> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<int64_t>(i) * (rank + 1);
    RETURN_IF_ERROR(c.Allreduce(data.data(), data.data(), count, DataType::kInt64,
                                ReduceOp::kSum));
    std::vector<int64_t> gathered(count * n);
    RETURN_IF_ERROR(c.Allgather(data.data(), gathered.data(), count, DataType::kInt64));
    const int64_t factor = n * (n + 1) / 2;
    for (size_t i = 0; i < count * n; ++i) {
      if (gathered[i] != static_cast<int64_t>(i % count) * factor) {
        return InternalError("element " + std::to_string(i) + " is " +
                             std::to_string(gathered[i]));
      }
    }
    return Status::Ok();
  });
  for (int rank = 0; rank < n; ++rank) ASSERT_TRUE(results[rank].ok()) << results[rank].ToString();
}

// In place (send == recv: the result lands over block 0 of the input). With two ranks the
// only step sends block 0 of rank 1's input while the block it reduces into is that same
// block 0, so the reduction must not land there before the send is done. Blocks of 16 MiB
// outgrow the socket buffers, so the bytes still to send would be overwritten.
TEST_P(RingTest, InPlaceReduceScatterDoesNotOverwriteWhatItStillSends) {
  const int n = GetParam();
  const size_t count = 4 << 20;  // int32 per block
  for (const char* backend : {"p2p", "sendrecv-local"}) {
    World world(n, RankMode::kThreads);
    auto results = RunRanks(n, RankMode::kThreads, [&](int rank) -> Status {
      ASSIGN_OR_RETURN(auto c, world.Create(backend, rank, 60000));
      std::vector<int32_t> data(count * n);
      for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<int32_t>(i % 1000) * (rank + 1);
      RETURN_IF_ERROR(
          c->ReduceScatter(data.data(), data.data(), count, DataType::kInt32, ReduceOp::kSum));
      const int32_t factor = n * (n + 1) / 2;
      for (size_t i = 0; i < count; ++i) {
        const int32_t want = static_cast<int32_t>((rank * count + i) % 1000) * factor;
        if (data[i] != want) {
          return InternalError(std::string(backend) + ": element " + std::to_string(i) +
                               " is " + std::to_string(data[i]) + ", expected " +
                               std::to_string(want));
        }
      }
      return Status::Ok();
    });
    for (int rank = 0; rank < n; ++rank) {
      EXPECT_TRUE(results[rank].ok()) << backend << " rank " << rank << ": " << results[rank].ToString();
    }
  }
}

// Fewer elements than ranks leave some ring chunks empty, so a chain step with nothing to
// forward is followed by one that forwards a received chunk. The empty step's message may go
// before the message it follows arrives; the step after it must still wait for its chunk
// (the mesh once sent it from a buffer not yet written: results of -7 on some ranks).
TEST_P(RingTest, FewerElementsThanRanksLeaveChunksEmptyAndStillReduce) {
  const int n = GetParam();
  World world(n, RankMode::kThreads);
  auto results = RunRanks(n, RankMode::kThreads, [&](int rank) -> Status {
    ASSIGN_OR_RETURN(auto c, world.Create("p2p", rank, 20000));
    auto* p2p = dynamic_cast<P2PCommunicator*>(c.get());
    if (p2p == nullptr) return InternalError("not a P2PCommunicator");
    uint64_t sequence = 0;
    for (size_t count = 0; count <= static_cast<size_t>(n) + 1; ++count) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        std::vector<int32_t> send(count, (rank + 1) * n), recv(count, -7);
        RETURN_IF_ERROR(p2p->algorithms().RingAllreduce(
            send.data(), recv.data(), count, DataType::kInt32, op, sequence++,
            Clock::now() + std::chrono::seconds(20)));
        const int32_t sum = n * n * (n + 1) / 2;
        const int32_t want = op == ReduceOp::kAvg ? sum / n : sum;
        for (size_t i = 0; i < count; ++i) {
          if (recv[i] != want) {
            return InternalError("count " + std::to_string(count) + " " +
                                 std::string(ReduceOpName(op)) + ": element " +
                                 std::to_string(i) + " is " + std::to_string(recv[i]) +
                                 ", expected " + std::to_string(want));
          }
        }
      }
    }
    return Status::Ok();
  });
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank].ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, RingTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

}  // namespace
}  // namespace tessera::collectives::testing
