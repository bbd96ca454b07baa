#include "bench/loadgen/timer_queue.h"

#include <utility>

namespace tessera::loadgen {

TimerQueue::TimerQueue() : thread_([this] { Loop(); }) {}

TimerQueue::~TimerQueue() { Stop(); }

void TimerQueue::At(Clock::time_point when, std::function<void()> callback) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    entries_.push(Entry{when, next_sequence_++, std::move(callback)});
  }
  cv_.notify_one();
}

void TimerQueue::After(std::chrono::milliseconds delay, std::function<void()> callback) {
  At(Clock::now() + delay, std::move(callback));
}

void TimerQueue::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    entries_ = {};
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void TimerQueue::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (entries_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const Clock::time_point due = entries_.top().when;
    if (Clock::now() < due) {
      cv_.wait_until(lock, due);
      continue;
    }
    std::function<void()> callback = std::move(const_cast<Entry&>(entries_.top()).callback);
    entries_.pop();
    lock.unlock();
    callback();
    lock.lock();
  }
}

}  // namespace tessera::loadgen
