#include "collectives/registry.h"

#include <algorithm>
#include <mutex>

#include "collectives/fallback.h"
#include "collectives/gloo/factory.h"
#include "collectives/mpi/factory.h"
#include "collectives/nccl/factory.h"
#include "collectives/p2p/factory.h"
#include "collectives/verified.h"

namespace tessera::collectives {

CommunicatorRegistry& CommunicatorRegistry::Global() {
  static CommunicatorRegistry* registry = [] {
    auto* r = new CommunicatorRegistry();
    r->Register(MakeNcclBackend());
    r->Register(MakeMpiBackend());
    r->Register(MakeGlooBackend());
    r->Register(MakeP2PBackend());
    return r;
  }();
  return *registry;
}

void CommunicatorRegistry::Register(std::unique_ptr<CommunicatorBackend> backend) {
  for (auto& existing : backends_) {
    if (existing->name() == backend->name()) {
      existing = std::move(backend);
      return;
    }
  }
  backends_.push_back(std::move(backend));
  std::stable_sort(backends_.begin(), backends_.end(),
                   [](const auto& a, const auto& b) { return a->priority() > b->priority(); });
}

const CommunicatorBackend* CommunicatorRegistry::Find(std::string_view name) const {
  for (const auto& backend : backends_) {
    if (backend->name() == name) return backend.get();
  }
  return nullptr;
}

std::vector<const CommunicatorBackend*> CommunicatorRegistry::Backends() const {
  std::vector<const CommunicatorBackend*> out;
  for (const auto& backend : backends_) out.push_back(backend.get());
  return out;
}

Result<const CommunicatorBackend*> CommunicatorRegistry::Choose(
    const CommunicatorOptions& options) const {
  if (options.backend != "auto") {
    const CommunicatorBackend* backend = Find(options.backend);
    if (backend == nullptr) {
      std::string known;
      for (const auto& b : backends_) known += (known.empty() ? "" : ", ") + std::string(b->name());
      return InvalidArgumentError("unknown collectives backend '" + options.backend +
                                  "' (known: auto, " + known + ")");
    }
    Status viable = backend->Viable(options);
    if (!viable.ok()) return viable.WithContext("backend " + options.backend + " is not viable here");
    return backend;
  }
  std::string reasons;
  for (const auto& backend : backends_) {
    Status viable = backend->Viable(options);
    if (viable.ok()) return backend.get();
    reasons += "; " + std::string(backend->name()) + ": " + viable.message();
  }
  return FailedPreconditionError("no collectives backend is viable for " +
                                 std::string(BufferLocationName(options.location)) + " buffers" +
                                 reasons);
}

Result<std::unique_ptr<Communicator>> CreateCommunicator(const CommunicatorOptions& options,
                                                         std::shared_ptr<Store> store) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return InvalidArgumentError("rank " + std::to_string(options.rank) + " out of range for size " +
                                std::to_string(options.size));
  }
  if (options.timeout_ms <= 0) {
    return InvalidArgumentError("timeout_ms must be > 0, got " + std::to_string(options.timeout_ms));
  }
  if (store == nullptr) return InvalidArgumentError("CreateCommunicator needs a store");
  ASSIGN_OR_RETURN(const CommunicatorBackend* backend, CommunicatorRegistry::Global().Choose(options));
  auto scoped =
      std::make_shared<PrefixStore>(options.prefix + "/" + std::string(backend->name()), store);
  auto created = backend->Create(options, scoped);
  if (!created.ok()) {
    return created.status().WithContext("creating " + std::string(backend->name()) +
                                        " communicator for rank " + std::to_string(options.rank) +
                                        " of " + std::to_string(options.size));
  }
  std::unique_ptr<Communicator> communicator = std::move(created).value();
  const bool verify = options.verify_calls && !communicator->capabilities().verifies_calls;
  if (FallbackCommunicator::Needed(communicator->capabilities())) {
    communicator =
        std::make_unique<FallbackCommunicator>(std::move(communicator), options.location);
  }
  // Outermost, so that every call is checked before the fallback splits it into the
  // backend's ops.
  if (verify) communicator = std::make_unique<VerifiedCommunicator>(std::move(communicator));
  return communicator;
}

}  // namespace tessera::collectives
