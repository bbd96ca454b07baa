// A client end of a server stream for the coordinator's tests, read through gRPC's callback
// API so that the test itself holds no thread per stream.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

namespace tessera::server {

// One client end of a server stream, read through gRPC's callback API so that the test
// itself holds no thread per stream either.
template <typename Message>
class StreamReader : public grpc::ClientReadReactor<Message> {
 public:
  grpc::ClientContext* context() { return &context_; }

  // Call after the stub's async method has bound this reactor.
  void Begin() {
    this->StartRead(&incoming_);
    this->StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    {
      std::lock_guard<std::mutex> lock(mu_);
      received_.push_back(incoming_);
    }
    cv_.notify_all();
    this->StartRead(&incoming_);
  }

  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    status_ = status;
    cv_.notify_all();
  }

  bool WaitForMessages(size_t count, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return received_.size() >= count; });
  }
  bool WaitDone(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return done_; });
  }
  std::vector<Message> received() {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }
  grpc::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  grpc::ClientContext context_;
  Message incoming_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Message> received_;
  bool done_ = false;
  grpc::Status status_;
};

}  // namespace tessera::server
