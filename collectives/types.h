// Vocabulary of the collectives layer: element types, reduce operations, collective
// operations, buffer locations and the capabilities a backend publishes as data.
//
// collectives/ depends on base/ only. BufferLocation is a plain enum on purpose: the layer
// needs to know where a buffer lives, not what device owns it.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

namespace tessera::collectives {

// Element types. Values are part of the p2p wire header: append only.
enum class DataType : uint8_t {
  kUint8 = 0,  // raw bytes; reductions treat them as unsigned integers
  kInt32 = 1,
  kInt64 = 2,
  kFloat16 = 3,  // IEEE 754 binary16; reduced in float32 and rounded back
  kFloat32 = 4,
  kFloat64 = 5,
};

// Reductions. kAvg is the sum divided by the number of ranks (integer division for
// integer types). Values are part of the p2p wire header: append only.
enum class ReduceOp : uint8_t { kSum = 0, kAvg = 1, kMax = 2, kMin = 3 };

// Operations a Communicator offers. Values are part of the p2p wire header: append only.
enum class CollectiveOp : uint8_t {
  kAllreduce = 0,
  kBroadcast = 1,
  kAllgather = 2,
  kReduceScatter = 3,
  kBarrier = 4,
  kSend = 5,
  kRecv = 6,
};

// Where a buffer lives. kDevice means accelerator memory the backend can address directly
// (for NCCL: CUDA device memory on the communicator's current device).
enum class BufferLocation : uint8_t { kHost = 0, kDevice = 1 };

// What a backend does natively. Ops and reduce ops missing here are composed by
// FallbackCommunicator (collectives/fallback.h); dtypes and locations cannot be composed.
struct CommunicatorCapabilities {
  std::set<CollectiveOp> native_ops;
  std::set<ReduceOp> native_reduce_ops;
  std::set<DataType> dtypes;
  std::set<BufferLocation> locations;
  // True when the backend itself detects calls that do not match across ranks (op, count,
  // dtype, reduce op, root, send/recv tag) and fails them instead of computing garbage, as
  // p2p and the send/recv fallback do through their message headers. CreateCommunicator
  // wraps every other backend in VerifiedCommunicator (collectives/verified.h).
  bool verifies_calls = false;
  // Send/Recv take tags 0 to max_tag. A backend whose transport has a smaller bound says so
  // (mpi: MPI's MPI_TAG_UB attribute); a wrapper that sends messages of its own through the
  // backend takes the top tag of what it wraps for them and offers callers one less
  // (ReserveTopTag), so that a caller's message and the layer's can never share a tag.
  int max_tag = INT_MAX;

  bool HasOp(CollectiveOp op) const { return native_ops.count(op) != 0; }
  bool HasReduceOp(ReduceOp op) const { return native_reduce_ops.count(op) != 0; }
  bool HasDataType(DataType type) const { return dtypes.count(type) != 0; }
  bool HasLocation(BufferLocation location) const { return locations.count(location) != 0; }
  // "ops=[allreduce,send,recv] reduce=[sum] dtypes=[float32] locations=[host]", then
  // " max_tag=N" when max_tag is below INT_MAX.
  std::string ToString() const;
};

// For a wrapper that sends messages of its own through `base` (the send/recv fallback's
// framing, VerifiedCommunicator's headers): the tag it uses for them, base.max_tag, the top
// one. Returns the capabilities the wrapper offers: base's with max_tag one less. Pure.
CommunicatorCapabilities ReserveTopTag(const CommunicatorCapabilities& base, int* reserved);

// Size of one element in bytes.
size_t DataTypeSize(DataType type);

std::string_view DataTypeName(DataType type);           // "float32"
std::string_view ReduceOpName(ReduceOp op);             // "sum"
std::string_view CollectiveOpName(CollectiveOp op);     // "allreduce"
std::string_view BufferLocationName(BufferLocation location);  // "host"

// Every value of each enum, for sweeps and capability sets.
const std::set<DataType>& AllDataTypes();
const std::set<ReduceOp>& AllReduceOps();
const std::set<CollectiveOp>& AllCollectiveOps();

// Float16 conversion used by the host reduction kernels (round to nearest even).
float HalfToFloat(uint16_t half);
uint16_t FloatToHalf(float value);

}  // namespace tessera::collectives
