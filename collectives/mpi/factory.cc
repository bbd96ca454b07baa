#include "collectives/mpi/factory.h"

#include <charconv>
#include <cstdlib>
#include <limits>
#include <string>

#include "base/escape.h"
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

// One of mpirun's variables as an int in [min, max]: decimal digits, the whole value.
Result<int> ParseMpiWorldVariable(const char* variable, std::string_view text, int min, int max) {
  int value = 0;
  const char* last = text.data() + text.size();
  const auto [end, error] = std::from_chars(text.data(), last, value);
  // from_chars takes a leading '-': a value must start with a digit ("-0" is no rank).
  if (text.empty() || text.front() < '0' || text.front() > '9' || error != std::errc() ||
      end != last || value < min || value > max) {
    return FailedPreconditionError(std::string(variable) + " is " + QuoteUntrusted(text) +
                                   ": expected a whole number from " + std::to_string(min) +
                                   " to " + std::to_string(max));
  }
  return value;
}

class MpiBackend final : public CommunicatorBackend {
 public:
  std::string_view name() const override { return "mpi"; }
  int priority() const override { return 300; }
  Status Viable(const CommunicatorOptions& options) const override {
#if TESSERA_HAVE_MPI
    if (options.location != BufferLocation::kHost) {
      return FailedPreconditionError("this build's mpi backend moves host buffers only");
    }
    return CheckMpiWorld(std::getenv("OMPI_COMM_WORLD_SIZE"), std::getenv("OMPI_COMM_WORLD_RANK"),
                         options.rank, options.size);
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

Status CheckMpiWorld(const char* world_size, const char* world_rank, int rank, int size) {
  if (world_size == nullptr || world_rank == nullptr) {
    return FailedPreconditionError(std::string("not launched by mpirun (") +
                                   (world_size == nullptr ? "OMPI_COMM_WORLD_SIZE"
                                                          : "OMPI_COMM_WORLD_RANK") +
                                   " is unset)");
  }
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  ASSIGN_OR_RETURN(const int launched_size,
                   ParseMpiWorldVariable("OMPI_COMM_WORLD_SIZE", world_size, 1, kMaxInt));
  ASSIGN_OR_RETURN(const int launched_rank, ParseMpiWorldVariable("OMPI_COMM_WORLD_RANK", world_rank,
                                                                  0, launched_size - 1));
  if (launched_size != size || launched_rank != rank) {
    return FailedPreconditionError("mpirun launched rank " + std::to_string(launched_rank) +
                                   " of " + std::to_string(launched_size) +
                                   ", options ask for rank " + std::to_string(rank) + " of " +
                                   std::to_string(size));
  }
  return Status::Ok();
}

std::unique_ptr<CommunicatorBackend> MakeMpiBackend() { return std::make_unique<MpiBackend>(); }

}  // namespace tessera::collectives
