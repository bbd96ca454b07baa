#include "server/jobs/job_events.h"

#include <algorithm>
#include <utility>

#include "proto/record_bounds.h"

namespace tessera::server {

void JobEvents::Publish(v1::JobEvent event) {
  // Every event within the bounds of proto/record_bounds.h, whoever made it: a note's text,
  // the job's error, a progress's awaited workers.
  wire::BoundJobEvent(&event);
  const size_t bytes = event.ByteSizeLong();  // outside the lock: a round's record is large
  const bool note = IsNote(event);
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(Kept{std::move(event), bytes, note});
    bytes_ += bytes;
    while (events_.size() > capacity_ || (bytes_ > max_bytes_ && events_.size() > 1)) {
      bytes_ -= events_.front().bytes;
      if (events_.front().note) ++notes_dropped_;
      if (events_.front().event.has_rewind()) {
        // Without its job (a spec of up to 2 MiB): a watch sends it with its own.
        events_.front().event.clear_job();
        dropped_rewinds_.emplace_back(first_, std::move(events_.front().event));
        if (dropped_rewinds_.size() > kMaxDroppedRewinds) dropped_rewinds_.pop_front();
      }
      events_.pop_front();
      ++first_;
    }
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

std::vector<v1::JobEvent> JobEvents::Since(size_t seen, bool* ended, size_t* missed, size_t* notes_dropped) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::JobEvent> out;
  const size_t end = first_ + events_.size();
  const size_t from = std::max(seen, first_);
  if (missed != nullptr) *missed = from - seen;
  if (notes_dropped != nullptr) *notes_dropped = notes_dropped_;
  *ended = ended_;
  // A number past the last published has nothing yet: the reply is not sized by a
  // difference that wraps.
  if (from >= end) return out;
  out.reserve(end - from);
  for (size_t i = from; i < end; ++i) out.push_back(events_[i - first_].event);
  return out;
}

std::optional<v1::JobEvent> JobEvents::LowestRewindIn(size_t from, size_t to, size_t* number) const {
  std::lock_guard<std::mutex> lock(mu_);
  const v1::JobEvent* lowest = nullptr;
  auto consider = [&](size_t i, const v1::JobEvent& event) {
    if (i < from || i >= to || !event.has_rewind()) return;
    if (lowest == nullptr || event.rewind().to_round() <= lowest->rewind().to_round()) {
      lowest = &event;
      *number = i;
    }
  };
  for (const auto& [i, event] : dropped_rewinds_) consider(i, event);
  for (size_t i = std::max(from, first_); i < std::min(to, first_ + events_.size()); ++i) {
    consider(i, events_[i - first_].event);
  }
  if (lowest == nullptr) return std::nullopt;
  return *lowest;
}

size_t JobEvents::published() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_ + events_.size();
}

size_t JobEvents::kept() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

size_t JobEvents::oldest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_;
}

size_t JobEvents::OldestWithNotesDropped(size_t* notes_dropped) const {
  std::lock_guard<std::mutex> lock(mu_);
  *notes_dropped = notes_dropped_;
  return first_;
}

size_t JobEvents::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
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
