// P2PCommunicator: every op native, built on TcpMesh with CollectiveAlgorithms. Host buffers,
// all dtypes and reduce ops. See tcp_mesh.h for the transport and its failure semantics.
#pragma once

#include <memory>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/communicator.h"
#include "collectives/p2p/tcp_mesh.h"

namespace tessera::collectives {

class P2PCommunicator final : public Communicator {
 public:
  P2PCommunicator(std::unique_ptr<TcpMesh> mesh, std::chrono::milliseconds default_timeout,
                  AlgorithmTuning tuning = {});

  std::string_view backend_name() const override { return "p2p"; }
  const CommunicatorCapabilities& capabilities() const override;
  // For tests and benchmarks: the algorithms and the mesh underneath.
  CollectiveAlgorithms& algorithms() { return algorithms_; }
  TcpMesh& mesh() { return *mesh_; }

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

 private:
  std::unique_ptr<TcpMesh> mesh_;
  CollectiveAlgorithms algorithms_;
  uint64_t collective_sequence_ = 0;
  std::vector<uint64_t> sent_to_;        // point-to-point messages sent, per peer
  std::vector<uint64_t> received_from_;  // point-to-point messages received, per peer
};

}  // namespace tessera::collectives
