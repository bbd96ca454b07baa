#include "collectives/store/tcp_store.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "base/escape.h"

namespace tessera::collectives {
namespace {

constexpr uint8_t kSet = 1;
constexpr uint8_t kGet = 2;
constexpr uint8_t kAdd = 3;
constexpr uint8_t kOk = 0;
constexpr uint8_t kNotFound = 1;
constexpr uint8_t kError = 2;  // the request was refused; the value says why
constexpr uint8_t kBusy = 3;   // the connection was refused (max_connections); the value says why
constexpr uint32_t kMaxFieldBytes = 64u << 20;
// A field's buffer grows by at most this much ahead of the bytes that arrived.
constexpr size_t kFieldStepBytes = 1u << 20;
// Between requests without an idle_timeout a connection waits as long as it stays open;
// Shutdown() is what ends that wait when the server stops.
constexpr auto kNoIdleLimit = std::chrono::hours(24 * 365);
const std::string kClient = "store client";
// The longest a client's round trip may take, and the least a Get's may have: a Get whose time
// is up still asks once (Store::Wait's later keys), and a round trip cut short closes the
// connection.
constexpr auto kRoundTripLimit = std::chrono::seconds(60);
constexpr auto kRoundTripFloor = std::chrono::seconds(1);

// A client whose host died (or whose network went) without closing the connection is noticed
// by keepalive probes: after a minute of silence, six probes ten seconds apart.
void KeepAlive(TcpSocket& socket) {
  int one = 1, idle_s = 60, interval_s = 10, probes = 6;
  ::setsockopt(socket.fd(), SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(socket.fd(), IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  ::setsockopt(socket.fd(), IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  ::setsockopt(socket.fd(), IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
}

// Reads `bytes` into `field`, growing it a step at a time as they arrive: a header that
// announces 64 MiB and sends nothing more holds one step, not 64 MiB. `peer` names the other
// end in errors.
Status RecvGrowing(TcpSocket& socket, uint32_t bytes, std::string& field,
                   std::chrono::steady_clock::time_point deadline, const std::string& peer) {
  field.clear();
  while (field.size() < bytes) {
    const size_t have = field.size();
    const size_t step = std::min<size_t>(bytes - have, kFieldStepBytes);
    field.resize(have + step);
    RETURN_IF_ERROR(socket.RecvAll(field.data() + have, step, deadline, peer));
  }
  return Status::Ok();
}

bool RecvField(TcpSocket& socket, uint32_t bytes, std::string& field,
               std::chrono::steady_clock::time_point deadline) {
  return RecvGrowing(socket, bytes, field, deadline, kClient).ok();
}

// Reads and drops `bytes`, a piece at a time: a field over the server's limit is taken off the
// stream (so that the connection stays in step) without being held.
bool DiscardField(TcpSocket& socket, uint32_t bytes, std::chrono::steady_clock::time_point deadline) {
  char piece[16384];
  for (uint32_t left = bytes; left > 0;) {
    const size_t step = std::min<size_t>(left, sizeof(piece));
    if (!socket.RecvAll(piece, step, deadline, kClient).ok()) return false;
    left -= static_cast<uint32_t>(step);
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& address,
                                                              int port,
                                                              TcpStoreServerOptions options) {
  if (options.max_connections < 1 || options.request_timeout.count() <= 0 ||
      options.idle_timeout.count() < 0) {
    return InvalidArgumentError(
        "store server options: expected max_connections >= 1 (got " +
        std::to_string(options.max_connections) + "), request_timeout > 0 ms (got " +
        std::to_string(options.request_timeout.count()) + ") and idle_timeout >= 0 ms (got " +
        std::to_string(options.idle_timeout.count()) + ")");
  }
  if (options.max_key_bytes < 1 || options.max_key_bytes > kMaxFieldBytes ||
      options.max_value_bytes < 1 || options.max_value_bytes > kMaxFieldBytes ||
      options.max_keys < 1 || options.max_stored_bytes < 1) {
    return InvalidArgumentError(
        "store server options: expected max_key_bytes and max_value_bytes in [1, " +
        std::to_string(kMaxFieldBytes) + "] (got " + std::to_string(options.max_key_bytes) + " and " +
        std::to_string(options.max_value_bytes) + "), max_keys >= 1 (got " +
        std::to_string(options.max_keys) + ") and max_stored_bytes >= 1 (got " +
        std::to_string(options.max_stored_bytes) + ")");
  }
  // No deadline to honour: the server starts with its program, which waits for it. A name
  // as `address` is looked up blocking (ListenTcp); a numeric address is not looked up.
  ASSIGN_OR_RETURN(auto listening, ListenTcp(address, port, 128));
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer());
  server->address_ = address;
  server->options_ = options;
  server->listener_ = std::move(listening.first);
  server->port_ = listening.second;
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

TcpStoreServer::~TcpStoreServer() {
  stopping_ = true;
  listener_.Shutdown();
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(connections_mutex_);
    for (Connection& connection : connections_) {
      connection.socket.Shutdown();  // an ended connection's socket is closed: nothing to do
      threads.push_back(std::move(connection.thread));
    }
  }
  for (auto& thread : threads) thread.join();
}

void TcpStoreServer::AcceptLoop() {
  while (!stopping_) {
    Reap();
    auto accepted = AcceptTcp(listener_, std::chrono::steady_clock::now() +
                                             std::chrono::milliseconds(200));
    if (!accepted.ok()) {
      if (stopping_) return;  // the listener was shut down
      if (accepted.status().code() == StatusCode::kDeadlineExceeded) continue;
      // Out of descriptors (EMFILE, ENFILE), memory or a connection gone before it was taken:
      // the server must outlive that. Pause so a lasting error does not spin, and go on.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    (void)accepted->Tune(0);
    KeepAlive(*accepted);
    {
      std::lock_guard<std::mutex> lock(connections_mutex_);
      if (stopping_) return;
      if (open_connections_ < options_.max_connections) {
        Connection& connection = connections_.emplace_back();
        connection.socket = std::move(accepted).value();
        ++open_connections_;
        // Started under the lock: the thread marks itself done under it, after this.
        connection.thread = std::thread([this, &connection] { Serve(&connection); });
        continue;
      }
    }
    Refuse(std::move(accepted).value());
  }
}

void TcpStoreServer::Refuse(TcpSocket socket) {
  const std::string reason = "the store server at " + address_ + ":" + std::to_string(port_) +
                             " is at its limit of " + std::to_string(options_.max_connections) +
                             " open connections";
  std::string answer(5, '\0');
  answer[0] = static_cast<char>(kBusy);
  const uint32_t reason_bytes = static_cast<uint32_t>(reason.size());
  std::memcpy(answer.data() + 1, &reason_bytes, 4);
  answer += reason;
  // A new connection's send buffer takes this at once; the deadline only guards the loop.
  (void)socket.SendAll(answer.data(), answer.size(),
                       std::chrono::steady_clock::now() + std::chrono::seconds(1), kClient);
  ::shutdown(socket.fd(), SHUT_WR);
  // A request that already arrived is dropped unread, so that closing sends FIN, not a reset
  // that could beat the answer to the client.
  char drain[4096];
  for (int i = 0; i < 16 && ::recv(socket.fd(), drain, sizeof(drain), MSG_DONTWAIT) > 0; ++i) {
  }
}

void TcpStoreServer::Reap() {
  std::vector<std::thread> ended;
  {
    std::lock_guard<std::mutex> lock(connections_mutex_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (!it->done) {
        ++it;
        continue;
      }
      ended.push_back(std::move(it->thread));
      it = connections_.erase(it);
    }
  }
  for (auto& thread : ended) thread.join();  // each has only its return left
}

void TcpStoreServer::Serve(Connection* connection) {
  std::string key, value;
  while (ServeOne(connection->socket, key, value)) {
    // A large field's buffer is not kept while the connection waits for its next request.
    if (key.capacity() > kFieldStepBytes) std::string().swap(key);
    if (value.capacity() > kFieldStepBytes) std::string().swap(value);
  }
  std::lock_guard<std::mutex> lock(connections_mutex_);
  connection->socket.Close();  // the descriptor goes now, not when the server stops
  connection->done = true;
  --open_connections_;
}

bool TcpStoreServer::ServeOne(TcpSocket& socket, std::string& key, std::string& value) {
  uint8_t header[9];
  const auto idle = options_.idle_timeout.count() > 0 ? options_.idle_timeout
                                                      : std::chrono::milliseconds(kNoIdleLimit);
  const auto idle_deadline = std::chrono::steady_clock::now() + idle;
  if (!socket.RecvAll(header, 1, idle_deadline, kClient).ok()) return false;
  // From its first byte, the request has request_timeout to arrive and its answer to leave.
  const auto deadline = std::chrono::steady_clock::now() + options_.request_timeout;
  if (!socket.RecvAll(header + 1, sizeof(header) - 1, deadline, kClient).ok()) return false;
  uint32_t key_bytes, value_bytes;
  std::memcpy(&key_bytes, header + 1, 4);
  std::memcpy(&value_bytes, header + 5, 4);
  if (key_bytes > kMaxFieldBytes || value_bytes > kMaxFieldBytes) return false;
  uint8_t code = kOk;
  std::string reply;
  if (key_bytes > options_.max_key_bytes || value_bytes > options_.max_value_bytes) {
    // Refused unread: the fields are dropped as they arrive and the answer says which limit.
    if (!DiscardField(socket, key_bytes, deadline) || !DiscardField(socket, value_bytes, deadline)) return false;
    if (header[0] != kSet && header[0] != kGet && header[0] != kAdd) return false;
    code = kError;
    reply = key_bytes > options_.max_key_bytes
                ? "a key of " + std::to_string(key_bytes) + " bytes is over the store server's limit of " +
                      std::to_string(options_.max_key_bytes) + " (max_key_bytes)"
                : "a value of " + std::to_string(value_bytes) + " bytes is over the store server's limit of " +
                      std::to_string(options_.max_value_bytes) + " (max_value_bytes)";
  } else {
    if (!RecvField(socket, key_bytes, key, deadline)) return false;
    if (!RecvField(socket, value_bytes, value, deadline)) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    if (header[0] == kSet) {
      reply = Put(key, value);
      if (!reply.empty()) code = kError;
    } else if (header[0] == kGet) {
      auto it = values_.find(key);
      if (it == values_.end()) {
        code = kNotFound;
      } else {
        reply = it->second;
      }
    } else if (header[0] == kAdd) {
      // Both numbers may be anything a client sent: a refusal is answered, the counter kept.
      // The key is quoted bounded: it may be max_key_bytes of anything.
      const std::string shown = EscapeUntrusted(key);
      Result<int64_t> sum = ParseCounter(value, "the delta added to '" + shown + "'");
      auto it = values_.find(key);
      if (sum.ok() && it != values_.end()) {
        Result<int64_t> current = ParseCounter(it->second, "store key '" + shown + "'");
        sum = current.ok() ? AddToCounter(*current, *sum, key) : current;
      }
      if (sum.ok()) {
        const std::string total = std::to_string(*sum);
        reply = Put(key, total);
        if (reply.empty()) {
          reply = total;
        } else {
          code = kError;
        }
      } else {
        code = kError;
        reply = sum.status().message();
      }
    } else {
      return false;  // unknown command: drop the connection
    }
  }
  uint8_t response[5];
  response[0] = code;
  const uint32_t reply_bytes = static_cast<uint32_t>(reply.size());
  std::memcpy(response + 1, &reply_bytes, 4);
  if (!socket.SendAll(response, sizeof(response), deadline, kClient).ok()) return false;
  return socket.SendAll(reply.data(), reply.size(), deadline, kClient).ok();
}

std::string TcpStoreServer::Put(const std::string& key, const std::string& value) {
  auto it = values_.find(key);
  const int64_t before = it == values_.end() ? 0 : static_cast<int64_t>(key.size() + it->second.size());
  const int64_t after = static_cast<int64_t>(key.size() + value.size());
  if (it == values_.end() && static_cast<int64_t>(values_.size()) >= options_.max_keys) {
    return "the store server holds " + std::to_string(values_.size()) + " keys, its limit (max_keys); key '" +
           EscapeUntrusted(key) + "' was not added";
  }
  if (stored_bytes_ - before + after > options_.max_stored_bytes) {
    return "the store server holds " + std::to_string(stored_bytes_) + " bytes of keys and values; storing " +
           std::to_string(after) + " at key '" + EscapeUntrusted(key) + "' would pass its limit of " +
           std::to_string(options_.max_stored_bytes) + " (max_stored_bytes)";
  }
  stored_bytes_ += after - before;
  if (it == values_.end()) {
    values_.emplace(key, value);
  } else {
    it->second = value;
  }
  return "";
}

Result<std::shared_ptr<TcpStore>> TcpStore::Connect(const std::string& host, int port,
                                                    std::chrono::milliseconds timeout) {
  const std::string where = "store server " + host + ":" + std::to_string(port);
  ASSIGN_OR_RETURN(TcpSocket socket,
                   ConnectTcp(host, port, std::chrono::steady_clock::now() + timeout, where));
  RETURN_IF_ERROR(socket.Tune(0));
  return std::shared_ptr<TcpStore>(new TcpStore(std::move(socket), where));
}

Result<std::pair<uint8_t, std::string>> TcpStore::Call(uint8_t command, const std::string& key,
                                                       const std::string& value,
                                                       std::chrono::steady_clock::time_point deadline) {
  if (key.size() > kMaxFieldBytes || value.size() > kMaxFieldBytes) {
    return InvalidArgumentError("store key " + QuoteUntrusted(key) + ": a key or value of " +
                                std::to_string(std::max(key.size(), value.size())) +
                                " bytes is over the limit of " + std::to_string(kMaxFieldBytes));
  }
  // A store round trip is short; a server that does not answer in this long is gone.
  deadline = std::min(deadline, std::chrono::steady_clock::now() + kRoundTripLimit);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!socket_.valid()) {
    return UnavailableError(where_ + ": the connection was closed after an earlier error");
  }
  Result<std::pair<uint8_t, std::string>> reply = RoundTrip(command, key, value, deadline);
  // A call that failed part way leaves the stream between messages: the next call would read
  // this one's reply. The connection is closed instead and later calls say why.
  if (!reply.ok()) socket_.Close();
  // A server at its connection limit answered "busy" and closed the connection.
  if (reply.ok() && reply->first == kBusy) {
    socket_.Close();
    return Busy(reply->second);
  }
  return reply;
}

Result<std::pair<uint8_t, std::string>> TcpStore::RoundTrip(
    uint8_t command, const std::string& key, const std::string& value,
    std::chrono::steady_clock::time_point deadline) {
  std::string request(9, '\0');
  request[0] = static_cast<char>(command);
  const uint32_t key_bytes = static_cast<uint32_t>(key.size());
  const uint32_t value_bytes = static_cast<uint32_t>(value.size());
  std::memcpy(request.data() + 1, &key_bytes, 4);
  std::memcpy(request.data() + 5, &value_bytes, 4);
  request += key;
  request += value;
  RETURN_IF_ERROR(socket_.SendAll(request.data(), request.size(), deadline, where_));
  uint8_t response[5];
  RETURN_IF_ERROR(socket_.RecvAll(response, sizeof(response), deadline, where_));
  uint32_t reply_bytes;
  std::memcpy(&reply_bytes, response + 1, 4);
  if (reply_bytes > kMaxFieldBytes) {
    return DataLossError(where_ + " sent a " + std::to_string(reply_bytes) + "-byte value");
  }
  if (response[0] != kOk && response[0] != kNotFound && response[0] != kError &&
      response[0] != kBusy) {
    return DataLossError(where_ + " answered with unknown code " + std::to_string(response[0]));
  }
  // Held as it arrives: a server that announces 64 MiB and sends less costs one step.
  std::string reply;
  RETURN_IF_ERROR(RecvGrowing(socket_, reply_bytes, reply, deadline, where_));
  return std::make_pair(response[0], std::move(reply));
}

// The server's reason is shown bounded: it is what a peer sent.
Status TcpStore::Refused(const std::string& reason) const {
  return InvalidArgumentError(where_ + " refused the request: " + EscapeUntrusted(reason, 512));
}

Status TcpStore::Busy(const std::string& reason) const {
  return ResourceExhaustedError(where_ + " refused the connection: " +
                                EscapeUntrusted(reason, 512));
}

Status TcpStore::Set(const std::string& key, const std::string& value) {
  ASSIGN_OR_RETURN(auto reply, Call(kSet, key, value, std::chrono::steady_clock::now() + kRoundTripLimit));
  if (reply.first == kError) return Refused(reply.second);
  return Status::Ok();
}

Result<std::string> TcpStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(1);
  for (;;) {
    // A server that does not answer makes the Get fail at its timeout, not at the round
    // trip's own limit.
    auto reply = Call(kGet, key, "", std::max(deadline, std::chrono::steady_clock::now() + kRoundTripFloor));
    if (!reply.ok() && reply.status().code() == StatusCode::kDeadlineExceeded) {
      return DeadlineExceededError("store key " + QuoteUntrusted(key, 256) + " not set within " +
                                   std::to_string(timeout.count()) + " ms: " + reply.status().message());
    }
    if (!reply.ok()) return reply.status();
    if (reply->first == kOk) return std::move(reply->second);
    if (reply->first == kError) return Refused(reply->second);
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceededError("store key " + QuoteUntrusted(key, 256) + " not set within " +
                                   std::to_string(timeout.count()) + " ms (" + where_ + ")");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(20));
  }
}

Result<int64_t> TcpStore::Add(const std::string& key, int64_t delta) {
  ASSIGN_OR_RETURN(auto reply,
                   Call(kAdd, key, std::to_string(delta), std::chrono::steady_clock::now() + kRoundTripLimit));
  if (reply.first == kError) return Refused(reply.second);
  Result<int64_t> value = ParseCounter(reply.second, where_ + "'s answer to add on " + QuoteUntrusted(key));
  if (!value.ok()) return DataLossError(value.status().message());
  return value;
}

}  // namespace tessera::collectives
