// TcpMesh: Tessera's own point-to-point transport, a full mesh of TCP connections among
// `size` ranks, implementing MessageChannel.
//
// Rendezvous: each rank listens on bind_address port 0, publishes "host:port" under
// "p2p/addr/<rank>" in the Store, connects to every lower rank and accepts every higher one.
// The connecting side sends a hello (magic, version, from/to rank, size, cohort identifier);
// the accepting side checks all of it and answers; a connection from another cohort or a
// wrong rank count is refused, and the connector reports which. Each accepted connection has
// hello_timeout to say hello; a silent or partial one is closed and accepting goes on.
//
// Data path: nonblocking sockets with TCP_NODELAY; a header and its payload go out in one
// sendmsg; a header and the expected payload come in with one readv; a send and a receive
// progress together in one poll() loop, so ring steps overlap both directions without a
// thread. Every wait is bounded by the call's deadline.
//
// Failure: a closed or reset connection is UNAVAILABLE and a deadline DEADLINE_EXCEEDED,
// each naming the peer rank and how many bytes of which message were outstanding. After any
// error the mesh aborts (shuts every connection down), so peers waiting on this rank fail at
// once instead of at their own timeout, and every later call returns the first error.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/message.h"
#include "collectives/store/store.h"
#include "collectives/tcp_socket.h"

namespace tessera::collectives {

struct TcpMeshOptions {
  int rank = 0;
  int size = 1;
  std::string cohort = "tessera";          // identity checked in the handshake; <= 4096 bytes
  std::string bind_address = "127.0.0.1";  // must be reachable by the peers
  // SO_SNDBUF/SO_RCVBUF; 0 (the default) keeps the kernel's autotuning, which measured
  // faster on loopback than fixed 1 or 4 MiB buffers.
  int socket_buffer_bytes = 0;
  std::chrono::milliseconds connect_timeout{30000};
  // How long an accepted connection has to deliver its hello (within connect_timeout): a
  // connection that stays silent, from any host, holds the rendezvous up this long at most.
  std::chrono::milliseconds hello_timeout{5000};
};

class TcpMesh final : public MessageChannel {
 public:
  // Rendezvous through `store` (keys relative to it; pass a PrefixStore to namespace).
  static Result<std::unique_ptr<TcpMesh>> Connect(const TcpMeshOptions& options, Store& store);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  Status Exchange(const OutgoingMessage* out, const IncomingMessage* in,
                  Deadline deadline) override;
  // Overlaps the steps: while in[i] arrives, each delivered segment of it is forwarded as
  // out[i+1] at once, so a ring streams instead of stopping at every step.
  Status ExchangeChain(std::span<const OutgoingMessage> out, std::span<const IncomingMessage> in,
                       Deadline deadline) override;

  // Shuts every connection down; later calls fail with `reason`.
  // Thread-safe: one thread may send while another receives (FallbackCommunicator does).
  void Abort(const Status& reason);
  Status error() const;

 private:
  TcpMesh(int rank, int size) : rank_(rank), peers_(size) {}
  Status Fail(Status status);
  // The poll() loop behind Exchange and ExchangeChain: sends `out` in order while receiving
  // `in` in order; with `chained`, out[i+1] waits for the bytes in[i] has delivered.
  Status Progress(std::span<const OutgoingMessage> out, std::span<const IncomingMessage> in,
                  bool chained, Deadline deadline);

  int rank_;
  std::vector<TcpSocket> peers_;  // peers_[rank_] stays invalid
  std::atomic<bool> failed_{false};
  mutable std::mutex error_mutex_;
  Status error_;  // guarded by error_mutex_
};

}  // namespace tessera::collectives
