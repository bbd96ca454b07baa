#include "collectives/gloo/communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/address.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "collectives/reduce.h"
#include "collectives/scratch.h"

namespace tessera::collectives {
namespace {

// Gloo's rendezvous context, connected here rather than by Context::connectFullMesh so that
// the whole of it ends by one deadline. connectFullMesh gives every pair the context's timeout
// and connects the pairs one after another, each connect waiting up to five such timeouts for
// its peer: a peer that published its address and never connected held the rendezvous five
// times past its deadline, and as much again for every other such peer. Here every pair's
// timeout is what is left of the deadline when the pairs are made (a fifth of it, Gloo waiting
// five, and at least kLeastPairTimeout), the pairs connect all at once, one thread each, and a
// pair still not connected at the deadline is closed, which ends its wait: the rendezvous
// returns by its deadline, naming the ranks that did not connect. The store keys and what they
// hold are connectFullMesh's own (this rank's key is its number; its value, the address of
// each of its pairs, in the order of the peers' ranks).
class DeadlineContext final : public gloo::rendezvous::Context {
 public:
  static constexpr std::chrono::milliseconds kLeastPairTimeout{100};

  DeadlineContext(int rank, int size) : gloo::rendezvous::Context(rank, size) {}

  // `store` bounds each of its waits by the deadline (a DeadlineStore).
  Status Connect(Store& store, std::shared_ptr<gloo::transport::Device>& device, Deadline deadline,
                 std::chrono::milliseconds budget);

 private:
  struct Outcome {
    bool done = false;
    std::string error;  // Gloo's, when the connect threw
  };
};

Status DeadlineContext::Connect(Store& store, std::shared_ptr<gloo::transport::Device>& device,
                                Deadline deadline, std::chrono::milliseconds budget) {
  auto transport = device->createContext(rank, size);
  transport->setTimeout(std::max(kLeastPairTimeout,
                                 std::chrono::milliseconds((MillisecondsLeft(deadline) + 4) / 5)));
  std::vector<char> mine;
  size_t address_size = 0;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::vector<char> address = transport->createPair(peer)->address().bytes();
    address_size = address.size();
    mine.insert(mine.end(), address.begin(), address.end());
  }
  RETURN_IF_ERROR(store.Set(std::to_string(rank), std::string(mine.begin(), mine.end())));
  std::vector<std::string> keys;
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) keys.push_back(std::to_string(peer));
  }
  RETURN_IF_ERROR(store.Wait(keys, budget));
  std::vector<std::vector<char>> addresses(size);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    ASSIGN_OR_RETURN(std::string published, store.Get(std::to_string(peer), budget));
    const size_t expected = address_size * static_cast<size_t>(size - 1);
    if (published.size() != expected) {
      return InvalidArgumentError("rank " + std::to_string(peer) + " published " +
                                  std::to_string(published.size()) + " bytes of pair addresses, expected " +
                                  std::to_string(expected) + " (" + std::to_string(size - 1) + " of " +
                                  std::to_string(address_size) + ")");
    }
    // The peer's pairs skip the peer itself: this rank's is at rank, or rank - 1 above it.
    const size_t index = static_cast<size_t>(rank < peer ? rank : rank - 1);
    const char* at = published.data() + index * address_size;
    addresses[peer].assign(at, at + address_size);
  }

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Outcome> outcomes(size);  // guarded by mutex
  std::vector<std::thread> threads;
  Status started;
  for (int peer = 0; peer < size && started.ok(); ++peer) {
    if (peer == rank) continue;
    gloo::transport::Pair* pair = transport->getPair(peer).get();
    try {
      threads.emplace_back([&, pair, peer] {
        std::string error;
        try {
          pair->connect(addresses[peer]);
        } catch (const std::exception& thrown) {
          error = thrown.what();
        }
        std::lock_guard<std::mutex> lock(mutex);
        outcomes[peer].done = true;
        outcomes[peer].error = std::move(error);
        changed.notify_all();
      });
    } catch (const std::system_error& error) {
      started = UnavailableError("no thread to connect to rank " + std::to_string(peer) + ": " +
                                 error.what());
    }
  }
  std::vector<int> late;
  {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait_until(lock, started.ok() ? deadline : Clock::now(), [&] {
      for (int peer = 0; peer < size; ++peer) {
        if (peer != rank && !outcomes[peer].done) return false;
      }
      return true;
    });
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank && !outcomes[peer].done) late.push_back(peer);
    }
  }
  // A pair's connect waits until the pair is connected or closed: closing ends it now.
  for (int peer : late) transport->getPair(peer)->close();
  for (std::thread& thread : threads) thread.join();
  RETURN_IF_ERROR(started);

  std::string timed_out, gloo_said, failed;
  int timed_out_count = 0;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const Outcome& outcome = outcomes[peer];
    const bool was_late = std::find(late.begin(), late.end(), peer) != late.end();
    const std::string who = "rank " + std::to_string(peer);
    if (was_late || outcome.error.find("imeout") != std::string::npos) {
      // Closed at the deadline, or Gloo's own timeout (a fifth of the same time, five times).
      timed_out += (timed_out.empty() ? "" : ", ") + std::to_string(peer);
      if (!outcome.error.empty()) gloo_said += (gloo_said.empty() ? "" : "; ") + who + ": " + outcome.error;
      ++timed_out_count;
    } else if (!outcome.error.empty()) {
      failed += (failed.empty() ? "" : "; ") + who + ": " + outcome.error;
    }
  }
  if (!failed.empty()) return UnavailableError("could not connect to " + failed);
  if (timed_out_count > 0) {
    return DeadlineExceededError(std::string(timed_out_count == 1 ? "rank " : "ranks ") + timed_out +
                                 " did not connect within the rendezvous deadline of " +
                                 std::to_string(budget.count()) + " ms" +
                                 (gloo_said.empty() ? "" : " (" + gloo_said + ")"));
  }
  // Later pairs, and any wait given no timeout of its own, take the communicator's.
  transport->setTimeout(getTimeout());
  device_ = device;
  transportContext_ = std::move(transport);
  return Status::Ok();
}

Status FromException(const std::exception& error, int rank, const char* what) {
  std::string message = "gloo rank " + std::to_string(rank) + " " + what + ": " + error.what();
  if (message.find("imed out") != std::string::npos) return DeadlineExceededError(message);
  return UnavailableError(message);
}

std::chrono::milliseconds Left(Deadline deadline) {
  return std::chrono::milliseconds(std::max<int64_t>(1, MillisecondsLeft(deadline)));
}

// Calls fn with a typed null pointer of the C++ type matching `type`.
template <typename Fn>
void WithType(DataType type, Fn&& fn) {
  switch (type) {
    case DataType::kUint8: fn(static_cast<uint8_t*>(nullptr)); break;
    case DataType::kInt32: fn(static_cast<int32_t*>(nullptr)); break;
    case DataType::kInt64: fn(static_cast<int64_t*>(nullptr)); break;
    case DataType::kFloat16: fn(static_cast<uint16_t*>(nullptr)); break;
    case DataType::kFloat32: fn(static_cast<float*>(nullptr)); break;
    case DataType::kFloat64: fn(static_cast<double*>(nullptr)); break;
  }
}

}  // namespace

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::Context> context, int rank, int size,
                                   std::chrono::milliseconds timeout)
    : Communicator(rank, size, timeout), context_(std::move(context)) {}

GlooCommunicator::~GlooCommunicator() = default;

Result<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    const CommunicatorOptions& options, Store& store) {
  const auto timeout = std::chrono::milliseconds(options.timeout_ms);
  // Gloo's TCP transport writes without MSG_NOSIGNAL: a dead peer would kill this process
  // with SIGPIPE instead of failing the call. Ignore SIGPIPE unless the program handles it.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
  // One deadline for the whole rendezvous: every wait on the store and on the peers.
  const Deadline deadline = Clock::now() + timeout;
  DeadlineStore rendezvous(store, timeout, "gloo rendezvous");
  const std::string failed = "gloo rank " + std::to_string(options.rank) + " rendezvous failed";
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.bind_address;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<DeadlineContext>(options.rank, options.size);
    context->setTimeout(timeout);
    // The deadline's own error as it is; any other failure (the store's refusal, a peer's)
    // is UNAVAILABLE, as Gloo's own exceptions read.
    if (Status connected = context->Connect(rendezvous, device, deadline, timeout); !connected.ok()) {
      if (connected.code() == StatusCode::kDeadlineExceeded) return connected.WithContext(failed);
      return UnavailableError(failed + ": " + connected.message());
    }
    return std::unique_ptr<GlooCommunicator>(
        new GlooCommunicator(std::move(context), options.rank, options.size, timeout));
  } catch (const std::exception& error) {
    return FromException(error, options.rank, "rendezvous failed");
  }
}

const CommunicatorCapabilities& GlooCommunicator::capabilities() const {
  static const CommunicatorCapabilities kCapabilities{
      {CollectiveOp::kAllreduce, CollectiveOp::kAllgather, CollectiveOp::kBroadcast,
       CollectiveOp::kBarrier, CollectiveOp::kSend, CollectiveOp::kRecv},
      {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin},
      AllDataTypes(),
      {BufferLocation::kHost}};
  return kCapabilities;
}

Status GlooCommunicator::DoAllreduce(const void* send, void* recv, size_t count, DataType type,
                                     ReduceOp op, Deadline deadline) {
  const uint32_t tag = NextTag();
  if (count == 0) return Status::Ok();
  try {
    gloo::AllreduceOptions options(context_);
    WithType(type, [&](auto* typed) {
      using T = std::remove_pointer_t<decltype(typed)>;
      if (send != recv) options.setInput<T>(static_cast<T*>(const_cast<void*>(send)), count);
      options.setOutput<T>(static_cast<T*>(recv), count);
    });
    options.setReduceFunction([type, op](void* c, const void* a, const void* b, size_t n) {
      ReduceElements(c, a, b, n, type, op);
    });
    options.setTag(tag);
    options.setTimeout(Left(deadline));
    gloo::allreduce(options);
  } catch (const std::exception& error) {
    return FromException(error, rank(), "allreduce failed");
  }
  return Status::Ok();
}

Status GlooCommunicator::DoBroadcast(void* buffer, size_t count, DataType type, int root,
                                     Deadline deadline) {
  const uint32_t tag = NextTag();
  if (count == 0) return Status::Ok();
  try {
    gloo::BroadcastOptions options(context_);
    WithType(type, [&](auto* typed) {
      using T = std::remove_pointer_t<decltype(typed)>;
      options.setOutput<T>(static_cast<T*>(buffer), count);
    });
    options.setRoot(root);
    options.setTag(tag);
    options.setTimeout(Left(deadline));
    gloo::broadcast(options);
  } catch (const std::exception& error) {
    return FromException(error, rank(), "broadcast failed");
  }
  return Status::Ok();
}

Status GlooCommunicator::DoAllgather(const void* send, void* recv, size_t count, DataType type,
                                     Deadline deadline) {
  const uint32_t tag = NextTag();
  if (count == 0) return Status::Ok();
  const size_t block = count * DataTypeSize(type);
  const void* input = send;
  if (static_cast<std::byte*>(recv) + rank() * block == send) {  // in place: copy aside
    auto who = [&] { return "gloo rank " + std::to_string(rank()) + ": allgather count " + std::to_string(count); };
    ASSIGN_OR_RETURN(std::byte * aside, GrowScratch(scratch_, 1, block, who, "the in-place input's copy"));
    std::memcpy(aside, send, block);
    input = aside;
  }
  try {
    gloo::AllgatherOptions options(context_);
    WithType(type, [&](auto* typed) {
      using T = std::remove_pointer_t<decltype(typed)>;
      options.setInput<T>(static_cast<T*>(const_cast<void*>(input)), count);
      options.setOutput<T>(static_cast<T*>(recv), count * size());
    });
    options.setTag(tag);
    options.setTimeout(Left(deadline));
    gloo::allgather(options);
  } catch (const std::exception& error) {
    return FromException(error, rank(), "allgather failed");
  }
  return Status::Ok();
}

Status GlooCommunicator::DoBarrier(Deadline deadline) {
  const uint32_t tag = NextTag();
  try {
    gloo::BarrierOptions options(context_);
    options.setTag(tag);
    options.setTimeout(Left(deadline));
    gloo::barrier(options);
  } catch (const std::exception& error) {
    return FromException(error, rank(), "barrier failed");
  }
  return Status::Ok();
}

Status GlooCommunicator::DoSend(const void* buffer, size_t count, DataType type, int peer,
                                int tag, Deadline deadline) {
  const size_t bytes = count * DataTypeSize(type);
  try {
    // Gloo needs a non-null buffer even for an empty message.
    char empty = 0;
    auto unbound = context_->createUnboundBuffer(
        bytes > 0 ? const_cast<void*>(buffer) : &empty, bytes);
    unbound->send(peer, static_cast<uint64_t>(tag) + (1ull << 32));
    if (!unbound->waitSend(nullptr, Left(deadline))) {
      return CancelledError("gloo send to rank " + std::to_string(peer) + " was aborted");
    }
  } catch (const std::exception& error) {
    return FromException(error, rank(), ("send to rank " + std::to_string(peer) + " failed").c_str());
  }
  return Status::Ok();
}

Status GlooCommunicator::DoRecv(void* buffer, size_t count, DataType type, int peer, int tag,
                                Deadline deadline) {
  const size_t bytes = count * DataTypeSize(type);
  try {
    char empty = 0;
    auto unbound = context_->createUnboundBuffer(bytes > 0 ? buffer : &empty, bytes);
    unbound->recv(peer, static_cast<uint64_t>(tag) + (1ull << 32));
    if (!unbound->waitRecv(nullptr, Left(deadline))) {
      return CancelledError("gloo recv from rank " + std::to_string(peer) + " was aborted");
    }
  } catch (const std::exception& error) {
    return FromException(error, rank(),
                         ("recv from rank " + std::to_string(peer) + " failed").c_str());
  }
  return Status::Ok();
}

}  // namespace tessera::collectives
