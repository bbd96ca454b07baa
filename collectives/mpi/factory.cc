#include "collectives/mpi/factory.h"

#include <cstdlib>
#include <string>

#include "tessera/config.h"

#if TESSERA_HAVE_MPI
#include "base/backend_module.h"
#include "collectives/mpi/module.h"
#endif

namespace tessera::collectives {
namespace {

#if TESSERA_HAVE_MPI

// libtessera_mpi.so, loaded once, by the first mpi communicator this process creates; the
// reason when it cannot be.
const Result<const MpiModule*>& LoadedMpiModule() {
  static const Result<const MpiModule*> loaded = LoadModuleTable<MpiModule>(
      "mpi", kMpiModuleFile, kMpiModuleEntry, kMpiModuleAbiVersion, ModuleSymbols::kGlobal);
  return loaded;
}

#endif

class MpiBackend final : public CommunicatorBackend {
 public:
  std::string_view name() const override { return "mpi"; }
  int priority() const override { return 300; }
  Status Viable(const CommunicatorOptions& options) const override {
#if TESSERA_HAVE_MPI
    if (options.location != BufferLocation::kHost) {
      return FailedPreconditionError("this build's mpi backend moves host buffers only");
    }
    const char* world_size = std::getenv("OMPI_COMM_WORLD_SIZE");
    const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (world_size == nullptr || world_rank == nullptr) {
      return FailedPreconditionError("not launched by mpirun (OMPI_COMM_WORLD_SIZE is unset)");
    }
    if (std::atoi(world_size) != options.size || std::atoi(world_rank) != options.rank) {
      return FailedPreconditionError(std::string("mpirun launched rank ") + world_rank + " of " +
                                     world_size + ", options ask for rank " +
                                     std::to_string(options.rank) + " of " +
                                     std::to_string(options.size));
    }
    return Status::Ok();
#else
    return UnimplementedError("built without MPI (TESSERA_WITH_MPI; Debian: libopenmpi-dev)");
#endif
  }
  Result<std::unique_ptr<Communicator>> Create(const CommunicatorOptions& options,
                                               std::shared_ptr<Store>) const override {
#if TESSERA_HAVE_MPI
    const Result<const MpiModule*>& module = LoadedMpiModule();
    if (!module.ok()) return module.status();
    return (*module)->create(options);
#else
    return Viable(options);
#endif
  }
};

}  // namespace

Result<int> MpiMaxTag(bool present, int tag_upper_bound) {
  constexpr int kStandardMinimum = 32767;  // MPI standard, "Tag values"
  if (!present) return kStandardMinimum;
  if (tag_upper_bound < kStandardMinimum) {
    return FailedPreconditionError("mpi: MPI_TAG_UB is " + std::to_string(tag_upper_bound) +
                                   ", below the " + std::to_string(kStandardMinimum) +
                                   " the MPI standard guarantees");
  }
  return tag_upper_bound;
}

std::unique_ptr<CommunicatorBackend> MakeMpiBackend() { return std::make_unique<MpiBackend>(); }

}  // namespace tessera::collectives
