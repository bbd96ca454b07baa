#include "collectives/p2p/tcp_mesh.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/escape.h"

namespace tessera::collectives {
namespace {

constexpr uint32_t kHelloMagic = 0x4f4c4548;  // "HELO"
constexpr uint32_t kProtocolVersion = 1;
constexpr uint32_t kMaxCohortBytes = 4096;
constexpr int kSpinRetries = 50;

struct Hello {
  uint32_t magic;
  uint32_t version;
  int32_t from;
  int32_t to;
  int32_t size;
  uint32_t cohort_bytes;
};

// Reply to a hello: 0 accepted, otherwise a reason code.
enum HelloReply : uint32_t { kAccepted = 0, kWrongCohort = 1, kWrongSize = 2, kWrongRank = 3 };

std::string RankName(int rank) { return "rank " + std::to_string(rank); }

Status ConnectToLower(const TcpMeshOptions& options, Store& store, int peer, Deadline deadline,
                      TcpSocket* socket) {
  const std::string who = RankName(peer);
  auto address = store.Get("p2p/addr/" + std::to_string(peer),
                           std::chrono::milliseconds(MillisecondsLeft(deadline)));
  if (!address.ok()) return address.status().WithContext("waiting for the address of " + who);
  // What the store holds is anyone's to write: the address is shown escaped and bounded.
  const std::string shown = QuoteUntrusted(*address, 256);
  auto host_port = ParseHostPort(*address);
  if (!host_port.ok()) {
    return InvalidArgumentError("the address " + who + " published is not host:port: " +
                                host_port.status().message());
  }
  ASSIGN_OR_RETURN(*socket, ConnectTcp(host_port->first, host_port->second, deadline, who));
  Hello hello{kHelloMagic, kProtocolVersion, options.rank, peer, options.size,
              static_cast<uint32_t>(options.cohort.size())};
  RETURN_IF_ERROR(socket->SendAll(&hello, sizeof(hello), deadline, who));
  RETURN_IF_ERROR(socket->SendAll(options.cohort.data(), options.cohort.size(), deadline, who));
  uint32_t reply = 0;
  RETURN_IF_ERROR(socket->RecvAll(&reply, sizeof(reply), deadline, who));
  switch (reply) {
    case kAccepted: return Status::Ok();
    case kWrongCohort:
      return FailedPreconditionError(who + " at " + shown + " belongs to another cohort than '" +
                                     options.cohort + "'");
    case kWrongSize:
      return FailedPreconditionError(who + " at " + shown + " expects a different rank count than " +
                                     std::to_string(options.size));
    default:
      return FailedPreconditionError(who + " at " + shown + " refused rank " +
                                     std::to_string(options.rank));
  }
}

// Accepts one hello; returns the peer rank, or -1 for a refused stranger.
Result<int> AcceptFromHigher(const TcpMeshOptions& options, TcpSocket& connection,
                             const std::vector<TcpSocket>& peers, Deadline deadline) {
  const std::string who = "an incoming peer";
  Hello hello{};
  RETURN_IF_ERROR(connection.RecvAll(&hello, sizeof(hello), deadline, who));
  if (hello.magic != kHelloMagic || hello.version != kProtocolVersion ||
      hello.cohort_bytes > kMaxCohortBytes) {
    return -1;  // not a Tessera p2p peer: drop it
  }
  std::string cohort(hello.cohort_bytes, '\0');
  RETURN_IF_ERROR(connection.RecvAll(cohort.data(), cohort.size(), deadline, who));
  uint32_t reply = kAccepted;
  if (cohort != options.cohort) {
    reply = kWrongCohort;
  } else if (hello.size != options.size) {
    reply = kWrongSize;
  } else if (hello.to != options.rank || hello.from <= options.rank || hello.from >= options.size ||
             peers[hello.from].valid()) {
    reply = kWrongRank;
  }
  RETURN_IF_ERROR(connection.SendAll(&reply, sizeof(reply), deadline, who));
  return reply == kAccepted ? hello.from : -1;
}

}  // namespace

Result<std::unique_ptr<TcpMesh>> TcpMesh::Connect(const TcpMeshOptions& options, Store& store) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return InvalidArgumentError("p2p: rank " + std::to_string(options.rank) +
                                " out of range for size " + std::to_string(options.size));
  }
  // A longer one would be sent, and every peer would drop the connection as a stranger's.
  if (options.cohort.size() > kMaxCohortBytes) {
    return InvalidArgumentError("p2p: the cohort identifier (the communicator's prefix) is " +
                                std::to_string(options.cohort.size()) + " bytes, over the limit of " +
                                std::to_string(kMaxCohortBytes));
  }
  std::unique_ptr<TcpMesh> mesh(new TcpMesh(options.rank, options.size));
  if (options.size == 1) return mesh;
  const Deadline deadline = Clock::now() + options.connect_timeout;

  // A bind address given as a name is looked up within the rendezvous' deadline too.
  ASSIGN_OR_RETURN(auto listening, ListenTcp(options.bind_address, 0, options.size + 16, deadline));
  TcpSocket listener = std::move(listening.first);
  const std::string host = options.bind_address.find(':') != std::string::npos
                               ? "[" + options.bind_address + "]"
                               : options.bind_address;
  RETURN_IF_ERROR(store.Set("p2p/addr/" + std::to_string(options.rank),
                            host + ":" + std::to_string(listening.second)));

  for (int peer = 0; peer < options.rank; ++peer) {
    Status connected = ConnectToLower(options, store, peer, deadline, &mesh->peers_[peer]);
    if (!connected.ok()) {
      return connected.WithContext("p2p rank " + std::to_string(options.rank) + " connecting");
    }
  }
  int waiting = options.size - 1 - options.rank;
  while (waiting > 0) {
    auto accepted = AcceptTcp(listener, deadline);
    if (!accepted.ok()) {
      return accepted.status().WithContext("p2p rank " + std::to_string(options.rank) +
                                           " waiting for " + std::to_string(waiting) +
                                           " higher ranks to connect");
    }
    // The hello has a deadline of its own: a connection that never speaks (a port scanner, a
    // stray client) must not hold the rendezvous until the whole deadline.
    const Deadline hello_deadline = std::min(deadline, Clock::now() + options.hello_timeout);
    auto peer = AcceptFromHigher(options, *accepted, mesh->peers_, hello_deadline);
    if (!peer.ok() || *peer < 0) continue;  // a stranger or a broken hello: closed, keep listening
    mesh->peers_[*peer] = std::move(accepted).value();
    --waiting;
  }
  for (int peer = 0; peer < options.size; ++peer) {
    if (peer == options.rank) continue;
    RETURN_IF_ERROR(mesh->peers_[peer].Tune(options.socket_buffer_bytes));
    RETURN_IF_ERROR(mesh->peers_[peer].SetNonBlocking(true));
  }
  return mesh;
}

void TcpMesh::Abort(const Status& reason) {
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (error_.ok()) error_ = reason.ok() ? CancelledError("p2p mesh aborted") : reason;
  }
  failed_.store(true, std::memory_order_release);
  for (TcpSocket& socket : peers_) socket.Shutdown();
}

Status TcpMesh::error() const {
  std::lock_guard<std::mutex> lock(error_mutex_);
  return error_;
}

Status TcpMesh::Fail(Status status) {
  Status first = error();
  Abort(status);
  if (first.ok()) return status;
  // Another call on this mesh failed first (a dead peer shuts every connection): name that
  // root cause too, not only the broken connection this call ran into.
  return Status(status.code(), status.message() + "; the communicator had already failed: " + first.message());
}

Status TcpMesh::Exchange(const OutgoingMessage* out, const IncomingMessage* in,
                         Deadline deadline) {
  return Progress(out != nullptr ? std::span<const OutgoingMessage>(out, 1)
                                 : std::span<const OutgoingMessage>(),
                  in != nullptr ? std::span<const IncomingMessage>(in, 1)
                                : std::span<const IncomingMessage>(),
                  /*chained=*/false, deadline);
}

Status TcpMesh::ExchangeChain(std::span<const OutgoingMessage> out,
                              std::span<const IncomingMessage> in, Deadline deadline) {
  if (out.size() != in.size()) return MessageChannel::ExchangeChain(out, in, deadline);
  return Progress(out, in, /*chained=*/true, deadline);
}

Status TcpMesh::Progress(std::span<const OutgoingMessage> outs,
                         std::span<const IncomingMessage> ins, bool chained, Deadline deadline) {
  if (failed_.load(std::memory_order_acquire)) return error();
  constexpr size_t kHeader = sizeof(MessageHeader);
  // Send side: message `next_out`, of which `sent` bytes (header included) are out.
  size_t next_out = 0, sent = 0;
  // Receive side: message `next_in`: header into `got`, payload straight into its buffer;
  // `delivered` payload bytes passed to the sink (or landed, without one).
  size_t next_in = 0, received = 0, delivered = 0;
  bool header_checked = false;
  MessageHeader got;

  auto receive_failure = [&](const IncomingMessage& in, const std::string& what) {
    return Fail(UnavailableError(RankName(rank_) + ": " + what + " while this rank waited for " +
                                 DescribeHeader(in.expected) + " (" + std::to_string(received) +
                                 " of " + std::to_string(kHeader + in.expected.payload_bytes) +
                                 " bytes received)"));
  };

  int spins = 0;
  for (;;) {
    bool progressed = false;
    bool send_blocked = false;  // the socket is full (not: waiting for data to forward)
    // Send as far as the socket takes it and, in a chain, as far as the data is ready.
    while (next_out < outs.size()) {
      const OutgoingMessage& out = outs[next_out];
      const size_t total = kHeader + out.header.payload_bytes;
      size_t limit = total;
      // Forwards what has been delivered. An empty message can go before the one it follows
      // has arrived, so the send side may be more than one step ahead: then nothing of the
      // message it forwards is here yet.
      if (chained && next_out > 0 && next_out - 1 >= next_in) {
        limit = std::min(total, kHeader + (next_out - 1 == next_in ? delivered : 0));
      }
      if (sent >= limit) break;
      iovec iov[2];
      int count = 0;
      auto* payload = static_cast<char*>(const_cast<void*>(out.data));
      if (sent < kHeader) {
        iov[count++] = {reinterpret_cast<char*>(const_cast<MessageHeader*>(&out.header)) + sent,
                        kHeader - sent};
        if (limit > kHeader) iov[count++] = {payload, limit - kHeader};
      } else {
        iov[count++] = {payload + (sent - kHeader), limit - sent};
      }
      msghdr message{};
      message.msg_iov = iov;
      message.msg_iovlen = count;
      const ssize_t n = ::sendmsg(peers_[out.peer].fd(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        progressed = true;
        if (sent == total) {
          ++next_out;
          sent = 0;
        }
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        send_blocked = true;
        break;
      } else {
        return Fail(UnavailableError(
            RankName(rank_) + ": connection to " + RankName(out.peer) + " failed while sending " +
            DescribeHeader(out.header) + ": " + std::strerror(errno)));
      }
    }
    // Receive, one segment at a time when the message has segments, so that a chained send
    // can forward each one as soon as it is delivered.
    bool receive_waiting = false;
    while (next_in < ins.size()) {
      const IncomingMessage& in = ins[next_in];
      const size_t payload = in.expected.payload_bytes;
      const size_t total = kHeader + payload;
      if (received < total) {
        auto* data = static_cast<char*>(in.data);
        const size_t have = received > kHeader ? received - kHeader : 0;
        size_t want = payload - have;
        if (in.segment_bytes > 0) want = std::min(want, in.segment_bytes - have % in.segment_bytes);
        iovec iov[2];
        int count = 0;
        if (received < kHeader) {
          iov[count++] = {reinterpret_cast<char*>(&got) + received, kHeader - received};
          if (want > 0) iov[count++] = {data, want};
        } else {
          iov[count++] = {data + have, want};
        }
        const ssize_t n = ::readv(peers_[in.peer].fd(), iov, count);
        if (n > 0) {
          received += static_cast<size_t>(n);
          progressed = true;
        } else if (n == 0) {
          return receive_failure(in, RankName(in.peer) + " closed the connection");
        } else if (errno == EINTR) {
          continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
          receive_waiting = true;
          break;
        } else {
          return receive_failure(in, "connection to " + RankName(in.peer) + " failed (" +
                                         std::string(std::strerror(errno)) + ")");
        }
      }
      if (!header_checked && received >= kHeader) {
        Status matched = CheckHeader(in.expected, got, rank_, in.peer);
        if (!matched.ok()) return Fail(matched);
        header_checked = true;
      }
      if (!header_checked) continue;
      const size_t have = received - kHeader;
      const size_t step = in.segment_bytes > 0 ? in.segment_bytes : payload;
      const size_t before = delivered;
      while (delivered < have && (have - delivered >= step || have == payload)) {
        const size_t bytes = std::min(step, have - delivered);
        if (in.sink != nullptr) in.sink->OnReceived(delivered, bytes);
        delivered += bytes;
      }
      if (received == total) {
        ++next_in;
        received = delivered = 0;
        header_checked = false;
        if (chained) break;  // the next outgoing message may now go in full
      } else if (chained && delivered > before) {
        break;  // forward the new segment before receiving more
      }
    }
    if (next_out == outs.size() && next_in == ins.size()) return Status::Ok();
    if (progressed) continue;

    // A short spin of nonblocking retries before sleeping in poll(): a small message from a
    // peer that is already sending arrives within microseconds, and a wakeup costs more.
    if (spins++ < kSpinRetries) continue;
    pollfd fds[2];
    int nfds = 0;
    const int send_fd = send_blocked ? peers_[outs[next_out].peer].fd() : -1;
    const int recv_fd = receive_waiting ? peers_[ins[next_in].peer].fd() : -1;
    if (send_fd >= 0 && send_fd == recv_fd) {
      fds[nfds++] = {send_fd, static_cast<short>(POLLIN | POLLOUT), 0};
    } else {
      if (send_fd >= 0) fds[nfds++] = {send_fd, POLLOUT, 0};
      if (recv_fd >= 0) fds[nfds++] = {recv_fd, POLLIN, 0};
    }
    const int left = PollTimeoutMs(deadline);
    const int ready = left > 0 ? ::poll(fds, nfds, left) : 0;
    if (ready < 0 && errno != EINTR) {
      return Fail(InternalError(RankName(rank_) + ": poll failed: " + std::strerror(errno)));
    }
    if (ready == 0 && MillisecondsLeft(deadline) > 0) continue;  // a piece of a longer wait
    if (ready == 0) {
      std::string waiting;
      if (next_in < ins.size()) {
        const IncomingMessage& in = ins[next_in];
        waiting = "waiting for " + RankName(in.peer) + " to send " +
                  DescribeHeader(in.expected) + " (" + std::to_string(received) + " of " +
                  std::to_string(kHeader + in.expected.payload_bytes) + " bytes received)";
      }
      if (send_blocked) {
        const OutgoingMessage& out = outs[next_out];
        if (!waiting.empty()) waiting += " and ";
        waiting += "waiting for " + RankName(out.peer) + " to take " +
                   DescribeHeader(out.header) + " (" + std::to_string(sent) + " of " +
                   std::to_string(kHeader + out.header.payload_bytes) + " bytes sent)";
      }
      return Fail(DeadlineExceededError(RankName(rank_) + ": timed out " + waiting));
    }
  }
}

}  // namespace tessera::collectives
