#include "collectives/nccl/communicator.h"

#include <algorithm>
#include <cstdio>
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

// The result's name plus NCCL's own last message, which usually says what went wrong.
std::string NcclText(ncclResult_t result) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  return text;
}

// Polling that does not burn a core: yields for the first polls (a collective on a fast link
// completes within microseconds), then sleeps from 20 us doubling to 1 ms.
class PollBackoff {
 public:
  void Wait() {
    if (++polls_ <= 100) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  int polls_ = 0;
  std::chrono::microseconds sleep_{20};
};

}  // namespace

Status NcclCommunicator::DevicePresent() {
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return FailedPreconditionError("no usable CUDA device: " + CudaText(error));
  }
  if (devices == 0) return FailedPreconditionError("no CUDA device is visible");
  return Status::Ok();
}

Result<NcclEnvironment> NcclCommunicator::Probe() {
  NcclEnvironment environment;
  int version = 0;
  const ncclResult_t got = ncclGetVersion(&version);
  if (got != ncclSuccess) return UnavailableError("ncclGetVersion: " + NcclText(got));
  // Since 2.9 the code is major * 10000 + minor * 100 + patch.
  environment.version = std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
                        std::to_string(version % 100);
  RETURN_IF_ERROR(DevicePresent().WithContext("NCCL " + environment.version));
  (void)cudaGetDeviceCount(&environment.devices);
  return environment;
}

std::string NcclCommunicator::Where(const std::string& what) const {
  return "nccl rank " + std::to_string(rank()) + " of " + std::to_string(size()) + " on CUDA device #" +
         std::to_string(device_) + ": " + what;
}

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const CommunicatorOptions& options, Store& store) {
  const auto timeout = std::chrono::milliseconds(options.timeout_ms);
  const Deadline deadline = Clock::now() + timeout;
  RETURN_IF_ERROR(DevicePresent());
  int devices = 0;
  (void)cudaGetDeviceCount(&devices);
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(options.rank, options.size, timeout));
  c->device_ = options.device_index;
  if (options.device_index < 0 || options.device_index >= devices) {
    return InvalidArgumentError(c->Where("options.device_index " + std::to_string(options.device_index) +
                                         " is not a visible CUDA device (" + std::to_string(devices) +
                                         " visible)"));
  }
  cudaError_t error = cudaSetDevice(c->device_);
  if (error != cudaSuccess) return UnavailableError(c->Where("cudaSetDevice: " + CudaText(error)));

  ncclUniqueId id;
  if (options.rank == 0) {
    const ncclResult_t made = ncclGetUniqueId(&id);
    if (made != ncclSuccess) return UnavailableError(c->Where("ncclGetUniqueId: " + NcclText(made)));
    RETURN_IF_ERROR(store.Set("nccl/id", std::string(reinterpret_cast<char*>(&id), sizeof(id))));
  } else {
    const auto left = std::chrono::milliseconds(std::max<int64_t>(1, MillisecondsLeft(deadline)));
    ASSIGN_OR_RETURN(std::string bytes, store.Get("nccl/id", left));
    if (bytes.size() != sizeof(id)) {
      return DataLossError(c->Where("nccl/id in the store has " + std::to_string(bytes.size()) +
                                    " bytes, expected " + std::to_string(sizeof(id))));
    }
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  error = cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking);
  if (error != cudaSuccess) return UnavailableError(c->Where("cudaStreamCreate: " + CudaText(error)));
  error = cudaMalloc(&c->barrier_word_, sizeof(int32_t));
  if (error != cudaSuccess) {
    c->barrier_word_ = nullptr;
    return ResourceExhaustedError(c->Where("cudaMalloc: " + CudaText(error)));
  }
  error = cudaMemset(c->barrier_word_, 0, sizeof(int32_t));
  if (error != cudaSuccess) return UnavailableError(c->Where("cudaMemset: " + CudaText(error)));

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t init = ncclCommInitRankConfig(&c->comm_, options.size, id, options.rank, &config);
  const std::string joining = "creating the NCCL communicator (ncclCommInitRankConfig, waiting for all " +
                              std::to_string(options.size) + " ranks to join within " +
                              std::to_string(options.timeout_ms) + " ms)";
  RETURN_IF_ERROR(c->Finish(init, deadline, joining.c_str(), /*wait_for_stream=*/false));
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (stream_ != nullptr || comm_ != nullptr) (void)cudaSetDevice(device_);
  if (comm_ != nullptr) {
    // Finalize flushes what was issued and waits for the peers; a peer that is gone would
    // make it wait forever, hence the deadline and the abort.
    Status closed = Finish(ncclCommFinalize(comm_), Clock::now() + default_timeout(),
                           "finalizing the communicator (ncclCommFinalize)", /*wait_for_stream=*/false);
    if (closed.ok()) {
      const ncclResult_t destroyed = ncclCommDestroy(comm_);
      comm_ = nullptr;
      // ncclInProgress: a non-blocking communicator frees the rest in the background.
      if (destroyed != ncclSuccess && destroyed != ncclInProgress) {
        closed = UnavailableError(Where("ncclCommDestroy: " + NcclText(destroyed)));
      }
    }
    if (!closed.ok()) std::fprintf(stderr, "tessera: %s\n", closed.ToString().c_str());
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

Status NcclCommunicator::Fail(Status failure) {
  broken_ = std::move(failure);
  if (comm_ != nullptr) {
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  return broken_;
}

Status NcclCommunicator::Begin(const char* what) {
  RETURN_IF_ERROR(broken_);
  const cudaError_t error = cudaSetDevice(device_);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return Fail(UnavailableError(Where(std::string(what) + ": cudaSetDevice: " + CudaText(error))));
  }
  return Status::Ok();
}

Status NcclCommunicator::Finish(ncclResult_t enqueued, Deadline deadline, const char* what,
                                bool wait_for_stream) {
  // ncclInProgress: a non-blocking communicator is still joining or still enqueuing in the
  // background; the work is on the stream only once the state reads ncclSuccess.
  if (enqueued != ncclSuccess && enqueued != ncclInProgress) {
    return Fail(UnavailableError(Where(std::string(what) + " failed: " + NcclText(enqueued))));
  }
  for (PollBackoff backoff;; backoff.Wait()) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
    if (queried != ncclSuccess) state = queried;
    if (state != ncclSuccess && state != ncclInProgress) {
      return Fail(UnavailableError(Where(std::string(what) + " failed: " + NcclText(state))));
    }
    if (state == ncclSuccess) {
      if (!wait_for_stream) return Status::Ok();
      const cudaError_t stream = cudaStreamQuery(stream_);
      if (stream == cudaSuccess) return Status::Ok();
      if (stream != cudaErrorNotReady) {
        (void)cudaGetLastError();
        return Fail(InternalError(Where(std::string(what) + ": CUDA error " + CudaText(stream))));
      }
    }
    if (Clock::now() >= deadline) {
      return Fail(DeadlineExceededError(
          Where(std::string(what) + " did not complete before its deadline (" +
                (state == ncclInProgress ? "still enqueuing or joining: a peer may be missing"
                                         : "queued, the stream not done: a peer may be missing or slow") +
                "); the NCCL communicator was aborted")));
    }
  }
}

Status NcclCommunicator::DoAllreduce(const void* send, void* recv, size_t count, DataType type,
                                     ReduceOp op, Deadline deadline) {
  RETURN_IF_ERROR(Begin("allreduce"));
  return Finish(ncclAllReduce(send, recv, count, ToNccl(type), ToNccl(op), comm_, stream_),
                deadline, "allreduce");
}

Status NcclCommunicator::DoBroadcast(void* buffer, size_t count, DataType type, int root,
                                     Deadline deadline) {
  RETURN_IF_ERROR(Begin("broadcast"));
  return Finish(ncclBroadcast(buffer, buffer, count, ToNccl(type), root, comm_, stream_),
                deadline, "broadcast");
}

Status NcclCommunicator::DoAllgather(const void* send, void* recv, size_t count, DataType type,
                                     Deadline deadline) {
  RETURN_IF_ERROR(Begin("allgather"));
  return Finish(ncclAllGather(send, recv, count, ToNccl(type), comm_, stream_), deadline,
                "allgather");
}

Status NcclCommunicator::DoReduceScatter(const void* send, void* recv, size_t count,
                                         DataType type, ReduceOp op, Deadline deadline) {
  RETURN_IF_ERROR(Begin("reduce_scatter"));
  return Finish(ncclReduceScatter(send, recv, count, ToNccl(type), ToNccl(op), comm_, stream_),
                deadline, "reduce_scatter");
}

Status NcclCommunicator::DoBarrier(Deadline deadline) {
  RETURN_IF_ERROR(Begin("barrier"));
  return Finish(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, stream_),
                deadline, "barrier");
}

Status NcclCommunicator::DoSend(const void* buffer, size_t count, DataType type, int peer, int,
                                Deadline deadline) {
  RETURN_IF_ERROR(Begin("send"));
  return Finish(ncclSend(buffer, count, ToNccl(type), peer, comm_, stream_), deadline, "send");
}

Status NcclCommunicator::DoRecv(void* buffer, size_t count, DataType type, int peer, int,
                                Deadline deadline) {
  RETURN_IF_ERROR(Begin("recv"));
  return Finish(ncclRecv(buffer, count, ToNccl(type), peer, comm_, stream_), deadline, "recv");
}

Status NcclCommunicator::ReserveControl(size_t bytes) {
  if (bytes <= control_bytes_) return Status::Ok();
  if (control_device_ != nullptr) cudaFree(control_device_);
  if (control_host_ != nullptr) cudaFreeHost(control_host_);
  control_device_ = control_host_ = nullptr;
  control_bytes_ = 0;
  cudaError_t error = cudaMalloc(&control_device_, bytes);
  if (error != cudaSuccess) {
    control_device_ = nullptr;
    return ResourceExhaustedError(Where("cudaMalloc of " + std::to_string(bytes) + " bytes: " + CudaText(error)));
  }
  error = cudaMallocHost(&control_host_, bytes);
  if (error != cudaSuccess) {
    control_host_ = nullptr;
    return ResourceExhaustedError(Where("cudaMallocHost of " + std::to_string(bytes) + " bytes: " +
                                        CudaText(error)));
  }
  control_bytes_ = bytes;
  return Status::Ok();
}

// The copies are enqueued on stream_ around the NCCL call, so Finish polls all of it. A copy
// queued before NCCL has finished enqueuing (ncclInProgress) would race it, so the call is
// waited into the stream first.
Status NcclCommunicator::DoHostAllreduce(int64_t* values, size_t count, ReduceOp op,
                                         Deadline deadline) {
  RETURN_IF_ERROR(Begin("allreduce (host control values)"));
  const size_t bytes = count * sizeof(int64_t);
  RETURN_IF_ERROR(ReserveControl(bytes));
  std::memcpy(control_host_, values, bytes);
  cudaError_t copied =
      cudaMemcpyAsync(control_device_, control_host_, bytes, cudaMemcpyHostToDevice, stream_);
  if (copied != cudaSuccess) return Fail(InternalError(Where("cudaMemcpyAsync: " + CudaText(copied))));
  RETURN_IF_ERROR(Finish(ncclAllReduce(control_device_, control_device_, count, ncclInt64, ToNccl(op), comm_,
                                       stream_),
                         deadline, "allreduce (host control values)", /*wait_for_stream=*/false));
  copied = cudaMemcpyAsync(control_host_, control_device_, bytes, cudaMemcpyDeviceToHost, stream_);
  if (copied != cudaSuccess) return Fail(InternalError(Where("cudaMemcpyAsync: " + CudaText(copied))));
  RETURN_IF_ERROR(Finish(ncclSuccess, deadline, "allreduce (host control values)"));
  std::memcpy(values, control_host_, bytes);
  return Status::Ok();
}

Status NcclCommunicator::DoHostSend(const void* bytes, size_t size, int peer, int,
                                    Deadline deadline) {
  RETURN_IF_ERROR(Begin("send (host control bytes)"));
  RETURN_IF_ERROR(ReserveControl(size));
  std::memcpy(control_host_, bytes, size);
  const cudaError_t copied =
      cudaMemcpyAsync(control_device_, control_host_, size, cudaMemcpyHostToDevice, stream_);
  if (copied != cudaSuccess) return Fail(InternalError(Where("cudaMemcpyAsync: " + CudaText(copied))));
  return Finish(ncclSend(control_device_, size, ncclUint8, peer, comm_, stream_), deadline,
                "send (host control bytes)");
}

Status NcclCommunicator::DoHostRecv(void* bytes, size_t size, int peer, int,
                                    Deadline deadline) {
  RETURN_IF_ERROR(Begin("recv (host control bytes)"));
  RETURN_IF_ERROR(ReserveControl(size));
  RETURN_IF_ERROR(Finish(ncclRecv(control_device_, size, ncclUint8, peer, comm_, stream_), deadline,
                         "recv (host control bytes)", /*wait_for_stream=*/false));
  const cudaError_t copied =
      cudaMemcpyAsync(control_host_, control_device_, size, cudaMemcpyDeviceToHost, stream_);
  if (copied != cudaSuccess) return Fail(InternalError(Where("cudaMemcpyAsync: " + CudaText(copied))));
  RETURN_IF_ERROR(Finish(ncclSuccess, deadline, "recv (host control bytes)"));
  std::memcpy(bytes, control_host_, size);
  return Status::Ok();
}

}  // namespace tessera::collectives
