// Shared fixtures for the collectives tests: how each backend under test is created for a
// rank, on threads (HashStore, in-memory hub) or forked processes (TcpStore).
#pragma once

#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>

#include "collectives/fallback.h"
#include "collectives/local/communicator.h"
#include "collectives/registry.h"
#include "collectives/store/hash_store.h"
#include "collectives/store/tcp_store.h"
#include "collectives/verified.h"
#include "peer_group.h"

namespace tessera::collectives::testing {

// Hides every op of a communicator except Send/Recv, so FallbackCommunicator must compose
// all collectives from point-to-point messages.
class SendRecvOnly final : public Communicator {
 public:
  explicit SendRecvOnly(std::unique_ptr<Communicator> base)
      : Communicator(base->rank(), base->size(), base->default_timeout()), base_(std::move(base)) {
    capabilities_ = base_->capabilities();
    capabilities_.native_ops = {CollectiveOp::kSend, CollectiveOp::kRecv};
    capabilities_.native_reduce_ops.clear();
  }
  std::string_view backend_name() const override { return "sendrecv-only"; }
  const CommunicatorCapabilities& capabilities() const override { return capabilities_; }

 protected:
  Status DoSend(const void* buffer, size_t count, DataType type, int peer, int tag,
                Deadline deadline) override {
    return CallSend(*base_, buffer, count, type, peer, tag, deadline);
  }
  Status DoRecv(void* buffer, size_t count, DataType type, int peer, int tag,
                Deadline deadline) override {
    return CallRecv(*base_, buffer, count, type, peer, tag, deadline);
  }

 private:
  std::unique_ptr<Communicator> base_;
  CommunicatorCapabilities capabilities_;
};

// One group of ranks: its store(s) and in-memory hub.
class World {
 public:
  World(int size, RankMode mode) : size_(size), mode_(mode) {
    static std::atomic<int> counter{0};
    prefix_ = "test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    hub_ = std::make_shared<LocalHub>(size);
    if (mode == RankMode::kThreads) {
      store_ = std::make_shared<HashStore>();
    } else {
      auto server = TcpStoreServer::Start("127.0.0.1", 0);
      if (server.ok()) server_ = std::move(server).value();
    }
  }

  const std::string& prefix() const { return prefix_; }

  // Call from the rank itself (after fork for processes).
  Result<std::shared_ptr<Store>> StoreForRank() {
    if (mode_ == RankMode::kThreads) return store_;
    if (server_ == nullptr) return UnavailableError("store server did not start");
    ASSIGN_OR_RETURN(auto client, TcpStore::Connect("127.0.0.1", server_->port(),
                                                    std::chrono::seconds(10)));
    return std::shared_ptr<Store>(client);
  }

  // backend: p2p, gloo, mpi, nccl (through CreateCommunicator), sendrecv-local (in-memory
  // send/recv + fallback), sendrecv-p2p (p2p's send/recv only + fallback), verified-local
  // (sendrecv-local inside VerifiedCommunicator: the wrapper without Gloo or MPI).
  Result<std::unique_ptr<Communicator>> Create(const std::string& backend, int rank,
                                               int timeout_ms, bool verify_calls = true) {
    const auto timeout = std::chrono::milliseconds(timeout_ms);
    if (backend == "sendrecv-local" || backend == "verified-local") {
      std::unique_ptr<Communicator> local = std::make_unique<FallbackCommunicator>(
          std::make_unique<LocalCommunicator>(hub_, rank, timeout), BufferLocation::kHost);
      if (backend == "sendrecv-local") return local;
      return std::unique_ptr<Communicator>(std::make_unique<VerifiedCommunicator>(std::move(local)));
    }
    ASSIGN_OR_RETURN(auto store, StoreForRank());
    CommunicatorOptions options;
    options.backend = backend == "sendrecv-p2p" ? "p2p" : backend;
    options.rank = rank;
    options.size = size_;
    options.prefix = prefix_;
    options.timeout_ms = timeout_ms;
    options.verify_calls = verify_calls;
    ASSIGN_OR_RETURN(auto communicator, CreateCommunicator(options, store));
    if (backend == "sendrecv-p2p") {
      return std::unique_ptr<Communicator>(std::make_unique<FallbackCommunicator>(
          std::make_unique<SendRecvOnly>(std::move(communicator)), BufferLocation::kHost));
    }
    return communicator;
  }

 private:
  int size_;
  RankMode mode_;
  std::string prefix_;
  std::shared_ptr<LocalHub> hub_;
  std::shared_ptr<Store> store_;
  std::unique_ptr<TcpStoreServer> server_;
};

// Empty when `backend` can run here, otherwise the reason to skip.
inline std::string SkipReason(const std::string& backend) {
  if (backend != "mpi" && backend != "nccl" && backend != "gloo") return "";
  const CommunicatorBackend* found = CommunicatorRegistry::Global().Find(backend);
  if (found == nullptr) return backend + " is not registered";
  CommunicatorOptions options;
  options.size = 2;
  options.location = backend == "nccl" ? BufferLocation::kDevice : BufferLocation::kHost;
  Status viable = found->Viable(options);
  return viable.ok() ? "" : viable.ToString();
}

}  // namespace tessera::collectives::testing
