#include "collectives/mpi/factory.h"

namespace tessera::collectives {
namespace {

class MpiBackend final : public CommunicatorBackend {
 public:
  std::string_view name() const override { return "mpi"; }
  int priority() const override { return 300; }
  Status Viable(const CommunicatorOptions&) const override {
    return UnimplementedError("the mpi backend is not written yet");
  }
  Result<std::unique_ptr<Communicator>> Create(const CommunicatorOptions& options,
                                               std::shared_ptr<Store>) const override {
    return Viable(options);
  }
};

}  // namespace

std::unique_ptr<CommunicatorBackend> MakeMpiBackend() { return std::make_unique<MpiBackend>(); }

}  // namespace tessera::collectives
