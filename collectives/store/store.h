// Store: the rendezvous key-value interface ranks use to find each other.
//
// Small on purpose, so it can be served over RPC by the coordinator later. Values are
// opaque bytes. Keys are set once per rendezvous (a second Set overwrites). Every wait has a
// timeout in milliseconds; a key that does not appear in time is DEADLINE_EXCEEDED naming
// the key.
//
// Implementations: HashStore (in-memory, one process), FileStore (a shared directory),
// TcpStore (a tiny TCP server and its clients). All are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera::collectives {

class Store {
 public:
  virtual ~Store() = default;

  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for `key`, then returns its value.
  virtual Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Adds `delta` to the integer counter at `key` (absent counts as 0) and returns the new
  // value. Atomic across all clients of the store.
  virtual Result<int64_t> Add(const std::string& key, int64_t delta) = 0;
  // Waits up to `timeout` until every key exists.
  virtual Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
};

// Prepends "<prefix>/" to every key of an underlying store. Shares ownership of it.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix) + "/"), base_(std::move(base)) {}
  Status Set(const std::string& key, const std::string& value) override {
    return base_->Set(prefix_ + key, value);
  }
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override {
    return base_->Get(prefix_ + key, timeout);
  }
  Result<int64_t> Add(const std::string& key, int64_t delta) override {
    return base_->Add(prefix_ + key, delta);
  }
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

// A view of `base` whose waits all end by one deadline, `budget` from its construction: a
// rendezvous that waits for several keys in turn (Gloo's, one key per peer) takes at most
// the budget as a whole, whatever each wait asks for. A key missing when the deadline comes is
// DEADLINE_EXCEEDED naming `what`, the key, how long this view has waited in all and the
// budget; a wait that ends earlier at its own, shorter timeout returns base's error as it is.
// Set and Add pass through. Does not own `base`, which must outlive it.
class DeadlineStore final : public Store {
 public:
  DeadlineStore(Store& base, std::chrono::milliseconds budget, std::string what);
  Status Set(const std::string& key, const std::string& value) override {
    return base_.Set(key, value);
  }
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override {
    return base_.Add(key, delta);
  }
  // Gets each key in turn, so that an error names the key that was missing.
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  Store& base_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::milliseconds budget_;
  std::string what_;
};

// The counter arithmetic behind every store's Add. A counter's text comes from a store or a
// peer, so it is parsed strictly: an optional '-' and decimal digits that fit int64, nothing
// else (INVALID_ARGUMENT naming `what` and the start of the text). AddToCounter is
// OUT_OF_RANGE when the sum would leave int64, naming `key` as QuoteUntrusted shows it. Keys
// come from a job's configuration or a peer: every store's errors show them so, escaped and
// bounded.
Result<int64_t> ParseCounter(std::string_view text, const std::string& what);
Result<int64_t> AddToCounter(int64_t current, int64_t delta, const std::string& key);

// Counter-based barrier on a store: every one of `size` participants calls it once with
// the same `key`; returns when all have arrived or fails at the timeout.
Status StoreBarrier(Store& store, const std::string& key, int size,
                    std::chrono::milliseconds timeout);

}  // namespace tessera::collectives
