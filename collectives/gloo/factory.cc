#include "collectives/gloo/factory.h"

#include "tessera/config.h"

#if TESSERA_HAVE_GLOO
#include "base/backend_module.h"
#include "collectives/gloo/module.h"
#endif

namespace tessera::collectives {
namespace {

#if TESSERA_HAVE_GLOO

// libtessera_gloo.so, loaded once, by the first gloo communicator this process creates; the
// reason when it cannot be.
const Result<const GlooModule*>& LoadedGlooModule() {
  static const Result<const GlooModule*> loaded =
      LoadModuleTable<GlooModule>("gloo", kGlooModuleFile, kGlooModuleEntry, kGlooModuleAbiVersion);
  return loaded;
}

#endif

class GlooBackend final : public CommunicatorBackend {
 public:
  std::string_view name() const override { return "gloo"; }
  int priority() const override { return 200; }
  Status Viable(const CommunicatorOptions& options) const override {
#if TESSERA_HAVE_GLOO
    if (options.location != BufferLocation::kHost) {
      return FailedPreconditionError("this build's gloo backend moves host buffers only");
    }
    // Decided by the build alone, so that every member of a cohort choosing "auto" chooses
    // alike; the module is loaded by Create, which says so when it cannot be.
    return Status::Ok();
#else
    return UnimplementedError("built without Gloo (TESSERA_WITH_GLOO; Debian: libgloo-dev)");
#endif
  }
  Result<std::unique_ptr<Communicator>> Create(const CommunicatorOptions& options,
                                               std::shared_ptr<Store> store) const override {
#if TESSERA_HAVE_GLOO
    const Result<const GlooModule*>& module = LoadedGlooModule();
    if (!module.ok()) return module.status();
    return (*module)->create(options, *store);
#else
    return Viable(options);
#endif
  }
};

}  // namespace

std::unique_ptr<CommunicatorBackend> MakeGlooBackend() { return std::make_unique<GlooBackend>(); }

}  // namespace tessera::collectives
