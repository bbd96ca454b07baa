// Backend registry and CreateCommunicator: the one way to get a Communicator.
//
//   auto store = std::make_shared<HashStore>();            // or FileStore / TcpStore
//   CommunicatorOptions options;
//   options.rank = rank; options.size = size; options.prefix = "job7/cohort2";
//   ASSIGN_OR_RETURN(auto comm, CreateCommunicator(options, store));
//   RETURN_IF_ERROR(comm->Allreduce(grad, grad, n, DataType::kFloat32, ReduceOp::kAvg));
//
// Backends register with a priority and say at run time whether they are viable here and,
// if not, why. options.backend = "auto" takes the highest-priority viable backend:
//   nccl (400)  device buffers, a GPU present, built with NCCL
//   mpi  (300)  host buffers, launched by mpirun (OMPI_COMM_WORLD_SIZE matches size)
//   gloo (200)  host buffers, built with Gloo
//   p2p  (100)  host buffers, always
// A named backend that is not viable is an error carrying its reason. The returned
// communicator is wrapped in FallbackCommunicator whenever the backend lacks an op, so
// every op of the Communicator interface works on every backend (for host buffers). A
// backend that cannot detect mismatched calls itself (capabilities().verifies_calls false:
// gloo, mpi, nccl) is wrapped, outermost, in VerifiedCommunicator unless
// options.verify_calls is false (collectives/verified.h).
//
// Viability is decided by each rank alone (its build, its environment: mpirun, a GPU), so
// ranks may differ in their "auto" choice. With "auto" and more than one rank, rank 0 chooses
// and publishes its choice at "<options.prefix>/auto/backend"; the others wait for it and use
// it. A rank 0 that never publishes one (an older version, or one not started) makes the
// others DEADLINE_EXCEEDED saying so and naming the key. A rank that cannot use it fails at once with
// FAILED_PRECONDITION naming the backend, why it is not viable there and what "auto" would
// choose there; it leaves that reason at "<options.prefix>/auto/refused", and rank 0's error,
// when its rendezvous then fails, carries it. A named backend skips this step.
//
// Rendezvous keys live under "<options.prefix>/<backend>/" in the store, so cohorts sharing a
// store do not collide. A prefix that ends in '/' (the coordinator's "rendezvous/JOB/ROUND/
// ATTEMPT/COHORT/") gives keys with "//" before the backend's name: every rank builds the same
// keys from the same prefix, and no store refuses them. Every rank must create its
// communicator within options.timeout_ms of the others.
//
// Creation as a whole is bounded by options.timeout_ms from the call: the wait for rank 0's
// "auto" choice and the backend's rendezvous share that one deadline (the backend's Create is
// given what is left). The communicator's default call timeout is options.timeout_ms all the
// same.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/store/store.h"

namespace tessera::collectives {

class CommunicatorBackend {
 public:
  virtual ~CommunicatorBackend() = default;
  virtual std::string_view name() const = 0;
  virtual int priority() const = 0;
  // OK when the backend can serve `options` here; otherwise FAILED_PRECONDITION (or
  // UNIMPLEMENTED when it was not built) saying why.
  virtual Status Viable(const CommunicatorOptions& options) const = 0;
  // Creates the backend's own communicator (not wrapped), rendezvousing through `store`
  // (already namespaced for this communicator).
  virtual Result<std::unique_ptr<Communicator>> Create(const CommunicatorOptions& options,
                                                       std::shared_ptr<Store> store) const = 0;
};

class CommunicatorRegistry {
 public:
  // The process-wide registry holding the built-in backends (nccl, mpi, gloo, p2p).
  static CommunicatorRegistry& Global();

  // Replaces a backend of the same name. Not thread-safe against concurrent Create.
  void Register(std::unique_ptr<CommunicatorBackend> backend);
  const CommunicatorBackend* Find(std::string_view name) const;
  // Highest priority first.
  std::vector<const CommunicatorBackend*> Backends() const;
  // The backend this rank would use for `options` on its own; for "auto", the first viable by
  // priority (CreateCommunicator then takes rank 0's choice on every rank). On failure the
  // message lists every backend's reason.
  Result<const CommunicatorBackend*> Choose(const CommunicatorOptions& options) const;

 private:
  std::vector<std::unique_ptr<CommunicatorBackend>> backends_;
};

// Creates this rank's communicator. Thread-safe; blocks for the rendezvous (bounded by
// options.timeout_ms).
Result<std::unique_ptr<Communicator>> CreateCommunicator(const CommunicatorOptions& options,
                                                         std::shared_ptr<Store> store);

}  // namespace tessera::collectives
