#include "collectives/nccl/communicator.h"

#include <cstring>
#include <string>
#include <thread>

namespace tessera::collectives {
namespace {

ncclDataType_t ToNccl(DataType type) {
  switch (type) {
    case DataType::kUint8: return ncclUint8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
  }
  return ncclFloat32;
}

ncclRedOp_t ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

std::string CudaText(cudaError_t error) { return cudaGetErrorString(error); }

}  // namespace

Status NcclCommunicator::DevicePresent() {
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess) {
    return FailedPreconditionError("no usable CUDA device: " + CudaText(error));
  }
  if (devices == 0) return FailedPreconditionError("no CUDA device is visible");
  return Status::Ok();
}

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const CommunicatorOptions& options, Store& store) {
  RETURN_IF_ERROR(DevicePresent());
  int devices = 0;
  cudaGetDeviceCount(&devices);
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(
      options.rank, options.size, std::chrono::milliseconds(options.timeout_ms)));
  c->device_ = options.rank % devices;
  cudaError_t error = cudaSetDevice(c->device_);
  if (error != cudaSuccess) return UnavailableError("cudaSetDevice: " + CudaText(error));

  ncclUniqueId id;
  const auto timeout = std::chrono::milliseconds(options.timeout_ms);
  if (options.rank == 0) {
    ncclResult_t made = ncclGetUniqueId(&id);
    if (made != ncclSuccess) {
      return UnavailableError(std::string("ncclGetUniqueId: ") + ncclGetErrorString(made));
    }
    RETURN_IF_ERROR(store.Set("nccl/id", std::string(reinterpret_cast<char*>(&id), sizeof(id))));
  } else {
    ASSIGN_OR_RETURN(std::string bytes, store.Get("nccl/id", timeout));
    if (bytes.size() != sizeof(id)) {
      return DataLossError("nccl/id in the store has " + std::to_string(bytes.size()) +
                           " bytes, expected " + std::to_string(sizeof(id)));
    }
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  error = cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking);
  if (error != cudaSuccess) return UnavailableError("cudaStreamCreate: " + CudaText(error));
  error = cudaMalloc(&c->barrier_word_, sizeof(int32_t));
  if (error != cudaSuccess) return ResourceExhaustedError("cudaMalloc: " + CudaText(error));
  const ncclResult_t init = ncclCommInitRank(&c->comm_, options.size, id, options.rank);
  if (init != ncclSuccess) {
    c->comm_ = nullptr;
    return UnavailableError(std::string("ncclCommInitRank (rank ") + std::to_string(options.rank) +
                            " of " + std::to_string(options.size) + " on device " +
                            std::to_string(c->device_) + "): " + ncclGetErrorString(init));
  }
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) {
    if (broken_.ok()) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  if (barrier_word_ != nullptr) cudaFree(barrier_word_);
  if (control_device_ != nullptr) cudaFree(control_device_);
  if (control_host_ != nullptr) cudaFreeHost(control_host_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

const CommunicatorCapabilities& NcclCommunicator::capabilities() const {
  static const CommunicatorCapabilities kCapabilities{AllCollectiveOps(), AllReduceOps(),
                                                      AllDataTypes(), {BufferLocation::kDevice}};
  return kCapabilities;
}

Status NcclCommunicator::Finish(ncclResult_t enqueued, Deadline deadline, const char* what) {
  const std::string where = "nccl rank " + std::to_string(rank()) + ": " + what;
  if (enqueued != ncclSuccess) {
    broken_ = UnavailableError(where + " failed: " + ncclGetErrorString(enqueued));
    return broken_;
  }
  for (;;) {
    const cudaError_t state = cudaStreamQuery(stream_);
    if (state == cudaSuccess) return Status::Ok();
    if (state != cudaErrorNotReady) {
      broken_ = InternalError(where + ": CUDA error " + CudaText(state));
      return broken_;
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      broken_ = UnavailableError(where + " failed: " + ncclGetErrorString(async));
      ncclCommAbort(comm_);
      comm_ = nullptr;
      return broken_;
    }
    if (Clock::now() >= deadline) {
      broken_ = DeadlineExceededError(where + " did not complete before the deadline");
      ncclCommAbort(comm_);
      comm_ = nullptr;
      return broken_;
    }
    std::this_thread::yield();
  }
}

Status NcclCommunicator::DoAllreduce(const void* send, void* recv, size_t count, DataType type,
                                     ReduceOp op, Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  return Finish(ncclAllReduce(send, recv, count, ToNccl(type), ToNccl(op), comm_, stream_),
                deadline, "allreduce");
}

Status NcclCommunicator::DoBroadcast(void* buffer, size_t count, DataType type, int root,
                                     Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  return Finish(ncclBroadcast(buffer, buffer, count, ToNccl(type), root, comm_, stream_),
                deadline, "broadcast");
}

Status NcclCommunicator::DoAllgather(const void* send, void* recv, size_t count, DataType type,
                                     Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  return Finish(ncclAllGather(send, recv, count, ToNccl(type), comm_, stream_), deadline,
                "allgather");
}

Status NcclCommunicator::DoReduceScatter(const void* send, void* recv, size_t count,
                                         DataType type, ReduceOp op, Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  return Finish(ncclReduceScatter(send, recv, count, ToNccl(type), ToNccl(op), comm_, stream_),
                deadline, "reduce_scatter");
}

Status NcclCommunicator::DoBarrier(Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  return Finish(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, stream_),
                deadline, "barrier");
}

Status NcclCommunicator::DoSend(const void* buffer, size_t count, DataType type, int peer, int,
                                Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  return Finish(ncclSend(buffer, count, ToNccl(type), peer, comm_, stream_), deadline, "send");
}

Status NcclCommunicator::DoRecv(void* buffer, size_t count, DataType type, int peer, int,
                                Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  return Finish(ncclRecv(buffer, count, ToNccl(type), peer, comm_, stream_), deadline, "recv");
}

Status NcclCommunicator::ReserveControl(size_t bytes) {
  if (bytes <= control_bytes_) return Status::Ok();
  if (control_device_ != nullptr) cudaFree(control_device_);
  if (control_host_ != nullptr) cudaFreeHost(control_host_);
  control_device_ = control_host_ = nullptr;
  control_bytes_ = 0;
  cudaError_t error = cudaMalloc(&control_device_, bytes);
  if (error != cudaSuccess) return ResourceExhaustedError("cudaMalloc: " + CudaText(error));
  error = cudaMallocHost(&control_host_, bytes);
  if (error != cudaSuccess) return ResourceExhaustedError("cudaMallocHost: " + CudaText(error));
  control_bytes_ = bytes;
  return Status::Ok();
}

// The copies are enqueued on stream_ around the NCCL call, so Finish polls all of it.
Status NcclCommunicator::DoHostAllreduce(int64_t* values, size_t count, ReduceOp op,
                                         Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  const size_t bytes = count * sizeof(int64_t);
  RETURN_IF_ERROR(ReserveControl(bytes));
  std::memcpy(control_host_, values, bytes);
  cudaError_t copied =
      cudaMemcpyAsync(control_device_, control_host_, bytes, cudaMemcpyHostToDevice, stream_);
  if (copied != cudaSuccess) return InternalError("cudaMemcpyAsync: " + CudaText(copied));
  const ncclResult_t enqueued = ncclAllReduce(control_device_, control_device_, count, ncclInt64,
                                              ToNccl(op), comm_, stream_);
  if (enqueued == ncclSuccess) {
    copied =
        cudaMemcpyAsync(control_host_, control_device_, bytes, cudaMemcpyDeviceToHost, stream_);
    if (copied != cudaSuccess) return InternalError("cudaMemcpyAsync: " + CudaText(copied));
  }
  RETURN_IF_ERROR(Finish(enqueued, deadline, "allreduce (host control values)"));
  std::memcpy(values, control_host_, bytes);
  return Status::Ok();
}

Status NcclCommunicator::DoHostSend(const void* bytes, size_t size, int peer, int,
                                    Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  RETURN_IF_ERROR(ReserveControl(size));
  std::memcpy(control_host_, bytes, size);
  const cudaError_t copied =
      cudaMemcpyAsync(control_device_, control_host_, size, cudaMemcpyHostToDevice, stream_);
  if (copied != cudaSuccess) return InternalError("cudaMemcpyAsync: " + CudaText(copied));
  return Finish(ncclSend(control_device_, size, ncclUint8, peer, comm_, stream_), deadline,
                "send (host control bytes)");
}

Status NcclCommunicator::DoHostRecv(void* bytes, size_t size, int peer, int,
                                    Deadline deadline) {
  RETURN_IF_ERROR(broken_);
  RETURN_IF_ERROR(ReserveControl(size));
  const ncclResult_t enqueued = ncclRecv(control_device_, size, ncclUint8, peer, comm_, stream_);
  if (enqueued == ncclSuccess) {
    const cudaError_t copied =
        cudaMemcpyAsync(control_host_, control_device_, size, cudaMemcpyDeviceToHost, stream_);
    if (copied != cudaSuccess) return InternalError("cudaMemcpyAsync: " + CudaText(copied));
  }
  RETURN_IF_ERROR(Finish(enqueued, deadline, "recv (host control bytes)"));
  std::memcpy(bytes, control_host_, size);
  return Status::Ok();
}

}  // namespace tessera::collectives
