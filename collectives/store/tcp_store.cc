#include "collectives/store/tcp_store.h"

#include <algorithm>
#include <cstring>
#include <thread>

namespace tessera::collectives {
namespace {

constexpr uint8_t kSet = 1;
constexpr uint8_t kGet = 2;
constexpr uint8_t kAdd = 3;
constexpr uint8_t kOk = 0;
constexpr uint8_t kNotFound = 1;
constexpr uint8_t kError = 2;  // the request was refused; the value says why
constexpr uint32_t kMaxFieldBytes = 64u << 20;
// Server-side I/O on an established connection has no natural deadline; a long one keeps
// the code uniform while Shutdown() is what really ends a blocked read.
constexpr auto kServerIoTimeout = std::chrono::hours(24 * 365);

}  // namespace

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& address,
                                                              int port) {
  ASSIGN_OR_RETURN(auto listening, ListenTcp(address, port, 128));
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer());
  server->address_ = address;
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
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& connection : connections_) connection->Shutdown();
    threads.swap(connection_threads_);
  }
  for (auto& thread : threads) thread.join();
}

void TcpStoreServer::AcceptLoop() {
  while (!stopping_) {
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
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    (void)accepted->Tune(0);
    connections_.push_back(std::make_unique<TcpSocket>(std::move(accepted).value()));
    const int index = static_cast<int>(connections_.size()) - 1;
    connection_threads_.emplace_back([this, index] { Serve(index); });
  }
}

void TcpStoreServer::Serve(int connection_index) {
  TcpSocket* socket;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    socket = connections_[connection_index].get();
  }
  const std::string who = "store client";
  std::string key, value;
  for (;;) {
    const auto deadline = std::chrono::steady_clock::now() + kServerIoTimeout;
    uint8_t header[9];
    if (!socket->RecvAll(header, sizeof(header), deadline, who).ok()) return;
    uint32_t key_bytes, value_bytes;
    std::memcpy(&key_bytes, header + 1, 4);
    std::memcpy(&value_bytes, header + 5, 4);
    if (key_bytes > kMaxFieldBytes || value_bytes > kMaxFieldBytes) return;
    key.resize(key_bytes);
    value.resize(value_bytes);
    if (!socket->RecvAll(key.data(), key_bytes, deadline, who).ok()) return;
    if (!socket->RecvAll(value.data(), value_bytes, deadline, who).ok()) return;

    uint8_t code = kOk;
    std::string reply;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (header[0] == kSet) {
        values_[key] = value;
      } else if (header[0] == kGet) {
        auto it = values_.find(key);
        if (it == values_.end()) {
          code = kNotFound;
        } else {
          reply = it->second;
        }
      } else if (header[0] == kAdd) {
        // Both numbers may be anything a client sent: a refusal is answered, the counter kept.
        Result<int64_t> sum = ParseCounter(value, "the delta added to '" + key + "'");
        auto it = values_.find(key);
        if (sum.ok() && it != values_.end()) {
          Result<int64_t> current = ParseCounter(it->second, "store key '" + key + "'");
          sum = current.ok() ? AddToCounter(*current, *sum, key) : current;
        }
        if (sum.ok()) {
          reply = std::to_string(*sum);
          values_[key] = reply;
        } else {
          code = kError;
          reply = sum.status().message();
        }
      } else {
        return;  // unknown command: drop the connection
      }
    }
    uint8_t response[5];
    response[0] = code;
    const uint32_t reply_bytes = static_cast<uint32_t>(reply.size());
    std::memcpy(response + 1, &reply_bytes, 4);
    if (!socket->SendAll(response, sizeof(response), deadline, who).ok()) return;
    if (!socket->SendAll(reply.data(), reply.size(), deadline, who).ok()) return;
  }
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
                                                       const std::string& value) {
  if (key.size() > kMaxFieldBytes || value.size() > kMaxFieldBytes) {
    return InvalidArgumentError("store key '" + key.substr(0, 64) + "': a key or value of " +
                                std::to_string(std::max(key.size(), value.size())) +
                                " bytes is over the limit of " + std::to_string(kMaxFieldBytes));
  }
  // A store round trip is short; a server that does not answer in this long is gone.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!socket_.valid()) {
    return UnavailableError(where_ + ": the connection was closed after an earlier error");
  }
  Result<std::pair<uint8_t, std::string>> reply = RoundTrip(command, key, value, deadline);
  // A call that failed part way leaves the stream between messages: the next call would read
  // this one's reply. The connection is closed instead and later calls say why.
  if (!reply.ok()) socket_.Close();
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
  std::string reply(reply_bytes, '\0');
  RETURN_IF_ERROR(socket_.RecvAll(reply.data(), reply.size(), deadline, where_));
  if (response[0] != kOk && response[0] != kNotFound && response[0] != kError) {
    return DataLossError(where_ + " answered with unknown code " + std::to_string(response[0]));
  }
  return std::make_pair(response[0], std::move(reply));
}

Status TcpStore::Refused(const std::string& reason) const {
  return InvalidArgumentError(where_ + " refused the request: " + reason);
}

Status TcpStore::Set(const std::string& key, const std::string& value) {
  ASSIGN_OR_RETURN(auto reply, Call(kSet, key, value));
  if (reply.first == kError) return Refused(reply.second);
  return Status::Ok();
}

Result<std::string> TcpStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(1);
  for (;;) {
    ASSIGN_OR_RETURN(auto reply, Call(kGet, key, ""));
    if (reply.first == kOk) return std::move(reply.second);
    if (reply.first == kError) return Refused(reply.second);
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceededError("store key '" + key + "' not set within " +
                                   std::to_string(timeout.count()) + " ms (" + where_ + ")");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(20));
  }
}

Result<int64_t> TcpStore::Add(const std::string& key, int64_t delta) {
  ASSIGN_OR_RETURN(auto reply, Call(kAdd, key, std::to_string(delta)));
  if (reply.first == kError) return Refused(reply.second);
  Result<int64_t> value = ParseCounter(reply.second, where_ + "'s answer to add on '" + key + "'");
  if (!value.ok()) return DataLossError(value.status().message());
  return value;
}

}  // namespace tessera::collectives
