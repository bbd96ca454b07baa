#include "collectives/nccl/factory.h"

#include <string>

#include "tessera/config.h"

#if TESSERA_HAVE_NCCL
#include "base/backend_module.h"
#include "collectives/nccl/module.h"
#endif

namespace tessera::collectives {
namespace {

#if TESSERA_HAVE_NCCL

// libtessera_nccl.so, loaded once on first use; the reason when it cannot be. Without the CUDA
// driver no rank can run, so the module (and NCCL with it) is not even mapped.
const Result<const NcclModule*>& LoadedNcclModule() {
  static const Result<const NcclModule*> loaded = []() -> Result<const NcclModule*> {
    if (Status driver = LoadSystemLibrary("libcuda.so.1"); !driver.ok()) {
      return FailedPreconditionError("no CUDA driver: " + driver.message());
    }
    return LoadModuleTable<NcclModule>("nccl", kNcclModuleFile, kNcclModuleEntry, kNcclModuleAbiVersion);
  }();
  return loaded;
}

#endif

class NcclBackend final : public CommunicatorBackend {
 public:
  std::string_view name() const override { return "nccl"; }
  int priority() const override { return 400; }
  Status Viable(const CommunicatorOptions& options) const override {
#if TESSERA_HAVE_NCCL
    // Asked before anything is loaded: a host-buffer communicator never maps NCCL.
    if (options.location != BufferLocation::kDevice) {
      return FailedPreconditionError("nccl moves CUDA device buffers only");
    }
    const Result<const NcclModule*>& module = LoadedNcclModule();
    if (!module.ok()) return module.status();
    return (*module)->device_present();
#else
    return UnimplementedError("built without NCCL (TESSERA_WITH_NCCL, needs CUDA and nccl.h)");
#endif
  }
  Result<std::unique_ptr<Communicator>> Create(const CommunicatorOptions& options,
                                               std::shared_ptr<Store> store) const override {
#if TESSERA_HAVE_NCCL
    const Result<const NcclModule*>& module = LoadedNcclModule();
    if (!module.ok()) return module.status();
    return (*module)->create(options, *store);
#else
    return Viable(options);
#endif
  }
};

}  // namespace

std::unique_ptr<CommunicatorBackend> MakeNcclBackend() { return std::make_unique<NcclBackend>(); }

Result<NcclEnvironment> ProbeNcclEnvironment() {
#if TESSERA_HAVE_NCCL
  const Result<const NcclModule*>& module = LoadedNcclModule();
  if (!module.ok()) return module.status();
  return (*module)->probe();
#else
  return UnimplementedError("built without NCCL (TESSERA_WITH_NCCL, needs CUDA and nccl.h)");
#endif
}

}  // namespace tessera::collectives
