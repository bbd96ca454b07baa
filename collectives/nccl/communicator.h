// NcclCommunicator: NCCL on CUDA device buffers. Built only when TESSERA_HAVE_NCCL, into the
// module libtessera_nccl.so (module.h; factory.cc loads it on first use); viable only for
// BufferLocation::kDevice with a visible CUDA device. Rank 0 creates the NCCL unique id and
// publishes it in the Store ("nccl/id"); the others read it.
//
// Device. Every rank runs on options.device_index, the device its buffers live on (the index
// the caller's Device reports), and makes it current before each call, so the calling thread
// may have any device current. NCCL refuses two ranks of one communicator on the same GPU: a
// one-GPU machine runs one-rank communicators only.
//
// Deadlines. The NCCL communicator is non-blocking (ncclCommInitRankConfig, blocking = 0), so
// no NCCL call blocks the caller. Creation and every call then poll ncclCommGetAsyncError
// (ncclInProgress: still joining or still enqueuing) and, once the work is on the stream,
// cudaStreamQuery, until done or the deadline: options.timeout_ms from the start of Create
// for creation (the store wait included), the call's own deadline otherwise. A miss aborts
// the NCCL communicator (ncclCommAbort) and fails with DEADLINE_EXCEEDED naming what was
// waited for; every later call returns that error. A rank that never arrives costs the
// others timeout_ms, never a hang. Polling yields at first, then sleeps up to 1 ms.
//
// Ordering. Calls run on the communicator's own stream. The caller's buffers must hold their
// final contents when a call is made (synchronize the Device that computed them first, as
// worker/cohort.cc does); results are complete when the call returns, so work queued on any
// stream afterwards sees them.
//
// Native: every op and reduce op (avg is ncclAvg). Control traffic (DoHost*: VerifiedCommunicator's
// fingerprints and send headers, a few bytes in host memory) is staged through a small pinned
// host buffer and a device buffer kept between calls.
//
// Destruction finalizes the NCCL communicator (ncclCommFinalize, waited for up to the default
// timeout) and destroys it; one that failed, or did not finalize in time, is aborted. A
// failure there is written to stderr (a destructor has no caller to tell).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "collectives/communicator.h"
#include "collectives/nccl/factory.h"
#include "collectives/store/store.h"

namespace tessera::collectives {

class NcclCommunicator final : public Communicator {
 public:
  static Result<std::unique_ptr<NcclCommunicator>> Create(const CommunicatorOptions& options,
                                                          Store& store);
  ~NcclCommunicator() override;
  // OK when a CUDA device is visible; otherwise why not.
  static Status DevicePresent();
  // The linked library's version and the CUDA devices this process sees.
  static Result<NcclEnvironment> Probe();

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
  // "nccl rank 1 of 2 on CUDA device #1: <what>".
  std::string Where(const std::string& what) const;
  // The broken state, or makes device_ current on this thread before a call.
  Status Begin(const char* what);
  // Checks the enqueue result, then polls the communicator until everything is enqueued and,
  // when `wait_for_stream`, the stream until the work is done, or the deadline.
  Status Finish(ncclResult_t enqueued, Deadline deadline, const char* what,
                bool wait_for_stream = true);
  // Remembers `failure` as the broken state and aborts the NCCL communicator.
  Status Fail(Status failure);
  // Grows the control staging buffers to at least `bytes`.
  Status ReserveControl(size_t bytes);

  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int32_t* barrier_word_ = nullptr;  // one device int for Barrier
  void* control_device_ = nullptr;   // control_bytes_ of device memory
  void* control_host_ = nullptr;     // control_bytes_ of pinned host memory
  size_t control_bytes_ = 0;
  Status broken_;
};

}  // namespace tessera::collectives
