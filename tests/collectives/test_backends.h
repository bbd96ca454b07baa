// Shared fixtures for the collectives tests: how each backend under test is created for a
// rank, on threads (HashStore, in-memory hub) or forked processes (TcpStore), and whether it
// can run here.
//
// Forked ranks and threads. A rank forked while another thread of this process holds a lock
// keeps that lock held: forked ranks' store runs in a process of its own (World).
//
// NCCL and fork. CUDA is not fork-safe: once this process has initialised it, a forked child
// cannot use it. So this process asks NCCL and CUDA nothing itself: whether NCCL can run, and
// on how many GPUs, is probed once in a forked child (ProbeNcclHere). Ranks run as threads
// initialise CUDA here (World::Create marks it), after which NCCL ranks as forked processes
// are skipped with that reason: run such a test in a process of its own, as ctest does.
#pragma once

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>

#include "collectives/fallback.h"
#include "collectives/local/communicator.h"
#include "collectives/nccl/factory.h"
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

// Hides every op of a communicator but Allreduce with sum: an allgather must go through the
// zero-padded allreduce route, and a float16 average is widened to float32 around it.
class SumAllreduceOnly final : public Communicator {
 public:
  explicit SumAllreduceOnly(std::unique_ptr<Communicator> base)
      : Communicator(base->rank(), base->size(), base->default_timeout()), base_(std::move(base)) {
    capabilities_ = base_->capabilities();
    capabilities_.native_ops = {CollectiveOp::kAllreduce};
    capabilities_.native_reduce_ops = {ReduceOp::kSum};
  }
  std::string_view backend_name() const override { return "sum-allreduce-only"; }
  const CommunicatorCapabilities& capabilities() const override { return capabilities_; }

 protected:
  Status DoAllreduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                     Deadline deadline) override {
    return CallAllreduce(*base_, send, recv, count, type, op, deadline);
  }

 private:
  std::unique_ptr<Communicator> base_;
  CommunicatorCapabilities capabilities_;
};

// True once a test in this process has run NCCL ranks as threads (CUDA is initialised here).
inline std::atomic<bool>& CudaInitialisedHere() {
  static std::atomic<bool> initialised{false};
  return initialised;
}

// Whether NCCL can run here, from a forked child (see the top of this file).
struct NcclHere {
  std::string not_viable;  // why not; empty when it can
  int devices = 0;         // CUDA devices visible: at most one NCCL rank each
  std::string version;     // of the linked NCCL library
};

inline const NcclHere& ProbeNcclHere() {
  static const NcclHere here = [] {
    NcclHere probed;
    int fds[2];
    if (::pipe(fds) != 0) {
      probed.not_viable = "pipe() failed before probing NCCL";
      return probed;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      CommunicatorOptions options;
      options.location = BufferLocation::kDevice;
      const CommunicatorBackend* backend = CommunicatorRegistry::Global().Find("nccl");
      Status viable = backend == nullptr ? NotFoundError("nccl is not registered") : backend->Viable(options);
      auto environment = ProbeNcclEnvironment();
      if (viable.ok() && !environment.ok()) viable = environment.status();
      const std::string reply = std::to_string(environment.ok() ? environment->devices : 0) + "\n" +
                                (environment.ok() ? environment->version : "") + "\n" +
                                (viable.ok() ? "" : viable.ToString());
      size_t off = 0;
      while (off < reply.size()) {
        const ssize_t n = ::write(fds[1], reply.data() + off, reply.size() - off);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      ::_exit(0);
    }
    ::close(fds[1]);
    std::string reply;
    char buffer[1024];
    ssize_t n;
    while ((n = ::read(fds[0], buffer, sizeof(buffer))) > 0) reply.append(buffer, n);
    ::close(fds[0]);
    int wstatus = 0;
    if (pid > 0) ::waitpid(pid, &wstatus, 0);
    const size_t first = reply.find('\n');
    const size_t second = first == std::string::npos ? first : reply.find('\n', first + 1);
    if (pid < 0 || second == std::string::npos) {
      probed.not_viable = "the child probing NCCL died before answering";
      return probed;
    }
    probed.devices = std::atoi(reply.substr(0, first).c_str());
    probed.version = reply.substr(first + 1, second - first - 1);
    probed.not_viable = reply.substr(second + 1);
    return probed;
  }();
  return here;
}

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
      StartStoreProcess();
    }
  }
  ~World() {
    if (store_pid_ > 0) {
      ::kill(store_pid_, SIGKILL);
      ::waitpid(store_pid_, nullptr, 0);
    }
  }
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  const std::string& prefix() const { return prefix_; }

  // Call from the rank itself (after fork for processes).
  Result<std::shared_ptr<Store>> StoreForRank() {
    if (mode_ == RankMode::kThreads) return store_;
    if (store_port_ == 0) return UnavailableError("store server did not start");
    ASSIGN_OR_RETURN(auto client, TcpStore::Connect("127.0.0.1", store_port_,
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
    if (backend == "nccl") {
      // Device buffers, one GPU per rank (the skip checks that there are enough for the
      // ranks that run together). A rank created alone, as in the deadline tests, takes its
      // rank's GPU modulo those visible: rank 1 of 2 runs on a one-GPU machine too.
      options.location = BufferLocation::kDevice;
      const int visible = ProbeNcclHere().devices;
      options.device_index = visible > 0 ? rank % visible : rank;
      if (mode_ == RankMode::kThreads) CudaInitialisedHere() = true;
    }
    ASSIGN_OR_RETURN(auto communicator, CreateCommunicator(options, store));
    if (backend == "sendrecv-p2p") {
      return std::unique_ptr<Communicator>(std::make_unique<FallbackCommunicator>(
          std::make_unique<SendRecvOnly>(std::move(communicator)), BufferLocation::kHost));
    }
    return communicator;
  }

 private:
  // Forked ranks meet at a TcpStoreServer in a process of its own, forked now, while this
  // process has no thread but its own: the ranks are then forked from a process without other
  // threads too. A store served by threads of this process had them take locks (an allocator's,
  // building a Status on each accept timeout) at any moment, and a rank forked meanwhile
  // inherited the lock held for good: glibc's malloc guards against that around fork, gcc 12's
  // AddressSanitizer allocator does not, and forked Gloo ranks hung so under ASan.
  void StartStoreProcess() {
    int fds[2];
    if (::pipe(fds) != 0) return;
    const pid_t pid = ::fork();
    if (pid < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      return;
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test
      ::close(fds[0]);
      auto server = TcpStoreServer::Start("127.0.0.1", 0);
      const int port = server.ok() ? (*server)->port() : 0;
      if (::write(fds[1], &port, sizeof(port)) != static_cast<ssize_t>(sizeof(port)) || port == 0) ::_exit(1);
      ::close(fds[1]);
      for (;;) ::pause();  // serves until the World ends it
    }
    ::close(fds[1]);
    store_pid_ = pid;
    int port = 0;
    ssize_t got = 0;
    while ((got = ::read(fds[0], &port, sizeof(port))) < 0 && errno == EINTR) {
    }
    ::close(fds[0]);
    if (got == static_cast<ssize_t>(sizeof(port))) store_port_ = port;
  }

  int size_;
  RankMode mode_;
  std::string prefix_;
  std::shared_ptr<LocalHub> hub_;
  std::shared_ptr<Store> store_;
  pid_t store_pid_ = -1;  // the store server's process, for forked ranks
  int store_port_ = 0;
};

// Why `size` NCCL ranks as `mode` cannot run where NCCL is `nccl`; empty when they can.
inline std::string NcclSkipReason(const NcclHere& nccl, int size, RankMode mode, bool cuda_initialised_here) {
  if (!nccl.not_viable.empty()) return nccl.not_viable;
  if (size > nccl.devices) {
    return std::to_string(size) + " NCCL ranks need " + std::to_string(size) + " GPUs (NCCL refuses two ranks " +
           "of one communicator on one GPU); " + std::to_string(nccl.devices) + " visible";
  }
  if (mode == RankMode::kProcesses && cuda_initialised_here) {
    return "an earlier test initialised CUDA in this process, and forked ranks cannot use it after that; "
           "run this test in a process of its own (as ctest does)";
  }
  return "";
}

// Empty when `backend` can run `size` ranks as `mode` here, otherwise the reason to skip.
inline std::string SkipReason(const std::string& backend, int size = 1, RankMode mode = RankMode::kThreads) {
  if (backend == "nccl") return NcclSkipReason(ProbeNcclHere(), size, mode, CudaInitialisedHere());
  if (backend != "mpi" && backend != "gloo") return "";
  const CommunicatorBackend* found = CommunicatorRegistry::Global().Find(backend);
  if (found == nullptr) return backend + " is not registered";
  CommunicatorOptions options;
  options.size = 2;
  Status viable = found->Viable(options);
  return viable.ok() ? "" : viable.ToString();
}

}  // namespace tessera::collectives::testing
