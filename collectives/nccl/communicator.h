// NcclCommunicator: NCCL on CUDA device buffers. Built only when TESSERA_HAVE_NCCL; viable
// only for BufferLocation::kDevice with a visible CUDA device. Rank 0 creates the NCCL unique
// id and publishes it in the Store ("nccl/id"); the others read it. Each rank uses device
// (rank % device count); NCCL refuses two ranks of one communicator on the same GPU.
//
// Native: every op and reduce op (avg is ncclAvg). Calls are enqueued on the communicator's
// own stream and polled (cudaStreamQuery, ncclCommGetAsyncError) until the deadline; a call
// that misses it aborts the NCCL communicator (ncclCommAbort) and fails with
// DEADLINE_EXCEEDED; every later call returns that error. Buffers must be device memory
// on this rank's device. Control traffic (DoHost*: VerifiedCommunicator's fingerprints and
// send headers, a few bytes in host memory) is staged through a small pinned host buffer and
// a device buffer kept between calls.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include "collectives/communicator.h"
#include "collectives/store/store.h"

namespace tessera::collectives {

class NcclCommunicator final : public Communicator {
 public:
  static Result<std::unique_ptr<NcclCommunicator>> Create(const CommunicatorOptions& options,
                                                          Store& store);
  ~NcclCommunicator() override;
  // OK when a CUDA device is visible; otherwise why not.
  static Status DevicePresent();

  std::string_view backend_name() const override { return "nccl"; }
  const CommunicatorCapabilities& capabilities() const override;

 protected:
  Status DoAllreduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                     Deadline deadline) override;
  Status DoBroadcast(void* buffer, size_t count, DataType type, int root,
                     Deadline deadline) override;
  Status DoAllgather(const void* send, void* recv, size_t count, DataType type,
                     Deadline deadline) override;
  Status DoReduceScatter(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                         Deadline deadline) override;
  Status DoBarrier(Deadline deadline) override;
  Status DoSend(const void* buffer, size_t count, DataType type, int peer, int tag,
                Deadline deadline) override;
  Status DoRecv(void* buffer, size_t count, DataType type, int peer, int tag,
                Deadline deadline) override;
  Status DoHostAllreduce(int64_t* values, size_t count, ReduceOp op, Deadline deadline) override;
  Status DoHostSend(const void* bytes, size_t size, int peer, int tag,
                    Deadline deadline) override;
  Status DoHostRecv(void* bytes, size_t size, int peer, int tag, Deadline deadline) override;

 private:
  NcclCommunicator(int rank, int size, std::chrono::milliseconds timeout)
      : Communicator(rank, size, timeout) {}
  // Checks the enqueue result, then polls the stream until done or the deadline.
  Status Finish(ncclResult_t enqueued, Deadline deadline, const char* what);

  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  // Grows the control staging buffers to at least `bytes`.
  Status ReserveControl(size_t bytes);

  int32_t* barrier_word_ = nullptr;  // one device int for Barrier
  void* control_device_ = nullptr;   // control_bytes_ of device memory
  void* control_host_ = nullptr;     // control_bytes_ of pinned host memory
  size_t control_bytes_ = 0;
  Status broken_;
};

}  // namespace tessera::collectives
