#include "collectives/nccl/factory.h"

#include "tessera/config.h"

#if TESSERA_HAVE_NCCL
#include "collectives/nccl/communicator.h"
#endif

namespace tessera::collectives {
namespace {

class NcclBackend final : public CommunicatorBackend {
 public:
  std::string_view name() const override { return "nccl"; }
  int priority() const override { return 400; }
  Status Viable(const CommunicatorOptions& options) const override {
#if TESSERA_HAVE_NCCL
    if (options.location != BufferLocation::kDevice) {
      return FailedPreconditionError("nccl moves CUDA device buffers only");
    }
    return NcclCommunicator::DevicePresent();
#else
    return UnimplementedError("built without NCCL (TESSERA_WITH_NCCL, needs CUDA and nccl.h)");
#endif
  }
  Result<std::unique_ptr<Communicator>> Create(const CommunicatorOptions& options,
                                               std::shared_ptr<Store> store) const override {
#if TESSERA_HAVE_NCCL
    ASSIGN_OR_RETURN(auto communicator, NcclCommunicator::Create(options, *store));
    return std::unique_ptr<Communicator>(std::move(communicator));
#else
    return Viable(options);
#endif
  }
};

}  // namespace

std::unique_ptr<CommunicatorBackend> MakeNcclBackend() { return std::make_unique<NcclBackend>(); }

Result<NcclEnvironment> ProbeNcclEnvironment() {
#if TESSERA_HAVE_NCCL
  return NcclCommunicator::Probe();
#else
  return UnimplementedError("built without NCCL (TESSERA_WITH_NCCL, needs CUDA and nccl.h)");
#endif
}

}  // namespace tessera::collectives
