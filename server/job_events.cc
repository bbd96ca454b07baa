#include "server/job_events.h"

#include <utility>

namespace tessera::server {

void JobEvents::Publish(v1::JobEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
  }
  NotifyWatchers();
}

void JobEvents::End() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
  }
  NotifyWatchers();
}

std::vector<v1::JobEvent> JobEvents::Since(size_t seen, bool* ended) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::JobEvent> out;
  for (size_t i = seen; i < events_.size(); ++i) out.push_back(events_[i]);
  *ended = ended_;
  return out;
}

uint64_t JobEvents::Subscribe(std::function<void()> changed) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_watcher_++;
  watchers_.emplace(id, std::move(changed));
  return id;
}

void JobEvents::Unsubscribe(uint64_t id) {
  std::function<void()> dropped;  // destroyed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = watchers_.find(id);
  if (it == watchers_.end()) return;
  dropped = std::move(it->second);
  watchers_.erase(it);
}

void JobEvents::NotifyWatchers() {
  std::vector<std::function<void()>> watchers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    watchers.reserve(watchers_.size());
    for (const auto& [id, changed] : watchers_) watchers.push_back(changed);
  }
  for (const auto& changed : watchers) changed();
}

}  // namespace tessera::server
