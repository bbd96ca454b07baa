// TcpStore: a tiny TCP key-value server (TcpStoreServer) and its client (TcpStore).
//
// Typically rank 0 (or the launcher) runs the server on port 0 and passes host:port to the
// other ranks. The server serves each connection on its own thread; it is meant for
// rendezvous traffic (a few keys per rank), not bulk data. Wire format, little-endian:
//   request  u8 command (1 set, 2 get, 3 add) | u32 key bytes | u32 value bytes | key | value
//   response u8 code (0 ok, 1 not found, 2 refused, 3 busy) | u32 value bytes | value
// On the wire a key or value is at most 64 MiB; a request announcing more is dropped with its
// connection. Below that, what the server keeps is bounded by TcpStoreServerOptions: a key or
// value over max_key_bytes / max_value_bytes is read and discarded (in pieces, never held) and
// answered "refused" naming the limit; a set or add that would make the store hold more than
// max_keys keys or max_stored_bytes bytes (keys and values) is refused the same way and changes
// nothing. Either way the connection goes on being served. Add's value and the counter it adds to must be
// decimal int64 text and the sum must fit int64; otherwise the server answers "refused" with
// the reason as the value, keeps the counter and goes on serving (the client's Add returns
// INVALID_ARGUMENT). The server drops a connection that sends an unknown command or an
// oversized field. A client call that fails part way (I/O error, deadline, malformed reply)
// closes the client's connection, and every later call on it is UNAVAILABLE. The client, too,
// holds a reply's value only as its bytes arrive (1 MiB ahead at most), not all that the
// reply's header announces.
// Get waits on the client side by polling (1 to 20 ms backoff) until the deadline; each of its
// round trips ends at that deadline too, but has at least 1 s (so that a Get with no time left
// still asks once), and a server that does not answer in time makes the Get DEADLINE_EXCEEDED
// naming the key and the timeout. Set and Add give a round trip 60 s.
//
// Connections are bounded (TcpStoreServerOptions): at most max_connections at once; one
// beyond is answered "busy" with the limit as the value and closed (the client's call is
// RESOURCE_EXHAUSTED). A request must arrive whole, and its answer be taken, within
// request_timeout of its first byte, or the connection is dropped; a field's buffer grows
// only as its bytes arrive. Between requests a connection may stay silent (a rank keeps its
// client for the job) unless idle_timeout is set; TCP keepalive drops the connection of a
// client whose host died without closing it. A closed connection's thread and descriptor are
// released at once. In flight, a server holds at most max_connections requests of
// max_key_bytes + max_value_bytes each.
//
// What the server trusts: nothing about a peer's bytes (sizes, commands and counters are all
// checked), and everything about who the peer is. There is no authentication: any process
// that can reach the port may read, overwrite or count any key, and so steer a rendezvous.
// Listen on loopback (the default) or on an interface only the job's ranks can reach.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/store/store.h"
#include "collectives/tcp_socket.h"

namespace tessera::collectives {

struct TcpStoreServerOptions {
  int max_connections = 1024;  // open at once, each with its thread; >= 1
  // From a request's first byte to the end of its answer; > 0.
  std::chrono::milliseconds request_timeout{30000};
  // How long a connection may send nothing between requests; 0: as long as it stays open.
  std::chrono::milliseconds idle_timeout{0};
  // The largest key and value a request may carry; 1 to 64 MiB each. Rendezvous keys and
  // values (addresses, ids) are far smaller.
  uint32_t max_key_bytes = 4096;
  uint32_t max_value_bytes = 1u << 20;
  // What the store may hold at once: keys, and key plus value bytes over all of them; >= 1.
  int64_t max_keys = 1 << 16;
  int64_t max_stored_bytes = int64_t{256} << 20;
};

class TcpStoreServer {
 public:
  // Listens on address:port (port 0 picks a free port; see port()). INVALID_ARGUMENT for
  // options out of their ranges.
  static Result<std::unique_ptr<TcpStoreServer>> Start(const std::string& address = "127.0.0.1",
                                                       int port = 0,
                                                       TcpStoreServerOptions options = {});
  // Stops accepting, closes every connection and joins all threads.
  ~TcpStoreServer();

  int port() const { return port_; }
  const std::string& address() const { return address_; }

 private:
  struct Connection {
    TcpSocket socket;     // closed by its thread when it ends, under connections_mutex_
    std::thread thread;
    bool done = false;    // its thread has ended and may be joined
  };
  TcpStoreServer() = default;
  void AcceptLoop();
  // Answers "busy" to a connection beyond max_connections and closes it.
  void Refuse(TcpSocket socket);
  // Joins and forgets the connections whose threads have ended.
  void Reap();
  void Serve(Connection* connection);
  // One request read and answered; false when the connection is to be dropped.
  bool ServeOne(TcpSocket& socket, std::string& key, std::string& value);
  // Stores `value` at `key` unless the store would then hold more than its limits: the reason
  // when refused. Under mutex_.
  std::string Put(const std::string& key, const std::string& value);

  std::string address_;
  int port_ = 0;
  TcpStoreServerOptions options_;
  TcpSocket listener_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;

  std::mutex mutex_;
  std::map<std::string, std::string> values_;  // guarded by mutex_
  int64_t stored_bytes_ = 0;  // keys' and values' bytes in values_; guarded by mutex_

  std::mutex connections_mutex_;
  std::list<Connection> connections_;  // guarded by connections_mutex_
  int open_connections_ = 0;           // those not done; guarded by connections_mutex_
};

class TcpStore final : public Store {
 public:
  // Connects to a TcpStoreServer, retrying until `timeout`.
  static Result<std::shared_ptr<TcpStore>> Connect(const std::string& host, int port,
                                                   std::chrono::milliseconds timeout);

  Status Set(const std::string& key, const std::string& value) override;
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  TcpStore(TcpSocket socket, std::string where)
      : socket_(std::move(socket)), where_(std::move(where)) {}
  // One request/response round trip, ending at `deadline` or 60 s from now, whichever comes
  // first; returns {code, value}. Closes the connection when the round trip fails part way.
  Result<std::pair<uint8_t, std::string>> Call(uint8_t command, const std::string& key,
                                               const std::string& value,
                                               std::chrono::steady_clock::time_point deadline);
  Result<std::pair<uint8_t, std::string>> RoundTrip(uint8_t command, const std::string& key,
                                                    const std::string& value,
                                                    std::chrono::steady_clock::time_point deadline);
  // The error for a request the server refused, with its reason.
  Status Refused(const std::string& reason) const;
  // The error for a connection the server refused (busy), with its reason.
  Status Busy(const std::string& reason) const;

  std::mutex mutex_;
  TcpSocket socket_;  // guarded by mutex_
  std::string where_;
};

}  // namespace tessera::collectives
