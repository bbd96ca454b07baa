// One generic suite for the Communicator interface, instantiated for every backend, on
// threads and on forked processes, for 1 to 5 ranks. Values are small integers, so every
// dtype (float16 included) must come back exact. nccl runs on device buffers, one GPU per
// rank: instances with more ranks than GPUs are skipped, saying so.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "collectives/reduce.h"
#include "rank_memory.h"
#include "test_backends.h"

namespace tessera::collectives::testing {
namespace {

struct SuiteParam {
  std::string backend;
  RankMode mode;
  int size;
};

// How GoogleTest (and ctest's listing) prints a parameter.
void PrintTo(const SuiteParam& p, std::ostream* out) {
  *out << p.backend << ", " << RankModeName(p.mode) << ", " << p.size << " ranks";
}

std::string ParamName(const ::testing::TestParamInfo<SuiteParam>& info) {
  std::string name = info.param.backend + "_" + RankModeName(info.param.mode) + "_" +
                     std::to_string(info.param.size) + "ranks";
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

double Load(const std::vector<std::byte>& buffer, size_t i, DataType type) {
  const std::byte* p = buffer.data() + i * DataTypeSize(type);
  switch (type) {
    case DataType::kUint8: return static_cast<double>(*reinterpret_cast<const uint8_t*>(p));
    case DataType::kInt32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DataType::kInt64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case DataType::kFloat16: { uint16_t v; std::memcpy(&v, p, 2); return HalfToFloat(v); }
    case DataType::kFloat32: { float v; std::memcpy(&v, p, 4); return v; }
    case DataType::kFloat64: { double v; std::memcpy(&v, p, 8); return v; }
  }
  return 0;
}

void Put(std::vector<std::byte>& buffer, size_t i, DataType type, double value) {
  std::byte* p = buffer.data() + i * DataTypeSize(type);
  switch (type) {
    case DataType::kUint8: { uint8_t v = static_cast<uint8_t>(value); std::memcpy(p, &v, 1); break; }
    case DataType::kInt32: { int32_t v = static_cast<int32_t>(value); std::memcpy(p, &v, 4); break; }
    case DataType::kInt64: { int64_t v = static_cast<int64_t>(value); std::memcpy(p, &v, 8); break; }
    case DataType::kFloat16: { uint16_t v = FloatToHalf(static_cast<float>(value)); std::memcpy(p, &v, 2); break; }
    case DataType::kFloat32: { float v = static_cast<float>(value); std::memcpy(p, &v, 4); break; }
    case DataType::kFloat64: { std::memcpy(p, &value, 8); break; }
  }
}

// Rank r's element i: small positive integers, distinct per rank so max and min matter.
double Value(int rank, size_t i) { return static_cast<double>((rank + 1) * (i % 13 + 1)); }

std::vector<std::byte> Filled(int rank, size_t count, DataType type, size_t first = 0) {
  std::vector<std::byte> buffer(count * DataTypeSize(type));
  for (size_t i = 0; i < count; ++i) Put(buffer, i, type, Value(rank, first + i));
  return buffer;
}

// The expected reduction over all ranks of elements [first, first+count).
std::vector<std::byte> Reduced(int size, size_t count, DataType type, ReduceOp op, size_t first) {
  std::vector<std::byte> out(count * DataTypeSize(type));
  for (size_t i = 0; i < count; ++i) {
    double r = Value(0, first + i);
    for (int k = 1; k < size; ++k) {
      const double v = Value(k, first + i);
      if (op == ReduceOp::kMax) r = std::max(r, v);
      else if (op == ReduceOp::kMin) r = std::min(r, v);
      else r += v;
    }
    Put(out, i, type, r);
  }
  if (op == ReduceOp::kAvg) DivideElements(out.data(), count, type, size);
  return out;
}

Status Compare(const std::vector<std::byte>& got, const std::vector<std::byte>& want,
               DataType type, const std::string& what) {
  const size_t count = want.size() / DataTypeSize(type);
  for (size_t i = 0; i < count; ++i) {
    if (Load(got, i, type) != Load(want, i, type)) {
      return InternalError(what + ": element " + std::to_string(i) + " expected " +
                           std::to_string(Load(want, i, type)) + ", got " +
                           std::to_string(Load(got, i, type)));
    }
  }
  return Status::Ok();
}

std::string Describe(const char* op, DataType type, size_t count, const char* extra = "") {
  return std::string(op) + " " + std::string(DataTypeName(type)) + " count " +
         std::to_string(count) + extra;
}

// The sweep one rank runs: op x dtype x reduce op x size, then send/recv and barrier, on
// buffers from `memory` (device memory for nccl).
Status Sweep(Communicator& c, RankMemory& memory) {
  const int n = c.size();
  const int r = c.rank();
  const size_t sizes[] = {0, 1, 7, 1000, 20000};
  for (DataType type : AllDataTypes()) {
    if (!c.capabilities().HasDataType(type)) continue;
    for (size_t count : sizes) {
      for (ReduceOp op : AllReduceOps()) {
        const std::string what = Describe("allreduce", type, count) + " " +
                                 std::string(ReduceOpName(op));
        const std::vector<std::byte> send = Filled(r, count, type);
        const auto want = Reduced(n, count, type, op, 0);
        ASSIGN_OR_RETURN(void* send_buffer, memory.Put(send));
        if (count % 2 == 0) {  // in place
          RETURN_IF_ERROR(c.Allreduce(send_buffer, send_buffer, count, type, op).WithContext(what));
          ASSIGN_OR_RETURN(auto got, memory.Get(send_buffer, send.size()));
          RETURN_IF_ERROR(Compare(got, want, type, what + " in place"));
        } else {
          ASSIGN_OR_RETURN(void* recv_buffer, memory.Put(std::vector<std::byte>(send.size())));
          RETURN_IF_ERROR(c.Allreduce(send_buffer, recv_buffer, count, type, op).WithContext(what));
          ASSIGN_OR_RETURN(auto got, memory.Get(recv_buffer, send.size()));
          RETURN_IF_ERROR(Compare(got, want, type, what));
        }
        // Reduce-scatter: every rank contributes n blocks of `count`.
        ASSIGN_OR_RETURN(void* all, memory.Put(Filled(r, count * n, type)));
        ASSIGN_OR_RETURN(void* mine, memory.Put(std::vector<std::byte>(count * DataTypeSize(type))));
        const std::string rs = Describe("reduce_scatter", type, count) + " " +
                               std::string(ReduceOpName(op));
        RETURN_IF_ERROR(c.ReduceScatter(all, mine, count, type, op).WithContext(rs));
        ASSIGN_OR_RETURN(auto got, memory.Get(mine, count * DataTypeSize(type)));
        RETURN_IF_ERROR(Compare(got, Reduced(n, count, type, op, r * count), type, rs));
        memory.Release();
      }
      {
        const std::string what = Describe("allgather", type, count);
        const size_t bytes = count * n * DataTypeSize(type);
        ASSIGN_OR_RETURN(void* send, memory.Put(Filled(r, count, type)));
        ASSIGN_OR_RETURN(void* recv, memory.Put(std::vector<std::byte>(bytes)));
        RETURN_IF_ERROR(c.Allgather(send, recv, count, type).WithContext(what));
        std::vector<std::byte> want(bytes);
        for (int k = 0; k < n; ++k) {
          for (size_t i = 0; i < count; ++i) Put(want, k * count + i, type, Value(k, i));
        }
        ASSIGN_OR_RETURN(auto got, memory.Get(recv, bytes));
        RETURN_IF_ERROR(Compare(got, want, type, what));
        memory.Release();
      }
      {
        const int root = static_cast<int>(count % n);
        const std::string what = Describe("broadcast", type, count) + " root " + std::to_string(root);
        ASSIGN_OR_RETURN(void* buffer, memory.Put(r == root ? Filled(root, count, type)
                                                            : std::vector<std::byte>(count * DataTypeSize(type))));
        RETURN_IF_ERROR(c.Broadcast(buffer, count, type, root).WithContext(what));
        ASSIGN_OR_RETURN(auto got, memory.Get(buffer, count * DataTypeSize(type)));
        RETURN_IF_ERROR(Compare(got, Filled(root, count, type), type, what));
        memory.Release();
      }
    }
  }
  // Large messages: the ring and pipelined paths.
  {
    const size_t count = 1 << 20;
    const size_t bytes = count * sizeof(float);
    ASSIGN_OR_RETURN(void* buffer, memory.Put(Filled(r, count, DataType::kFloat32)));
    RETURN_IF_ERROR(c.Allreduce(buffer, buffer, count, DataType::kFloat32, ReduceOp::kSum));
    ASSIGN_OR_RETURN(auto reduced, memory.Get(buffer, bytes));
    RETURN_IF_ERROR(Compare(reduced, Reduced(n, count, DataType::kFloat32, ReduceOp::kSum, 0),
                            DataType::kFloat32, "allreduce float32 sum count 1M"));
    const int root = n - 1;
    ASSIGN_OR_RETURN(void* big, memory.Put(r == root ? Filled(root, count, DataType::kFloat32)
                                                     : std::vector<std::byte>(bytes)));
    RETURN_IF_ERROR(c.Broadcast(big, count, DataType::kFloat32, root));
    ASSIGN_OR_RETURN(auto broadcast, memory.Get(big, bytes));
    RETURN_IF_ERROR(Compare(broadcast, Filled(root, count, DataType::kFloat32), DataType::kFloat32,
                            "broadcast float32 count 1M"));
    memory.Release();
  }
  // Send/recv around the ring: rank 0 starts the token, everyone else forwards it.
  if (n > 1) {
    for (size_t count : {size_t{0}, size_t{5}, size_t{100000}}) {
      const std::vector<std::byte> token = Filled(0, count, DataType::kInt64);
      ASSIGN_OR_RETURN(void* sent, memory.Put(token));
      ASSIGN_OR_RETURN(void* got, memory.Put(std::vector<std::byte>(token.size())));
      const int next = (r + 1) % n, previous = (r + n - 1) % n;
      const std::string what = Describe("send/recv ring", DataType::kInt64, count);
      if (r == 0) {
        RETURN_IF_ERROR(c.Send(sent, count, DataType::kInt64, next, 7).WithContext(what));
        RETURN_IF_ERROR(c.Recv(got, count, DataType::kInt64, previous, 7).WithContext(what));
      } else {
        RETURN_IF_ERROR(c.Recv(got, count, DataType::kInt64, previous, 7).WithContext(what));
        RETURN_IF_ERROR(c.Send(got, count, DataType::kInt64, next, 7).WithContext(what));
      }
      ASSIGN_OR_RETURN(auto received, memory.Get(got, token.size()));
      RETURN_IF_ERROR(Compare(received, token, DataType::kInt64, what));
      memory.Release();
    }
  }
  return c.Barrier();
}

class CommunicatorSuite : public ::testing::TestWithParam<SuiteParam> {
 protected:
  void SetUp() override {
    const std::string reason = SkipReason(GetParam().backend, GetParam().size, GetParam().mode);
    if (!reason.empty()) GTEST_SKIP() << GetParam().backend << " not viable here: " << reason;
  }
};

TEST_P(CommunicatorSuite, SweepsEveryOpDtypeReduceOpAndSize) {
  const SuiteParam& param = GetParam();
  World world(param.size, param.mode);
  auto results = RunRanks(param.size, param.mode, [&](int rank) -> Status {
    ASSIGN_OR_RETURN(auto memory, MemoryFor(param.backend, rank));
    ASSIGN_OR_RETURN(auto communicator, world.Create(param.backend, rank, 20000));
    if (communicator->rank() != rank || communicator->size() != param.size) {
      return InternalError("wrong rank or size");
    }
    return Sweep(*communicator, *memory);
  });
  for (int rank = 0; rank < param.size; ++rank) {
    EXPECT_TRUE(results[rank].ok()) << "rank " << rank << ": " << results[rank].ToString();
  }
}

std::vector<SuiteParam> AllParams() {
  std::vector<SuiteParam> params;
  for (const char* backend :
       {"p2p", "sendrecv-local", "sendrecv-p2p", "verified-local", "gloo", "mpi", "nccl"}) {
    for (RankMode mode : {RankMode::kThreads, RankMode::kProcesses}) {
      const std::string name = backend;
      if ((name == "sendrecv-local" || name == "verified-local") && mode == RankMode::kProcesses) {
        continue;  // an in-memory transport
      }
      for (int size = 1; size <= 5; ++size) params.push_back({backend, mode, size});
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Backends, CommunicatorSuite, ::testing::ValuesIn(AllParams()),
                         ParamName);

// The same sweep with ranks launched by mpirun (the MPI backend cannot run on threads or
// forked children): mpirun -np 3 collectives_tests --gtest_filter='MpiLaunched*'. The sweep
// skips float16 through the MPI backend's capabilities (MPI has no half type).
TEST(MpiLaunchedTest, SweepsUnderMpirun) {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (size == nullptr || rank == nullptr) GTEST_SKIP() << "not launched by mpirun";
  CommunicatorOptions options;
  options.backend = "mpi";
  options.rank = std::atoi(rank);
  options.size = std::atoi(size);
  auto c = CreateCommunicator(options, std::make_shared<HashStore>());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  HostRankMemory memory;
  Status swept = Sweep(**c, memory);
  EXPECT_TRUE(swept.ok()) << swept.ToString();
}

}  // namespace
}  // namespace tessera::collectives::testing
