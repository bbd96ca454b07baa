// Bounds on the streams the coordinator serves (task channels, watches, downloads, uploads,
// rendezvous waits), so that no caller can hold its memory, connections or buffers forever:
//
//  - StreamCounter: how many streams a caller (its certificate, or without one its IP
//    address) and everyone together may hold open; one more is refused with
//    RESOURCE_EXHAUSTED naming the limit.
//  - StreamDeadline and StreamWatchdog: an idle timeout (the peer sends nothing, or does not
//    take what is written, for this long), a total timeout, and an extra deadline (an
//    upload's round), enforced by one timer thread for the whole coordinator; a stream that
//    passes one is ended with DEADLINE_EXCEEDED naming the limit and its value.
//
// The deadlines and the watchdog read time from a Clock (base/clock.h), the steady clock
// unless one is given; a watchdog and the streams it watches share one clock, which must
// outlive them. Tests give a ManualClock and advance it instead of sleeping.
//
// All thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "base/clock.h"
#include "base/status.h"

namespace tessera::server {

struct StreamLimits {
  // An upload or download that makes no progress for this long (no message from the worker,
  // or a write it does not take) is ended; so is an upload that sends no header. Task
  // channels and watches are idle by nature: for them it bounds a write the peer does not
  // take, and a task channel whose worker has stopped heartbeating.
  std::chrono::milliseconds idle_timeout{60000};
  // An upload or download open for this long in all is ended, whatever its progress. An
  // upload also ends at its round's deadline (it would be refused after it anyway).
  std::chrono::milliseconds transfer_timeout{std::chrono::minutes(30)};
  // Task channels and watches are ended after this long (the worker rejoins, `tessera
  // watch` says so and can be run again).
  std::chrono::milliseconds channel_max_age{std::chrono::hours(24)};
  // Streams one caller (its certificate's role and name, or without a certificate its IP
  // address) may hold open at once, and all callers together. A worker needs a task
  // channel, a download or an upload, and a few rendezvous waits; without certificates, the
  // workers of a site behind one NAT address share one count (about three streams each:
  // 4096 lets a thousand of them through).
  uint32_t max_streams_per_caller = 4096;
  uint32_t max_streams = 16384;

  // Each value within its range; the error names the field, the range and the value.
  Status Validate() const;
};

// Counts open streams per caller and overall. A Slot releases its count when destroyed.
class StreamCounter {
 public:
  class Slot {
   public:
    Slot(StreamCounter* counter, std::string caller) : counter_(counter), caller_(std::move(caller)) {}
    ~Slot() { counter_->Release(caller_); }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    StreamCounter* const counter_;
    const std::string caller_;
  };

  explicit StreamCounter(const StreamLimits& limits) : per_caller_(limits.max_streams_per_caller), total_(limits.max_streams) {}
  // A slot for one more stream of `caller`, or RESOURCE_EXHAUSTED naming the limit that
  // would be passed; `what` names the stream in the message ("upload"). The counter must
  // outlive its slots.
  Result<std::unique_ptr<Slot>> Open(const std::string& caller, const std::string& what);
  size_t open() const;

 private:
  void Release(const std::string& caller);

  const uint32_t per_caller_;
  const uint32_t total_;
  mutable std::mutex mu_;
  std::map<std::string, uint32_t> by_caller_;
  uint32_t open_ = 0;
};

// One stream's clocks, shared by its reactor and the watchdog (which holds a weak_ptr). Made
// with Create (not make_shared), so that a finished stream's memory goes with its reactor, not
// with the watchdog's entry for it.
// Every path that ends the stream first claims the right to with ClaimFinish(), so the
// stream is finished once, and the reactor, which lives until it is finished, is alive
// whenever `expire` runs.
class StreamDeadline {
 public:
  using TimePoint = Clock::TimePoint;
  // `what` names the stream in messages ("upload from 10.0.0.7"); `expire` is called at most
  // once, on the watchdog's thread, with DEADLINE_EXCEEDED naming the limit passed, after
  // the right to finish was claimed for it; it must not block. The idle and total limits
  // count from now on `clock`, the clock of the watchdog that will watch the stream.
  StreamDeadline(std::string what, std::chrono::milliseconds idle, std::chrono::milliseconds total,
                 std::string total_name, std::function<void(Status)> expire, const Clock* clock = &SteadyClock());
  template <typename... Args>
  static std::shared_ptr<StreamDeadline> Create(Args&&... args) {
    return std::shared_ptr<StreamDeadline>(new StreamDeadline(std::forward<Args>(args)...));
  }

  void Progress();  // the peer moved: the idle clock starts again
  // Idle time counts only while the stream waits on its peer (a read posted, a write in
  // flight). Off for an upload that waits for memory, a channel with nothing to send.
  void SetIdleCounted(bool counted);
  // While held, the watchdog does not expire the stream (its reactor is parked where it
  // cannot be finished, e.g. waiting for the upload budget); the reactor checks Expired()
  // itself after Release(). Hold() is false, and holds nothing, when the finish is claimed.
  bool Hold();
  void Release();
  // For a stream with nothing in flight that is idle but might be alive (a task channel):
  // at the idle limit the watchdog asks `alive`; true starts the idle clock again.
  void SetAliveProbe(std::function<bool()> alive);
  // An earlier end than the total timeout, with the reason ("round 3 of job-1-x closed");
  // `at` is on the stream's clock.
  void Cap(TimePoint at, std::string why);
  void Rename(std::string what);

  // True once for the first caller; after it, only that caller may finish the stream.
  bool ClaimFinish();
  bool finish_claimed() const;
  // The limit passed at `now` (DEADLINE_EXCEEDED naming it), if any.
  std::optional<Status> Expired(TimePoint now) const;
  // The limit passed by now, on the stream's clock.
  std::optional<Status> Expired() const { return Expired(clock_->Now()); }
  const Clock& clock() const { return *clock_; }

 private:
  friend class StreamWatchdog;
  // The watchdog's turn at `now`: expire the stream, or the next time to look.
  std::optional<TimePoint> Check(TimePoint now);
  std::optional<Status> ExpiredLocked(TimePoint now) const;

  const Clock* const clock_;
  const TimePoint start_;
  const std::chrono::milliseconds idle_;
  const std::chrono::milliseconds total_;
  const std::string total_name_;
  const std::function<void(Status)> expire_;
  mutable std::mutex mu_;  // guards the fields below; never held while calling expire_ or the probe
  std::string what_;
  TimePoint last_progress_;
  bool idle_counted_ = true;
  bool held_ = false;
  bool finish_claimed_ = false;
  std::function<bool()> alive_;
  std::optional<TimePoint> cap_;
  std::string cap_why_;
};

// One timer thread for every stream's deadline. Watch() returns at once; the stream is
// looked at when its next limit comes, and forgotten once it is finished or gone. Watch a
// stream again after moving its cap earlier.
class StreamWatchdog {
 public:
  explicit StreamWatchdog(const Clock* clock = &SteadyClock()) : clock_(clock) {}
  ~StreamWatchdog();
  // `stream` must be on this watchdog's clock (std::invalid_argument otherwise: a
  // programming error).
  void Watch(const std::shared_ptr<StreamDeadline>& stream);
  const Clock& clock() const { return *clock_; }
  // Stops the thread; streams are no longer expired (the server is finishing them).
  void Shutdown();
  // Streams it still has an entry for, gone or not (entries of gone streams are dropped when
  // they come due, or in a sweep once the entries have doubled).
  size_t entries() const;

 private:
  void Loop();

  void SweepLocked();  // drops the entries of streams that are gone

  const Clock* const clock_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<StreamDeadline::TimePoint, std::weak_ptr<StreamDeadline>> due_;
  // A stream's first look is at its idle limit (a minute by default): a thousand clients'
  // transfers would leave hundreds of thousands of entries of finished streams by then.
  size_t sweep_at_ = kMinSweep;
  static constexpr size_t kMinSweep = 1024;
  std::thread thread_;  // started with the first stream
  bool shutdown_ = false;
  // When the thread's wait ends by itself; min() while it is not waiting (it looks at due_
  // before it waits again). Watch() wakes it only for a stream due earlier than this: a
  // thread woken for every new stream cost the coordinator two context switches per
  // transfer.
  StreamDeadline::TimePoint wakes_at_ = StreamDeadline::TimePoint::min();
  uint64_t changes_ = 0;  // wake-ups asked for by Watch()
};

// "the certificate's role/name" for a caller with a certificate, else its IP address, from
// gRPC's peer string ("ipv4:10.0.0.7:53122").
std::string CallerKey(bool has_certificate, const std::string& role, const std::string& common_name,
                      const std::string& peer);

}  // namespace tessera::server
