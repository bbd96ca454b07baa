#include "collectives/nccl/factory.h"

namespace tessera::collectives {
namespace {

class NcclBackend final : public CommunicatorBackend {
 public:
  std::string_view name() const override { return "nccl"; }
  int priority() const override { return 400; }
  Status Viable(const CommunicatorOptions&) const override {
    return UnimplementedError("the nccl backend is not written yet");
  }
  Result<std::unique_ptr<Communicator>> Create(const CommunicatorOptions& options,
                                               std::shared_ptr<Store>) const override {
    return Viable(options);
  }
};

}  // namespace

std::unique_ptr<CommunicatorBackend> MakeNcclBackend() { return std::make_unique<NcclBackend>(); }

}  // namespace tessera::collectives
