#include "server/workers/rendezvous_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>

#include "base/escape.h"

namespace tessera::server {

namespace {

Status CheckRange(const std::string& field, uint64_t value, uint64_t low, uint64_t high) {
  if (value >= low && value <= high) return Status::Ok();
  return InvalidArgumentError("coordinator option rendezvous " + field + ": expected " + std::to_string(low) + " to " +
                              std::to_string(high) + ", got " + std::to_string(value));
}

// A key as errors show it: escaped and cut (keys carry a caller's bytes after their prefix).
std::string Shown(const std::string& key) { return QuoteUntrusted(key, 128); }

}  // namespace

Status RendezvousLimits::Validate() const {
  RETURN_IF_ERROR(CheckRange("max_key_bytes", max_key_bytes, 16, 4096));
  RETURN_IF_ERROR(CheckRange("max_value_bytes", max_value_bytes, 64, 1 << 20));
  RETURN_IF_ERROR(CheckRange("max_keys_per_prefix", max_keys_per_prefix, 1, 1 << 20));
  RETURN_IF_ERROR(CheckRange("max_bytes_per_prefix", max_bytes_per_prefix, max_key_bytes + max_value_bytes, 1ull << 32));
  RETURN_IF_ERROR(CheckRange("max_keys", max_keys, max_keys_per_prefix, 1 << 24));
  RETURN_IF_ERROR(CheckRange("max_bytes", max_bytes, max_bytes_per_prefix, 1ull << 36));
  return CheckRange("max_wait_ms", static_cast<uint64_t>(max_wait.count()), 1, 600000);
}

RendezvousStore::~RendezvousStore() { Shutdown(); }

std::string RendezvousStore::PrefixOf(const std::string& key) {
  size_t slashes = 0;
  for (size_t i = 0; i < key.size(); ++i) {
    if (key[i] == '/' && ++slashes == 5) return key.substr(0, i + 1);
  }
  return key;
}

Status RendezvousStore::ReserveLocked(const std::string& key, size_t value_bytes) {
  if (key.size() > limits_.max_key_bytes) {
    return InvalidArgumentError("rendezvous key " + Shown(key) + " of " + std::to_string(key.size()) +
                                " bytes: the limit (max_key_bytes) is " + std::to_string(limits_.max_key_bytes));
  }
  if (value_bytes > limits_.max_value_bytes) {
    return InvalidArgumentError("rendezvous value of " + std::to_string(value_bytes) + " bytes for key " + Shown(key) +
                                ": the limit (max_value_bytes) is " + std::to_string(limits_.max_value_bytes));
  }
  const std::string prefix = PrefixOf(key);
  Usage& scope = usage_[prefix];
  auto existing = values_.find(key);
  const size_t old_bytes = existing == values_.end() ? 0 : key.size() + existing->second.size();
  const size_t new_keys = existing == values_.end() ? 1 : 0;
  const size_t new_bytes = key.size() + value_bytes;
  auto refuse = [&](const std::string& where, size_t held, const std::string& unit, const std::string& limit_name,
                    size_t limit) {
    if (scope.keys == 0) usage_.erase(prefix);
    return ResourceExhaustedError("rendezvous key " + Shown(key) + " refused: " + where + " would hold " +
                                  std::to_string(held) + " " + unit + ", the limit (" + limit_name + ") is " +
                                  std::to_string(limit));
  };
  const std::string in_prefix = "the prefix " + Shown(prefix);
  if (scope.keys + new_keys > limits_.max_keys_per_prefix) {
    return refuse(in_prefix, scope.keys + new_keys, "keys", "max_keys_per_prefix", limits_.max_keys_per_prefix);
  }
  if (scope.bytes - old_bytes + new_bytes > limits_.max_bytes_per_prefix) {
    return refuse(in_prefix, scope.bytes - old_bytes + new_bytes, "bytes", "max_bytes_per_prefix",
                  limits_.max_bytes_per_prefix);
  }
  if (total_.keys + new_keys > limits_.max_keys) {
    return refuse("the store", total_.keys + new_keys, "keys", "max_keys", limits_.max_keys);
  }
  if (total_.bytes - old_bytes + new_bytes > limits_.max_bytes) {
    return refuse("the store", total_.bytes - old_bytes + new_bytes, "bytes", "max_bytes", limits_.max_bytes);
  }
  scope.keys += new_keys;
  scope.bytes = scope.bytes - old_bytes + new_bytes;
  total_.keys += new_keys;
  total_.bytes = total_.bytes - old_bytes + new_bytes;
  return Status::Ok();
}

void RendezvousStore::ForgetLocked(const std::string& key, size_t value_bytes) {
  const std::string prefix = PrefixOf(key);
  auto it = usage_.find(prefix);
  const size_t bytes = key.size() + value_bytes;
  if (it != usage_.end()) {
    it->second.keys -= std::min<size_t>(1, it->second.keys);
    it->second.bytes -= std::min(bytes, it->second.bytes);
    if (it->second.keys == 0) usage_.erase(it);
  }
  total_.keys -= std::min<size_t>(1, total_.keys);
  total_.bytes -= std::min(bytes, total_.bytes);
}

void RendezvousStore::Open(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  open_.insert(prefix);
}

Status RendezvousStore::CheckOpenLocked(const std::string& key) const {
  // Open prefixes end in '/': each of the key's prefixes up to a '/' may be one.
  for (size_t slash = key.find('/'); slash != std::string::npos; slash = key.find('/', slash + 1)) {
    if (open_.count(key.substr(0, slash + 1)) != 0) return Status::Ok();
  }
  return FailedPreconditionError("rendezvous key " + Shown(key) +
                                 " refused: no round in progress holds it (its round has closed)");
}

Status RendezvousStore::Set(const std::string& key, std::string value) {
  std::vector<Waiter> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(CheckOpenLocked(key));
    RETURN_IF_ERROR(ReserveLocked(key, value.size()));
    values_[key] = value;
    ready = TakeWaitersLocked(key);
  }
  for (auto& w : ready) w.done(value);
  return Status::Ok();
}

std::vector<RendezvousStore::Waiter> RendezvousStore::TakeWaitersLocked(const std::string& key) {
  std::vector<Waiter> taken;
  auto [begin, end] = waiters_.equal_range(key);
  for (auto it = begin; it != end;) {
    taken.push_back(std::move(it->second));
    it = waiters_.erase(it);
  }
  return taken;
}

uint64_t RendezvousStore::GetAsync(const std::string& key, std::chrono::milliseconds timeout, GetCallback done) {
  std::optional<Result<std::string>> now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) {
      now = UnavailableError("the coordinator is shutting down");
    } else if (auto it = values_.find(key); it != values_.end()) {
      now = it->second;
    } else {
      const uint64_t id = next_waiter_++;
      waiters_.emplace(key, Waiter{id, key, std::chrono::steady_clock::now() + timeout, timeout, std::move(done)});
      if (!timer_.joinable()) timer_ = std::thread([this] { TimerLoop(); });
      timer_cv_.notify_all();
      return id;
    }
  }
  done(std::move(*now));
  return 0;
}

bool RendezvousStore::CancelGet(const std::string& key, uint64_t id) {
  GetCallback dropped;  // destroyed after the lock is released: it may hold what its caller owns
  std::lock_guard<std::mutex> lock(mu_);
  auto [begin, end] = waiters_.equal_range(key);
  for (auto it = begin; it != end; ++it) {
    if (it->second.id != id) continue;
    dropped = std::move(it->second.done);
    waiters_.erase(it);
    return true;
  }
  return false;
}

void RendezvousStore::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutdown_) {
    const auto now = std::chrono::steady_clock::now();
    std::vector<Waiter> expired;
    auto next = std::chrono::steady_clock::time_point::max();
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->second.deadline <= now) {
        expired.push_back(std::move(it->second));
        it = waiters_.erase(it);
      } else {
        next = std::min(next, it->second.deadline);
        ++it;
      }
    }
    if (!expired.empty()) {
      lock.unlock();
      for (auto& w : expired) {
        // No exception leaves this thread: a waiter's callback that throws is logged.
        try {
          w.done(DeadlineExceededError("rendezvous key " + Shown(w.key) + " was not set within " +
                                       std::to_string(w.timeout.count()) + " ms"));
        } catch (const std::exception& e) {
          spdlog::error("rendezvous timer: a waiter's callback failed: {}", EscapeUntrusted(e.what()));
        }
      }
      lock.lock();
      continue;
    }
    if (next == std::chrono::steady_clock::time_point::max()) {
      timer_cv_.wait(lock);
    } else {
      timer_cv_.wait_until(lock, next);
    }
  }
}

void RendezvousStore::Shutdown() {
  std::multimap<std::string, Waiter> pending;
  std::thread timer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    pending.swap(waiters_);
    timer = std::move(timer_);
    timer_cv_.notify_all();
  }
  if (timer.joinable()) timer.join();
  for (auto& [key, w] : pending) w.done(UnavailableError("the coordinator is shutting down"));
}

Result<int64_t> RendezvousStore::Add(const std::string& key, int64_t delta) {
  std::vector<Waiter> ready;
  int64_t value = 0;
  std::string text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(CheckOpenLocked(key));
    auto existing = values_.find(key);
    if (existing != values_.end() && !existing->second.empty()) {
      const std::string& slot = existing->second;
      auto [end, ec] = std::from_chars(slot.data(), slot.data() + slot.size(), value);
      if (ec != std::errc() || end != slot.data() + slot.size()) {
        return InvalidArgumentError("rendezvous key " + Shown(key) + " holds a value that is not a counter");
      }
    }
    if (__builtin_add_overflow(value, delta, &value)) {
      return InvalidArgumentError("rendezvous counter " + Shown(key) + " would overflow");
    }
    std::string next = std::to_string(value);
    RETURN_IF_ERROR(ReserveLocked(key, next.size()));
    std::string& slot = values_[key];
    slot = std::move(next);
    text = slot;
    ready = TakeWaitersLocked(key);
  }
  for (auto& w : ready) w.done(text);
  return value;
}

void RendezvousStore::ClearPrefix(const std::string& prefix) {
  std::vector<Waiter> ended;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = open_.lower_bound(prefix); it != open_.end() && it->compare(0, prefix.size(), prefix) == 0;) {
      it = open_.erase(it);
    }
    for (auto it = values_.lower_bound(prefix);
         it != values_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
      ForgetLocked(it->first, it->second.size());
      it = values_.erase(it);
    }
    // A wait for a key of the closed round can no longer be answered (no write under the
    // prefix is admitted now): it ends here rather than at its deadline.
    for (auto it = waiters_.lower_bound(prefix);
         it != waiters_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
      ended.push_back(std::move(it->second));
      it = waiters_.erase(it);
    }
  }
  for (Waiter& w : ended) {
    try {
      w.done(FailedPreconditionError("rendezvous key " + Shown(w.key) +
                                     " will not be set: its round has closed"));
    } catch (const std::exception& e) {
      spdlog::error("rendezvous: a waiter's callback failed: {}", EscapeUntrusted(e.what()));
    }
  }
}

size_t RendezvousStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.size();
}

size_t RendezvousStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_.bytes;
}

}  // namespace tessera::server
