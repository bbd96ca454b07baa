#include "collectives/gloo/communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <signal.h>

#include <cstring>
#include <optional>

#include "collectives/reduce.h"
#include "collectives/scratch.h"

namespace tessera::collectives {
namespace {

// Gloo's rendezvous store interface over a Tessera Store. Gloo expects exceptions. Gloo waits
// for each peer's key in turn, each wait given the context's whole timeout; every wait here
// ends instead by one deadline, `timeout` from the adaptor's construction, so that the
// rendezvous as a whole takes no longer. The first failure is kept as a Status, so that Create
// can return the deadline's own message rather than Gloo's text of it.
class GlooStoreAdaptor final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdaptor(collectives::Store& store, std::chrono::milliseconds timeout)
      : store_(store, timeout, "gloo rendezvous"), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_.Set(key, std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    auto value = store_.Get(key, timeout_);
    Check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    Check(store_.Wait(keys, timeout));
  }
  const Status& failure() const { return failure_; }

 private:
  void Check(const Status& status) {
    if (status.ok()) return;
    if (failure_.ok()) failure_ = status;
    throw gloo::IoException(status.ToString());
  }

  DeadlineStore store_;
  std::chrono::milliseconds timeout_;
  Status failure_;
};

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
  std::optional<GlooStoreAdaptor> adaptor;
  try {
    adaptor.emplace(store, timeout);  // the rendezvous's deadline starts here
    gloo::transport::tcp::attr attr;
    attr.hostname = options.bind_address;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(timeout);
    context->connectFullMesh(*adaptor, device);
    return std::unique_ptr<GlooCommunicator>(
        new GlooCommunicator(std::move(context), options.rank, options.size, timeout));
  } catch (const std::exception& error) {
    // The rendezvous's deadline, as the adaptor describes it; any other failure is
    // UNAVAILABLE, as before.
    if (adaptor.has_value() && adaptor->failure().code() == StatusCode::kDeadlineExceeded) {
      return adaptor->failure().WithContext("gloo rank " + std::to_string(options.rank) +
                                            " rendezvous failed");
    }
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
