#include "server/rendezvous_store.h"

#include <charconv>

namespace tessera::server {

RendezvousStore::~RendezvousStore() { Shutdown(); }

void RendezvousStore::Set(const std::string& key, std::string value) {
  std::vector<Waiter> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
    ready = TakeWaitersLocked(key);
  }
  for (auto& w : ready) w.done(value);
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

void RendezvousStore::GetAsync(const std::string& key, std::chrono::milliseconds timeout, GetCallback done) {
  std::optional<Result<std::string>> now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) {
      now = UnavailableError("the coordinator is shutting down");
    } else if (auto it = values_.find(key); it != values_.end()) {
      now = it->second;
    } else {
      waiters_.emplace(key, Waiter{key, std::chrono::steady_clock::now() + timeout, timeout, std::move(done)});
      if (!timer_.joinable()) timer_ = std::thread([this] { TimerLoop(); });
      timer_cv_.notify_all();
      return;
    }
  }
  done(std::move(*now));
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
        w.done(DeadlineExceededError("rendezvous key '" + w.key + "' was not set within " +
                                     std::to_string(w.timeout.count()) + " ms"));
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
    std::string& slot = values_[key];
    if (!slot.empty()) {
      auto [end, ec] = std::from_chars(slot.data(), slot.data() + slot.size(), value);
      if (ec != std::errc() || end != slot.data() + slot.size()) {
        return InvalidArgumentError("rendezvous key '" + key.substr(0, 128) + "' holds a value that is not a counter");
      }
    }
    if (__builtin_add_overflow(value, delta, &value)) {
      return InvalidArgumentError("rendezvous counter '" + key.substr(0, 128) + "' would overflow");
    }
    slot = std::to_string(value);
    text = slot;
    ready = TakeWaitersLocked(key);
  }
  for (auto& w : ready) w.done(text);
  return value;
}

void RendezvousStore::ClearPrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = values_.lower_bound(prefix); it != values_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    it = values_.erase(it);
  }
}

size_t RendezvousStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.size();
}

}  // namespace tessera::server
