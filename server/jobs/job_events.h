// The event log of one job, for `tessera watch`: one event per committed round, notes
// (retries, rejected updates), and a final event when the job ends.
//
// Watchers are pushed to, not polled: Subscribe() registers a callback that Publish() and
// End() call after each change, and the watcher reads what is new with Since(). Nothing
// blocks. Thread-safe.
//
// Bounded: the log keeps its last `capacity` events, and no more of them than fit in
// `max_bytes` of serialized events (the newest is always kept). A round's event carries its
// whole round record, about 640 bytes a client: at 1,000 clients a thousand rounds' events
// would hold 640 MB (parsed, about three times its serialized bytes). Every committed round is in the state store as well, which is where a
// watch starts from. Events are numbered from 0 in the order published, and a watcher keeps
// the number of the next one it wants; one that fell behind the oldest kept event skips
// forward to it, and Since() tells it how many it missed. The rewinds (JobEvent.rewind) it
// drops are kept aside, a few, for the watches that start or fall behind after them.
//
// Each event is bounded as it is published (proto/record_bounds.h, BoundJobEvent): a note's
// text, the job's error, a progress's awaited workers, whoever made it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <optional>
#include <vector>

#include "tessera/v1/job_service.pb.h"

namespace tessera::server {

class JobEvents {
 public:
  static constexpr size_t kDefaultCapacity = 1000;
  static constexpr size_t kDefaultMaxBytes = 8 << 20;
  explicit JobEvents(size_t capacity = kDefaultCapacity, size_t max_bytes = kDefaultMaxBytes)
      : capacity_(capacity == 0 ? 1 : capacity), max_bytes_(max_bytes) {}

  void Publish(v1::JobEvent event);
  void End();  // the job reached a final state; watchers drain and finish

  // The kept events numbered `seen` and after. *ended is set once the log is closed and
  // everything has been returned. *missed (when given) is set to how many events from `seen`
  // on were dropped before they could be returned; the watcher's next `seen` is
  // seen + *missed + the events returned. *notes_dropped (when given) is set to how many notes
  // (IsNote) the log has dropped in all, at the same moment: a watcher that counts the notes
  // before its `seen` (OldestWithNotesDropped at its start, then those it read) learns how many
  // notes it missed.
  std::vector<v1::JobEvent> Since(size_t seen, bool* ended, size_t* missed = nullptr, size_t* notes_dropped = nullptr);
  // A note: an event with a message and neither a round nor a progress.
  static bool IsNote(const v1::JobEvent& event) {
    return !event.message().empty() && !event.has_round() && !event.has_progress();
  }
  // Of the events numbered in [from, to) that moved the job back (JobEvent.rewind), the one to
  // the oldest round (the last of those to the same round), with its number in *number; none
  // when there is none. Rewinds dropped from the log are kept for this, without their job, the
  // last kMaxDroppedRewinds of them (a job moves back once each time it resumes).
  std::optional<v1::JobEvent> LowestRewindIn(size_t from, size_t to, size_t* number) const;
  static constexpr size_t kMaxDroppedRewinds = 16;
  // oldest(), and how many notes were dropped before it, read together.
  size_t OldestWithNotesDropped(size_t* notes_dropped) const;
  // Events published so far, and how many of them are kept.
  size_t published() const;
  size_t kept() const;
  size_t kept_bytes() const;  // the kept events' serialized bytes
  size_t oldest() const;      // the number of the oldest kept event (published() when none)
  size_t capacity() const { return capacity_; }
  size_t max_bytes() const { return max_bytes_; }

  // `changed` is called after every Publish() and End(), on the publishing thread, without
  // the log's lock held (so it may call Since()); it must not block. It may still be called
  // once or twice just after Unsubscribe() returns, and must then do nothing harmful
  // (capture a weak_ptr, not a raw pointer). Returns the id for Unsubscribe().
  uint64_t Subscribe(std::function<void()> changed);
  void Unsubscribe(uint64_t id);

 private:
  void NotifyWatchers();

  struct Kept {
    v1::JobEvent event;
    size_t bytes;  // event.ByteSizeLong() when published
    bool note;     // IsNote(event)
  };

  const size_t capacity_;
  const size_t max_bytes_;
  mutable std::mutex mu_;  // guards everything below; never held while calling a watcher
  std::deque<Kept> events_;  // the last events, within capacity_ and max_bytes_
  size_t bytes_ = 0;         // the sum of events_[i].bytes
  size_t first_ = 0;         // the number of events_.front()
  size_t notes_dropped_ = 0;  // notes among the events numbered before first_
  std::deque<std::pair<size_t, v1::JobEvent>> dropped_rewinds_;  // number and event, oldest first
  bool ended_ = false;
  std::map<uint64_t, std::function<void()>> watchers_;
  uint64_t next_watcher_ = 1;
};

}  // namespace tessera::server
