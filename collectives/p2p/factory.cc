#include "collectives/p2p/factory.h"

#include "collectives/p2p/communicator.h"

namespace tessera::collectives {
namespace {

class P2PBackend final : public CommunicatorBackend {
 public:
  std::string_view name() const override { return "p2p"; }
  int priority() const override { return 100; }
  Status Viable(const CommunicatorOptions& options) const override {
    if (options.location != BufferLocation::kHost) {
      return FailedPreconditionError("p2p moves host buffers only");
    }
    return Status::Ok();
  }
  Result<std::unique_ptr<Communicator>> Create(const CommunicatorOptions& options,
                                               std::shared_ptr<Store> store) const override {
    TcpMeshOptions mesh_options;
    mesh_options.rank = options.rank;
    mesh_options.size = options.size;
    mesh_options.cohort = options.prefix;
    mesh_options.bind_address = options.bind_address;
    mesh_options.connect_timeout = std::chrono::milliseconds(options.timeout_ms);
    ASSIGN_OR_RETURN(auto mesh, TcpMesh::Connect(mesh_options, *store));
    return std::unique_ptr<Communicator>(std::make_unique<P2PCommunicator>(
        std::move(mesh), std::chrono::milliseconds(options.timeout_ms)));
  }
};

}  // namespace

std::unique_ptr<CommunicatorBackend> MakeP2PBackend() { return std::make_unique<P2PBackend>(); }

}  // namespace tessera::collectives
