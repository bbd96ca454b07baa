#include "collectives/p2p/communicator.h"

namespace tessera::collectives {

P2PCommunicator::P2PCommunicator(std::unique_ptr<TcpMesh> mesh,
                                 std::chrono::milliseconds default_timeout,
                                 AlgorithmTuning tuning)
    : Communicator(mesh->rank(), mesh->size(), default_timeout),
      mesh_(std::move(mesh)),
      algorithms_(mesh_.get(), tuning),
      sent_to_(mesh_->size(), 0),
      received_from_(mesh_->size(), 0) {}

const CommunicatorCapabilities& P2PCommunicator::capabilities() const {
  static const CommunicatorCapabilities kCapabilities{
      AllCollectiveOps(), AllReduceOps(), AllDataTypes(), {BufferLocation::kHost},
      /*verifies_calls=*/true};
  return kCapabilities;
}

Status P2PCommunicator::DoAllreduce(const void* send, void* recv, size_t count, DataType type,
                                    ReduceOp op, Deadline deadline) {
  return algorithms_.Allreduce(send, recv, count, type, op, collective_sequence_++, deadline);
}

Status P2PCommunicator::DoBroadcast(void* buffer, size_t count, DataType type, int root,
                                    Deadline deadline) {
  return algorithms_.Broadcast(buffer, count, type, root, collective_sequence_++, deadline);
}

Status P2PCommunicator::DoAllgather(const void* send, void* recv, size_t count, DataType type,
                                    Deadline deadline) {
  return algorithms_.Allgather(send, recv, count, type, collective_sequence_++, deadline);
}

Status P2PCommunicator::DoReduceScatter(const void* send, void* recv, size_t count,
                                        DataType type, ReduceOp op, Deadline deadline) {
  return algorithms_.ReduceScatter(send, recv, count, type, op, collective_sequence_++,
                                   deadline);
}

Status P2PCommunicator::DoBarrier(Deadline deadline) {
  return algorithms_.Barrier(collective_sequence_++, deadline);
}

Status P2PCommunicator::DoSend(const void* buffer, size_t count, DataType type, int peer,
                               int tag, Deadline deadline) {
  OutgoingMessage out{peer,
                      MakeHeader(CollectiveOp::kSend, type, ReduceOp::kSum, tag, sent_to_[peer]++,
                                 count, count * DataTypeSize(type)),
                      buffer};
  return mesh_->Exchange(&out, nullptr, deadline);
}

Status P2PCommunicator::DoRecv(void* buffer, size_t count, DataType type, int peer, int tag,
                               Deadline deadline) {
  IncomingMessage in{peer,
                     MakeHeader(CollectiveOp::kSend, type, ReduceOp::kSum, tag,
                                received_from_[peer]++, count, count * DataTypeSize(type)),
                     buffer};
  return mesh_->Exchange(nullptr, &in, deadline);
}

}  // namespace tessera::collectives
