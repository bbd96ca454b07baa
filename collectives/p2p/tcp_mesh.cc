#include "collectives/p2p/tcp_mesh.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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
  ASSIGN_OR_RETURN(auto host_port, ParseHostPort(*address));
  ASSIGN_OR_RETURN(*socket, ConnectTcp(host_port.first, host_port.second, deadline, who));
  Hello hello{kHelloMagic, kProtocolVersion, options.rank, peer, options.size,
              static_cast<uint32_t>(options.cohort.size())};
  RETURN_IF_ERROR(socket->SendAll(&hello, sizeof(hello), deadline, who));
  RETURN_IF_ERROR(socket->SendAll(options.cohort.data(), options.cohort.size(), deadline, who));
  uint32_t reply = 0;
  RETURN_IF_ERROR(socket->RecvAll(&reply, sizeof(reply), deadline, who));
  switch (reply) {
    case kAccepted: return Status::Ok();
    case kWrongCohort:
      return FailedPreconditionError(who + " at " + *address + " belongs to another cohort than '" +
                                     options.cohort + "'");
    case kWrongSize:
      return FailedPreconditionError(who + " at " + *address + " expects a different rank count than " +
                                     std::to_string(options.size));
    default:
      return FailedPreconditionError(who + " at " + *address + " refused rank " +
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
  std::unique_ptr<TcpMesh> mesh(new TcpMesh(options.rank, options.size));
  if (options.size == 1) return mesh;
  const Deadline deadline = Clock::now() + options.connect_timeout;

  ASSIGN_OR_RETURN(auto listening, ListenTcp(options.bind_address, 0, options.size + 16));
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
    auto peer = AcceptFromHigher(options, *accepted, mesh->peers_, deadline);
    if (!peer.ok() || *peer < 0) continue;  // a stranger or a broken hello: keep listening
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
  Abort(status);
  return status;
}

Status TcpMesh::Exchange(const OutgoingMessage* out, const IncomingMessage* in,
                         Deadline deadline) {
  if (failed_.load(std::memory_order_acquire)) return error();
  // Send side: header then payload, as one iovec pair.
  iovec send_iov[2] = {};
  size_t send_total = 0, sent = 0;
  int send_fd = -1;
  if (out != nullptr) {
    send_iov[0] = {const_cast<MessageHeader*>(&out->header), sizeof(MessageHeader)};
    send_iov[1] = {const_cast<void*>(out->data), out->header.payload_bytes};
    send_total = sizeof(MessageHeader) + out->header.payload_bytes;
    send_fd = peers_[out->peer].fd();
  }
  // Receive side: header into `got`, payload straight into the caller's buffer.
  MessageHeader got;
  size_t recv_total = 0, received = 0, notified = 0;
  bool header_checked = false;
  int recv_fd = -1;
  const size_t payload = in != nullptr ? in->expected.payload_bytes : 0;
  if (in != nullptr) {
    recv_total = sizeof(MessageHeader) + payload;
    recv_fd = peers_[in->peer].fd();
  }
  auto* payload_data = in != nullptr ? static_cast<char*>(in->data) : nullptr;

  int spins = 0;
  for (;;) {
    // Progress the send as far as the socket takes it.
    while (sent < send_total) {
      iovec iov[2];
      int count = 0;
      if (sent < sizeof(MessageHeader)) {
        iov[count++] = {static_cast<char*>(send_iov[0].iov_base) + sent,
                        sizeof(MessageHeader) - sent};
        if (send_iov[1].iov_len > 0) iov[count++] = send_iov[1];
      } else {
        const size_t offset = sent - sizeof(MessageHeader);
        iov[count++] = {static_cast<char*>(send_iov[1].iov_base) + offset,
                        send_iov[1].iov_len - offset};
      }
      msghdr message{};
      message.msg_iov = iov;
      message.msg_iovlen = count;
      const ssize_t n = ::sendmsg(send_fd, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else {
        return Fail(UnavailableError(
            RankName(rank_) + ": connection to " + RankName(out->peer) + " failed while sending " +
            DescribeHeader(out->header) + ": " + std::strerror(errno)));
      }
    }
    // Progress the receive.
    while (received < recv_total) {
      iovec iov[2];
      int count = 0;
      if (received < sizeof(MessageHeader)) {
        iov[count++] = {reinterpret_cast<char*>(&got) + received, sizeof(MessageHeader) - received};
        if (payload > 0) iov[count++] = {payload_data, payload};
      } else {
        const size_t offset = received - sizeof(MessageHeader);
        iov[count++] = {payload_data + offset, payload - offset};
      }
      const ssize_t n = ::readv(recv_fd, iov, count);
      if (n > 0) {
        received += static_cast<size_t>(n);
      } else if (n == 0) {
        return Fail(UnavailableError(RankName(rank_) + ": " + RankName(in->peer) +
                                     " closed the connection while this rank waited for " +
                                     DescribeHeader(in->expected) + " (" +
                                     std::to_string(received) + " of " +
                                     std::to_string(recv_total) + " bytes received)"));
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        break;
      } else {
        return Fail(UnavailableError(RankName(rank_) + ": connection to " + RankName(in->peer) +
                                     " failed while receiving " + DescribeHeader(in->expected) +
                                     ": " + std::strerror(errno)));
      }
      if (!header_checked && received >= sizeof(MessageHeader)) {
        Status matched = CheckHeader(in->expected, got, rank_, in->peer);
        if (!matched.ok()) return Fail(matched);
        header_checked = true;
      }
      if (in->sink != nullptr && header_checked) {
        const size_t have = received - sizeof(MessageHeader);
        const size_t step = in->segment_bytes > 0 ? in->segment_bytes : payload;
        while (notified < have && (have - notified >= step || have == payload)) {
          const size_t bytes = std::min(step, have - notified);
          in->sink->OnReceived(notified, bytes);
          notified += bytes;
        }
      }
    }
    if (sent == send_total && received == recv_total) {
      if (in != nullptr && !header_checked) {  // an empty payload still has a header
        Status matched = CheckHeader(in->expected, got, rank_, in->peer);
        if (!matched.ok()) return Fail(matched);
      }
      return Status::Ok();
    }

    // A short spin of nonblocking retries before sleeping in poll(): a small message from a
    // peer that is already sending arrives within microseconds, and a wakeup costs more.
    if (spins++ < kSpinRetries) continue;
    pollfd fds[2];
    int nfds = 0;
    const bool want_send = sent < send_total;
    const bool want_recv = received < recv_total;
    if (want_send && want_recv && send_fd == recv_fd) {
      fds[nfds++] = {send_fd, static_cast<short>(POLLIN | POLLOUT), 0};
    } else {
      if (want_send) fds[nfds++] = {send_fd, POLLOUT, 0};
      if (want_recv) fds[nfds++] = {recv_fd, POLLIN, 0};
    }
    const int64_t left = MillisecondsLeft(deadline);
    const int ready = left > 0 ? ::poll(fds, nfds, static_cast<int>(left)) : 0;
    if (ready < 0 && errno != EINTR) {
      return Fail(InternalError(RankName(rank_) + ": poll failed: " + std::strerror(errno)));
    }
    if (ready == 0) {
      std::string waiting;
      if (want_recv) {
        waiting = "waiting for " + RankName(in->peer) + " to send " +
                  DescribeHeader(in->expected) + " (" + std::to_string(received) + " of " +
                  std::to_string(recv_total) + " bytes received)";
      }
      if (want_send) {
        if (!waiting.empty()) waiting += " and ";
        waiting += "waiting for " + RankName(out->peer) + " to take " +
                   DescribeHeader(out->header) + " (" + std::to_string(sent) + " of " +
                   std::to_string(send_total) + " bytes sent)";
      }
      return Fail(DeadlineExceededError(RankName(rank_) + ": timed out " + waiting));
    }
  }
}

}  // namespace tessera::collectives
