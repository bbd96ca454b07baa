#include "server/job_events.h"

namespace tessera::server {

void JobEvents::Publish(v1::JobEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(std::move(event));
  cv_.notify_all();
}

void JobEvents::End() {
  std::lock_guard<std::mutex> lock(mu_);
  ended_ = true;
  cv_.notify_all();
}

std::vector<v1::JobEvent> JobEvents::WaitAfter(size_t seen, std::chrono::milliseconds timeout, bool* ended) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return events_.size() > seen || ended_; });
  std::vector<v1::JobEvent> out;
  for (size_t i = seen; i < events_.size(); ++i) out.push_back(events_[i]);
  *ended = ended_;
  return out;
}

}  // namespace tessera::server
