#include "collectives/registry.h"

#include <algorithm>
#include <mutex>

#include "base/escape.h"
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

namespace {

// Where rank 0 publishes the backend it chose for "auto", and where a member that cannot use
// it says why. "auto" names no backend, so these keys never meet a backend's own.
std::string AutoChoiceKey(const std::string& prefix) { return prefix + "/auto/backend"; }
std::string AutoRefusedKey(const std::string& prefix) { return prefix + "/auto/refused"; }

// The backend every rank of the cohort uses for "auto": rank 0's choice, which it publishes
// and the others read. Members built or launched differently may each prefer another backend;
// one that cannot use rank 0's fails at once, naming both choices, and leaves its reason for
// rank 0.
Result<const CommunicatorBackend*> AgreeOnAuto(const CommunicatorRegistry& registry,
                                               const CommunicatorOptions& options, Store& store,
                                               Deadline deadline) {
  const std::string key = AutoChoiceKey(options.prefix);
  if (options.rank == 0) {
    ASSIGN_OR_RETURN(const CommunicatorBackend* chosen, registry.Choose(options));
    Status published = store.Set(key, std::string(chosen->name()));
    if (!published.ok()) {
      return published.WithContext("rank 0 publishing its choice of backend '" +
                                   std::string(chosen->name()) + "' for 'auto'");
    }
    return chosen;
  }
  const std::string who =
      "rank " + std::to_string(options.rank) + " of " + std::to_string(options.size);
  auto published = store.Get(key, std::chrono::milliseconds(MillisecondsLeft(deadline)));
  if (!published.ok() && published.status().code() == StatusCode::kDeadlineExceeded) {
    return DeadlineExceededError(
        who + ": rank 0 did not publish a backend choice for 'auto' at " + QuoteUntrusted(key) +
        " within " + std::to_string(options.timeout_ms) +
        " ms: rank 0 may run an older version that does not publish one, or may not have "
        "started (every member of a cohort choosing 'auto' uses rank 0's choice; naming a "
        "backend skips this step): " + published.status().message());
  }
  if (!published.ok()) {
    return published.status().WithContext(
        who + ": waiting for the backend rank 0 chose for 'auto' (every member of a cohort "
              "choosing 'auto' uses rank 0's choice)");
  }
  const std::string& name = *published;
  const CommunicatorBackend* backend = registry.Find(name);
  Status viable = backend == nullptr
                      ? UnimplementedError("this build has no backend of that name")
                      : backend->Viable(options);
  if (viable.ok()) return backend;
  auto local = registry.Choose(options);
  const std::string here =
      local.ok() ? "'auto' here would choose '" + std::string((*local)->name()) + "'"
                 : "no backend is viable here either";
  const std::string why = who + ": backend " + QuoteUntrusted(name) +
                          ", which rank 0 chose for 'auto', is not viable here (" +
                          viable.ToString() + "); " + here;
  (void)store.Set(AutoRefusedKey(options.prefix), why);  // for rank 0's error; best effort
  return FailedPreconditionError(why);
}

}  // namespace

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
  // One deadline for the whole creation: the wait for rank 0's "auto" choice and the
  // backend's rendezvous share timeout_ms.
  const Deadline deadline = Clock::now() + std::chrono::milliseconds(options.timeout_ms);
  const CommunicatorRegistry& registry = CommunicatorRegistry::Global();
  const bool agree = options.backend == "auto" && options.size > 1;
  ASSIGN_OR_RETURN(const CommunicatorBackend* backend,
                   agree ? AgreeOnAuto(registry, options, *store, deadline)
                         : registry.Choose(options));
  auto scoped =
      std::make_shared<PrefixStore>(options.prefix + "/" + std::string(backend->name()), store);
  // The backend bounds its rendezvous by timeout_ms: give it what is left, rounded up (at
  // least 1 ms, so that it still looks once), and its communicator's default back afterwards.
  CommunicatorOptions backend_options = options;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  backend_options.timeout_ms =
      static_cast<int>(std::clamp<int64_t>(left.count(), 1, options.timeout_ms));
  auto created = backend->Create(backend_options, scoped);
  if (!created.ok()) {
    Status failed = created.status();
    if (agree && options.rank == 0) {
      // A member that could not use this rank's choice never joined the rendezvous: say why.
      auto refused = store->Get(AutoRefusedKey(options.prefix), std::chrono::milliseconds(0));
      if (refused.ok()) {
        failed = failed.WithContext("rank 0 chose '" + std::string(backend->name()) +
                                    "' for 'auto' and another member refused it: " +
                                    EscapeUntrusted(*refused, 512));
      }
    }
    return failed.WithContext("creating " + std::string(backend->name()) +
                                        " communicator for rank " + std::to_string(options.rank) +
                                        " of " + std::to_string(options.size));
  }
  std::unique_ptr<Communicator> communicator = std::move(created).value();
  communicator->default_timeout_ = std::chrono::milliseconds(options.timeout_ms);
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
