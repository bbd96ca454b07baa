#include "collectives/gloo/factory.h"

#include "tessera/config.h"

#if TESSERA_HAVE_GLOO
#include "collectives/gloo/communicator.h"
#endif

namespace tessera::collectives {
namespace {

class GlooBackend final : public CommunicatorBackend {
 public:
  std::string_view name() const override { return "gloo"; }
  int priority() const override { return 200; }
  Status Viable(const CommunicatorOptions& options) const override {
#if TESSERA_HAVE_GLOO
    if (options.location != BufferLocation::kHost) {
      return FailedPreconditionError("this build's gloo backend moves host buffers only");
    }
    return Status::Ok();
#else
    return UnimplementedError("built without Gloo (TESSERA_WITH_GLOO; Debian: libgloo-dev)");
#endif
  }
  Result<std::unique_ptr<Communicator>> Create(const CommunicatorOptions& options,
                                               std::shared_ptr<Store> store) const override {
#if TESSERA_HAVE_GLOO
    ASSIGN_OR_RETURN(auto communicator, GlooCommunicator::Create(options, *store));
    return std::unique_ptr<Communicator>(std::move(communicator));
#else
    return Viable(options);
#endif
  }
};

}  // namespace

std::unique_ptr<CommunicatorBackend> MakeGlooBackend() { return std::make_unique<GlooBackend>(); }

}  // namespace tessera::collectives
