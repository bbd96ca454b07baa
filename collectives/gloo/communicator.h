// GlooCommunicator: Gloo (gloo::transport::tcp) behind the Communicator interface. Built
// only when TESSERA_HAVE_GLOO. Native: allreduce (sum, max, min; ring for large messages),
// allgather, broadcast, barrier, send/recv (unbound buffers, one slot per tag). Reduce-scatter
// and avg are composed by FallbackCommunicator. Gloo's exceptions become Status values:
// timeouts DEADLINE_EXCEEDED, I/O errors UNAVAILABLE. Gloo names peers by address, so its
// errors carry Gloo's text rather than a rank; the rendezvous's own name the ranks that did not
// connect, and the whole rendezvous (store waits and every pair's connect) ends by one deadline,
// options.timeout_ms from Create's start. Creating one sets SIGPIPE to SIG_IGN when it
// is at its default: Gloo writes without MSG_NOSIGNAL, and a dead peer would kill the process.
#pragma once

#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/store/store.h"

namespace gloo {
class Context;
}

namespace tessera::collectives {

class GlooCommunicator final : public Communicator {
 public:
  // Rendezvous through `store` (already namespaced); listens on bind_address.
  static Result<std::unique_ptr<GlooCommunicator>> Create(const CommunicatorOptions& options,
                                                          Store& store);
  ~GlooCommunicator() override;

  std::string_view backend_name() const override { return "gloo"; }
  const CommunicatorCapabilities& capabilities() const override;

 protected:
  Status DoAllreduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                     Deadline deadline) override;
  Status DoBroadcast(void* buffer, size_t count, DataType type, int root,
                     Deadline deadline) override;
  Status DoAllgather(const void* send, void* recv, size_t count, DataType type,
                     Deadline deadline) override;
  Status DoBarrier(Deadline deadline) override;
  Status DoSend(const void* buffer, size_t count, DataType type, int peer, int tag,
                Deadline deadline) override;
  Status DoRecv(void* buffer, size_t count, DataType type, int peer, int tag,
                Deadline deadline) override;

 private:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, int rank, int size,
                   std::chrono::milliseconds timeout);
  uint32_t NextTag() { return static_cast<uint32_t>(sequence_++ & 0x7fffffff); }

  std::shared_ptr<gloo::Context> context_;
  uint64_t sequence_ = 0;
  std::vector<std::byte> scratch_;
};

}  // namespace tessera::collectives
