// Where a rank's test buffers live: host vectors for the host backends, the memory of the
// rank's CUDA device for nccl (which takes device buffers only; a host pointer handed to it
// is an illegal-address fault that poisons CUDA for the whole process).
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "device/cuda/factory.h"
#include "device/device.h"

namespace tessera::collectives::testing {

class RankMemory {
 public:
  virtual ~RankMemory() = default;
  // A buffer holding a copy of `bytes` (at least one byte long, so never null), complete when
  // this returns, valid until Release().
  virtual Result<void*> Put(const std::vector<std::byte>& bytes) = 0;
  // The first `size` bytes of a buffer from Put, once every call issued so far is done.
  virtual Result<std::vector<std::byte>> Get(const void* address, size_t size) = 0;
  // Frees every buffer from Put.
  virtual void Release() = 0;
};

class HostRankMemory final : public RankMemory {
 public:
  Result<void*> Put(const std::vector<std::byte>& bytes) override {
    std::vector<std::byte>& copy = buffers_.emplace_back(bytes);
    if (copy.empty()) copy.resize(1);
    return static_cast<void*>(copy.data());
  }
  Result<std::vector<std::byte>> Get(const void* address, size_t size) override {
    const auto* begin = static_cast<const std::byte*>(address);
    return std::vector<std::byte>(begin, begin + size);
  }
  void Release() override { buffers_.clear(); }

 private:
  std::deque<std::vector<std::byte>> buffers_;
};

// Buffers from a CUDA Device of the rank's own GPU (the pool keeps them between Release()s).
class CudaRankMemory final : public RankMemory {
 public:
  static Result<std::unique_ptr<RankMemory>> Open(int device_index) {
    CudaDeviceOptions options;
    options.device_index = device_index;
    ASSIGN_OR_RETURN(auto device, CreateCudaDevice(options));
    return std::unique_ptr<RankMemory>(new CudaRankMemory(std::move(device)));
  }
  ~CudaRankMemory() override { Release(); }

  Result<void*> Put(const std::vector<std::byte>& bytes) override {
    ASSIGN_OR_RETURN(DeviceBuffer buffer, device_->Allocate(std::max<size_t>(1, bytes.size())));
    if (!bytes.empty()) RETURN_IF_ERROR(device_->CopyHostToDevice(bytes.data(), buffer, 0, bytes.size()));
    // NCCL reads it on its own stream: the copy on the device's stream must be done first.
    RETURN_IF_ERROR(device_->Synchronize());
    buffers_.push_back(std::move(buffer));
    return buffers_.back().data();
  }
  Result<std::vector<std::byte>> Get(const void* address, size_t size) override {
    for (const DeviceBuffer& buffer : buffers_) {
      if (buffer.data() != address) continue;
      std::vector<std::byte> host(size);
      if (size > 0) RETURN_IF_ERROR(device_->CopyDeviceToHost(buffer, 0, host.data(), size));
      return host;
    }
    return InternalError("no device buffer at the address asked for");
  }
  void Release() override { buffers_.clear(); }

 private:
  explicit CudaRankMemory(std::unique_ptr<Device> device) : device_(std::move(device)) {}
  std::unique_ptr<Device> device_;
  std::deque<DeviceBuffer> buffers_;
};

// The memory a rank of `backend` hands its communicator.
inline Result<std::unique_ptr<RankMemory>> MemoryFor(const std::string& backend, int rank) {
  if (backend == "nccl") return CudaRankMemory::Open(rank);
  return std::unique_ptr<RankMemory>(new HostRankMemory());
}

}  // namespace tessera::collectives::testing
