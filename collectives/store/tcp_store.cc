#include "collectives/store/tcp_store.h"

#include <cstring>
#include <thread>

namespace tessera::collectives {
namespace {

constexpr uint8_t kSet = 1;
constexpr uint8_t kGet = 2;
constexpr uint8_t kAdd = 3;
constexpr uint8_t kOk = 0;
constexpr uint8_t kNotFound = 1;
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
      if (accepted.status().code() == StatusCode::kDeadlineExceeded) continue;
      return;  // the listener was shut down
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
        int64_t current = 0;
        auto it = values_.find(key);
        if (it != values_.end()) current = std::stoll(it->second);
        current += std::stoll(value);
        reply = std::to_string(current);
        values_[key] = reply;
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
  // A store round trip is short; a server that does not answer in this long is gone.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::lock_guard<std::mutex> lock(mutex_);
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
  return std::make_pair(response[0], std::move(reply));
}

Status TcpStore::Set(const std::string& key, const std::string& value) {
  ASSIGN_OR_RETURN(auto reply, Call(kSet, key, value));
  return Status::Ok();
}

Result<std::string> TcpStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(1);
  for (;;) {
    ASSIGN_OR_RETURN(auto reply, Call(kGet, key, ""));
    if (reply.first == kOk) return std::move(reply.second);
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
  return static_cast<int64_t>(std::stoll(reply.second));
}

}  // namespace tessera::collectives
