#include "collectives/fallback.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "collectives/reduce.h"
#include "collectives/scratch.h"

namespace tessera::collectives {
namespace {

// memcpy that allows empty ranges: a zero-count call may pass null buffers (an empty vector's
// data(), a scratch buffer never grown), which memcpy itself does not allow.
void CopyBytes(void* to, const void* from, size_t bytes) {
  if (bytes > 0) std::memcpy(to, from, bytes);
}

std::string RankName(int rank) { return "rank " + std::to_string(rank); }

// What a route's scratch errors name (GrowScratch, scratch.h): "rank 0: ROUTE", built only
// for an error.
auto RouteOf(int rank, const char* route) {
  return [rank, route] { return RankName(rank) + ": " + route; };
}

}  // namespace

// MessageChannel over the wrapped backend's Send/Recv. Each message is a header message and
// a payload message on `tag`. In an exchange that both sends and receives, the send runs on
// a helper thread while this one receives; waiting for it is bounded by the call's deadline,
// after which the channel refuses every later exchange (see fallback.h).
class FallbackCommunicator::SendRecvChannel final : public MessageChannel {
 public:
  SendRecvChannel(Communicator* base, int tag) : base_(base), tag_(tag) {}
  ~SendRecvChannel() override { JoinSender(); }

  int rank() const override { return base_->rank(); }
  int size() const override { return base_->size(); }

  // Starts a composed call: what its errors name as the time it had.
  void BeginCall(Deadline deadline) {
    call_budget_ = std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()),
                            std::chrono::milliseconds(0));
  }

  // Stops the helper thread; waits for a send it has not finished, abandoned or not.
  void JoinSender() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  Status Exchange(const OutgoingMessage* out, const IncomingMessage* in,
                  Deadline deadline) override {
    if (out == nullptr && in == nullptr) return Status::Ok();
    // A send abandoned at an earlier deadline may still be in the backend: the pair's messages
    // are out of step, and a new job would overwrite the one in flight.
    if (!abandoned_.ok()) return abandoned_;
    if (in == nullptr) return SendMessage(*out, deadline);
    if (out == nullptr) return ReceiveMessage(*in, deadline);
    if (!thread_.joinable()) thread_ = std::thread([this] { SendLoop(); });
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = *out;  // a copy: the helper may outlive this call if the backend overruns
      job_deadline_ = deadline;
      has_job_ = true;
      job_done_ = false;
    }
    wake_.notify_all();
    Status received = ReceiveMessage(*in, deadline);
    Status sent;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!wake_.wait_until(lock, deadline, [&] { return job_done_; })) {
        abandoned_ = DeadlineExceededError(
            RankName(rank()) + ": timed out waiting for " + RankName(out->peer) + " to take " +
            DescribeHeader(out->header) + " " + Budget() + ": backend " +
            std::string(base_->backend_name()) +
            "'s send had not returned, so this communicator is out of step with its peers and "
            "refuses every later call (destroying it waits for that send)");
        if (received.ok()) return abandoned_;
        return Status(received.code(), received.message() + "; and the send to " +
                                           RankName(out->peer) + " had not returned either");
      }
      sent = job_result_;
    }
    return received.ok() ? sent : received;
  }

 private:
  // "before the call's deadline, 1000 ms after it began".
  std::string Budget() const {
    return "before the call's deadline, " + std::to_string(call_budget_.count()) +
           " ms after it began";
  }

  // `failed` from the backend while this rank waited for `peer` to send (`sending`: to take)
  // `header`: a deadline names the call, the peer and the deadline, whatever the backend said;
  // other errors keep their code and gain the same context.
  Status Explain(const Status& failed, int peer, bool sending, const MessageHeader& header) const {
    const std::string waiting = "waiting for " + RankName(peer) +
                                (sending ? " to take " : " to send ") + DescribeHeader(header);
    if (failed.code() == StatusCode::kDeadlineExceeded) {
      return DeadlineExceededError(RankName(rank()) + ": timed out " + waiting + " " + Budget() +
                                   " (backend " + std::string(base_->backend_name()) + ": " +
                                   failed.message() + ")");
    }
    return failed.WithContext(RankName(rank()) + ": " + waiting);
  }

  Status SendMessage(const OutgoingMessage& out, Deadline deadline) {
    Status sent = CallSend(*base_, &out.header, sizeof(MessageHeader), DataType::kUint8,
                           out.peer, tag_, deadline);
    if (sent.ok() && out.header.payload_bytes > 0) {
      sent = CallSend(*base_, out.data, out.header.payload_bytes, DataType::kUint8, out.peer,
                      tag_, deadline);
    }
    return sent.ok() ? sent : Explain(sent, out.peer, /*sending=*/true, out.header);
  }

  Status ReceiveMessage(const IncomingMessage& in, Deadline deadline) {
    MessageHeader got;
    Status received = CallRecv(*base_, &got, sizeof(MessageHeader), DataType::kUint8, in.peer,
                               tag_, deadline);
    if (!received.ok()) return Explain(received, in.peer, /*sending=*/false, in.expected);
    // The payload's length is the one this rank expects: a peer's header that announces
    // another is a mismatch, never a size to receive.
    RETURN_IF_ERROR(CheckHeader(in.expected, got, base_->rank(), in.peer));
    const size_t bytes = in.expected.payload_bytes;
    if (bytes == 0) return Status::Ok();
    received = CallRecv(*base_, in.data, bytes, DataType::kUint8, in.peer, tag_, deadline);
    if (!received.ok()) return Explain(received, in.peer, /*sending=*/false, in.expected);
    if (in.sink != nullptr) in.sink->OnReceived(0, bytes);
    return Status::Ok();
  }

  void SendLoop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || has_job_; });
      if (!has_job_) return;  // stopping, nothing in flight
      const OutgoingMessage job = job_;
      const Deadline deadline = job_deadline_;
      has_job_ = false;
      lock.unlock();
      Status result = SendMessage(job, deadline);
      lock.lock();
      job_result_ = result;
      job_done_ = true;
      wake_.notify_all();
    }
  }

  Communicator* base_;
  const int tag_;
  std::chrono::milliseconds call_budget_{0};
  Status abandoned_;  // set once a send outlived its call's deadline; this thread only
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  OutgoingMessage job_;     // guarded by mutex_
  Deadline job_deadline_;   // guarded by mutex_
  bool has_job_ = false;    // guarded by mutex_
  Status job_result_;       // guarded by mutex_
  bool job_done_ = false;   // guarded by mutex_
  bool stop_ = false;       // guarded by mutex_
};

FallbackCommunicator::FallbackCommunicator(std::unique_ptr<Communicator> base,
                                           BufferLocation location, AlgorithmTuning tuning)
    : Communicator(base->rank(), base->size(), base->default_timeout()),
      base_(std::move(base)),
      capabilities_(ReserveTopTag(base_->capabilities(), &framing_tag_)),
      location_(location),
      channel_(std::make_unique<SendRecvChannel>(base_.get(), framing_tag_)),
      algorithms_(std::make_unique<CollectiveAlgorithms>(channel_.get(), tuning)) {}

// The helper thread may still be sending from the algorithms' or this object's scratch: it
// stops before any of them is destroyed.
FallbackCommunicator::~FallbackCommunicator() { channel_->JoinSender(); }

CollectiveAlgorithms& FallbackCommunicator::SendRecvRoute(Deadline deadline) {
  channel_->BeginCall(deadline);
  return *algorithms_;
}

bool FallbackCommunicator::Needed(const CommunicatorCapabilities& base) {
  return base.native_ops != AllCollectiveOps() || base.native_reduce_ops != AllReduceOps();
}

Result<std::byte*> FallbackCommunicator::Scratch(size_t elements, size_t element_bytes,
                                                 const char* route) {
  return GrowScratch(scratch_, elements, element_bytes, RouteOf(rank(), route));
}

Status FallbackCommunicator::NoRoute(CollectiveOp op, ReduceOp reduce_op) const {
  std::string what(CollectiveOpName(op));
  if (op == CollectiveOp::kAllreduce || op == CollectiveOp::kReduceScatter) {
    what += "(" + std::string(ReduceOpName(reduce_op)) + ")";
  }
  return UnimplementedError("backend " + std::string(base_->backend_name()) + " cannot run " +
                            what + " on " + std::string(BufferLocationName(location_)) +
                            " buffers: no native op and no composition route from " +
                            base_->capabilities().ToString());
}

bool FallbackCommunicator::WidensHalfAverage(CollectiveOp collective, DataType type,
                                             ReduceOp op) const {
  return type == DataType::kFloat16 && op == ReduceOp::kAvg &&
         location_ == BufferLocation::kHost && !(Has(collective) && HasReduce(op)) &&
         base_->capabilities().HasDataType(DataType::kFloat32);
}

Status FallbackCommunicator::DoAllreduce(const void* send, void* recv, size_t count,
                                         DataType type, ReduceOp op, Deadline deadline) {
  if (WidensHalfAverage(CollectiveOp::kAllreduce, type, op)) {
    const char* route = "allreduce(avg) float16 <- allreduce(avg) float32";
    ASSIGN_OR_RETURN(float* wide, GrowScratch(wide_, 1, count, RouteOf(rank(), route)));
    Count(route);
    HalfToFloatElements(static_cast<const uint16_t*>(send), wide, count);
    RETURN_IF_ERROR(DoAllreduce(wide, wide, count, DataType::kFloat32, op, deadline));
    FloatToHalfElements(wide, static_cast<uint16_t*>(recv), count);
    return Status::Ok();
  }
  const uint64_t sequence = sequence_++;
  const bool host = location_ == BufferLocation::kHost;
  if (Has(CollectiveOp::kAllreduce) && HasReduce(op)) {
    return CallAllreduce(*base_, send, recv, count, type, op, deadline);
  }
  if (op == ReduceOp::kAvg && host && Has(CollectiveOp::kAllreduce) && HasReduce(ReduceOp::kSum)) {
    Count("allreduce(avg) <- allreduce(sum) + divide");
    RETURN_IF_ERROR(CallAllreduce(*base_, send, recv, count, type, ReduceOp::kSum, deadline));
    DivideElements(recv, count, type, size());
    return Status::Ok();
  }
  const ReduceOp native_op = op == ReduceOp::kAvg && !HasReduce(op) ? ReduceOp::kSum : op;
  if (host && Has(CollectiveOp::kReduceScatter) && Has(CollectiveOp::kAllgather) &&
      HasReduce(native_op)) {
    const char* route = "allreduce <- reduce_scatter + allgather";
    const size_t element = DataTypeSize(type);
    // count / size rounded up, without the sum's overflow.
    const size_t block = count / size() + (count % size() != 0 ? 1 : 0);
    // The padded input (size blocks) and this rank's block; block * (size + 1) elements can
    // exceed what an object holds where count elements did not.
    size_t elements = 0;
    if (__builtin_mul_overflow(block, static_cast<size_t>(size()) + 1, &elements)) {
      elements = SIZE_MAX;
    }
    ASSIGN_OR_RETURN(std::byte* padded, Scratch(elements, element, route));
    Count(route);
    std::byte* mine = padded + block * size() * element;
    CopyBytes(padded, send, count * element);
    std::memset(padded + count * element, 0, (block * size() - count) * element);
    RETURN_IF_ERROR(
        CallReduceScatter(*base_, padded, mine, block, type, native_op, deadline));
    RETURN_IF_ERROR(CallAllgather(*base_, mine, padded, block, type, deadline));
    CopyBytes(recv, padded, count * element);
    if (native_op != op) DivideElements(recv, count, type, size());
    return Status::Ok();
  }
  if (host && HasSendRecv()) {
    Count("allreduce <- send/recv");
    return SendRecvRoute(deadline).Allreduce(send, recv, count, type, op, sequence, deadline);
  }
  return NoRoute(CollectiveOp::kAllreduce, op);
}

Status FallbackCommunicator::DoReduceScatter(const void* send, void* recv, size_t count,
                                             DataType type, ReduceOp op, Deadline deadline) {
  if (WidensHalfAverage(CollectiveOp::kReduceScatter, type, op)) {
    const char* route = "reduce_scatter(avg) float16 <- reduce_scatter(avg) float32";
    // count * size float16 elements fit (the call was checked), so neither sum wraps.
    const size_t all = count * static_cast<size_t>(size());
    ASSIGN_OR_RETURN(float* wide, GrowScratch(wide_, 1, all + count, RouteOf(rank(), route)));
    Count(route);
    HalfToFloatElements(static_cast<const uint16_t*>(send), wide, all);
    RETURN_IF_ERROR(
        DoReduceScatter(wide, wide + all, count, DataType::kFloat32, op, deadline));
    FloatToHalfElements(wide + all, static_cast<uint16_t*>(recv), count);
    return Status::Ok();
  }
  const uint64_t sequence = sequence_++;
  const bool host = location_ == BufferLocation::kHost;
  if (Has(CollectiveOp::kReduceScatter) && HasReduce(op)) {
    return CallReduceScatter(*base_, send, recv, count, type, op, deadline);
  }
  if (host && Has(CollectiveOp::kAllreduce) &&
      (HasReduce(op) || (op == ReduceOp::kAvg && HasReduce(ReduceOp::kSum)))) {
    const char* route = "reduce_scatter <- allreduce";
    const ReduceOp native_op = HasReduce(op) ? op : ReduceOp::kSum;
    const size_t element = DataTypeSize(type);
    ASSIGN_OR_RETURN(std::byte* all, Scratch(count * size(), element, route));
    Count(route);
    RETURN_IF_ERROR(
        CallAllreduce(*base_, send, all, count * size(), type, native_op, deadline));
    CopyBytes(recv, all + rank() * count * element, count * element);
    if (native_op != op) DivideElements(recv, count, type, size());
    return Status::Ok();
  }
  if (host && HasSendRecv()) {
    Count("reduce_scatter <- send/recv");
    return SendRecvRoute(deadline).ReduceScatter(send, recv, count, type, op, sequence, deadline);
  }
  return NoRoute(CollectiveOp::kReduceScatter, op);
}

Status FallbackCommunicator::DoAllgather(const void* send, void* recv, size_t count,
                                         DataType type, Deadline deadline) {
  const uint64_t sequence = sequence_++;
  const bool host = location_ == BufferLocation::kHost;
  if (Has(CollectiveOp::kAllgather)) {
    return CallAllgather(*base_, send, recv, count, type, deadline);
  }
  if (host && HasSendRecv()) {
    Count("allgather <- send/recv");
    return SendRecvRoute(deadline).Allgather(send, recv, count, type, sequence, deadline);
  }
  if (host && Has(CollectiveOp::kAllreduce) && HasReduce(ReduceOp::kSum)) {
    const char* route = "allgather <- allreduce(sum) of zero-padded blocks";
    const size_t element = DataTypeSize(type);
    ASSIGN_OR_RETURN(std::byte* mine, Scratch(count, element, route));
    Count(route);
    // Summed as integers of the element's size where the backend has them: one rank's bytes
    // plus zeros are those bytes exactly, where a float sum turns -0.0 into +0.0 and may
    // change a NaN's payload. (Two-byte floats keep their own type.)
    DataType sum_type = type;
    const CommunicatorCapabilities& caps = base_->capabilities();
    if (element == 4 && caps.HasDataType(DataType::kInt32)) sum_type = DataType::kInt32;
    if (element == 8 && caps.HasDataType(DataType::kInt64)) sum_type = DataType::kInt64;
    auto* output = static_cast<std::byte*>(recv);
    CopyBytes(mine, send, count * element);
    std::memset(output, 0, count * size() * element);
    CopyBytes(output + rank() * count * element, mine, count * element);
    return CallAllreduce(*base_, output, output, count * size(), sum_type, ReduceOp::kSum, deadline);
  }
  return NoRoute(CollectiveOp::kAllgather, ReduceOp::kSum);
}

Status FallbackCommunicator::DoBroadcast(void* buffer, size_t count, DataType type, int root,
                                         Deadline deadline) {
  const uint64_t sequence = sequence_++;
  if (Has(CollectiveOp::kBroadcast)) {
    return CallBroadcast(*base_, buffer, count, type, root, deadline);
  }
  if (location_ == BufferLocation::kHost && HasSendRecv()) {
    Count("broadcast <- send/recv");
    return SendRecvRoute(deadline).Broadcast(buffer, count, type, root, sequence, deadline);
  }
  return NoRoute(CollectiveOp::kBroadcast, ReduceOp::kSum);
}

Status FallbackCommunicator::DoBarrier(Deadline deadline) {
  const uint64_t sequence = sequence_++;
  if (Has(CollectiveOp::kBarrier)) return CallBarrier(*base_, deadline);
  if (location_ == BufferLocation::kHost && HasSendRecv()) {
    Count("barrier <- send/recv");
    return SendRecvRoute(deadline).Barrier(sequence, deadline);
  }
  if (location_ == BufferLocation::kHost && Has(CollectiveOp::kAllreduce) &&
      HasReduce(ReduceOp::kSum)) {
    Count("barrier <- allreduce");
    int32_t token = 1;
    return CallAllreduce(*base_, &token, &token, 1, DataType::kInt32, ReduceOp::kSum, deadline);
  }
  return NoRoute(CollectiveOp::kBarrier, ReduceOp::kSum);
}

Status FallbackCommunicator::DoSend(const void* buffer, size_t count, DataType type, int peer,
                                    int tag, Deadline deadline) {
  if (!Has(CollectiveOp::kSend)) return NoRoute(CollectiveOp::kSend, ReduceOp::kSum);
  return CallSend(*base_, buffer, count, type, peer, tag, deadline);
}

Status FallbackCommunicator::DoRecv(void* buffer, size_t count, DataType type, int peer, int tag,
                                    Deadline deadline) {
  if (!Has(CollectiveOp::kRecv)) return NoRoute(CollectiveOp::kRecv, ReduceOp::kSum);
  return CallRecv(*base_, buffer, count, type, peer, tag, deadline);
}

Status FallbackCommunicator::DoHostAllreduce(int64_t* values, size_t count, ReduceOp op,
                                             Deadline deadline) {
  if (Has(CollectiveOp::kAllreduce) && HasReduce(op)) {
    return CallHostAllreduce(*base_, values, count, op, deadline);
  }
  return DoAllreduce(values, values, count, DataType::kInt64, op, deadline);
}

Status FallbackCommunicator::DoHostSend(const void* bytes, size_t size, int peer, int tag,
                                        Deadline deadline) {
  if (!Has(CollectiveOp::kSend)) return NoRoute(CollectiveOp::kSend, ReduceOp::kSum);
  return CallHostSend(*base_, bytes, size, peer, tag, deadline);
}

Status FallbackCommunicator::DoHostRecv(void* bytes, size_t size, int peer, int tag,
                                        Deadline deadline) {
  if (!Has(CollectiveOp::kRecv)) return NoRoute(CollectiveOp::kRecv, ReduceOp::kSum);
  return CallHostRecv(*base_, bytes, size, peer, tag, deadline);
}

}  // namespace tessera::collectives
