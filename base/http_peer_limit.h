// Connections held per client address by base/http_endpoint.cc, so that one address cannot
// take every connection the endpoint keeps, and in all, so that the endpoint keeps no more than
// its max_connections. A connection holds its address's slot from its accept until it closes,
// whichever thread closes it. Internal to the endpoint.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace tessera::http_internal {

class PeerConnections {
 public:
  // A connection's hold on its address's count: given back when it goes.
  class Slot {
   public:
    Slot() = default;
    ~Slot() { Release(); }
    Slot(Slot&& other) noexcept : counts_(std::move(other.counts_)), address_(std::move(other.address_)) {}
    Slot& operator=(Slot&& other) noexcept {
      if (this != &other) {
        Release();
        counts_ = std::move(other.counts_);
        address_ = std::move(other.address_);
      }
      return *this;
    }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    bool held() const { return counts_ != nullptr; }

   private:
    friend class PeerConnections;
    struct Counts;
    void Release();
    std::shared_ptr<Counts> counts_;
    std::string address_;
  };

  // At most `limit` connections per address (at least 1).
  explicit PeerConnections(size_t limit);
  // A slot for a new connection from `address` (PeerAddress's bytes), or one not held()
  // when the address holds `limit` connections already.
  Slot Take(const std::string& address);
  // Connections holding a slot now, of every address.
  size_t Held() const;

 private:
  std::shared_ptr<Slot::Counts> counts_;
};

struct PeerConnections::Slot::Counts {
  explicit Counts(size_t limit) : limit(limit) {}
  const size_t limit;
  mutable std::mutex mu;
  std::map<std::string, size_t> held;  // addresses holding at least one connection
  size_t total = 0;                     // the sum of `held`
};

inline void PeerConnections::Slot::Release() {
  if (counts_ == nullptr) return;
  std::lock_guard<std::mutex> lock(counts_->mu);
  auto it = counts_->held.find(address_);
  if (it != counts_->held.end()) {
    --counts_->total;
    if (--it->second == 0) counts_->held.erase(it);
  }
  counts_.reset();
}

inline PeerConnections::PeerConnections(size_t limit)
    : counts_(std::make_shared<Slot::Counts>(limit < 1 ? 1 : limit)) {}

inline PeerConnections::Slot PeerConnections::Take(const std::string& address) {
  Slot slot;
  std::lock_guard<std::mutex> lock(counts_->mu);
  size_t& held = counts_->held[address];
  if (held >= counts_->limit) return slot;
  ++held;
  ++counts_->total;
  slot.counts_ = counts_;
  slot.address_ = address;
  return slot;
}

inline size_t PeerConnections::Held() const {
  std::lock_guard<std::mutex> lock(counts_->mu);
  return counts_->total;
}

}  // namespace tessera::http_internal
