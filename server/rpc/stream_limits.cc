#include "server/rpc/stream_limits.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "base/escape.h"

namespace tessera::server {
namespace {

std::string Millis(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

Status CheckRange(const std::string& field, int64_t value, int64_t low, int64_t high, const std::string& unit) {
  if (value >= low && value <= high) return Status::Ok();
  return InvalidArgumentError("coordinator option " + field + ": expected " + std::to_string(low) + " to " +
                              std::to_string(high) + unit + ", got " + std::to_string(value));
}

}  // namespace

Status StreamLimits::Validate() const {
  constexpr int64_t kDay = 24 * 3600 * 1000;
  RETURN_IF_ERROR(CheckRange("stream idle_timeout", idle_timeout.count(), 100, 3600 * 1000, " ms"));
  RETURN_IF_ERROR(CheckRange("stream transfer_timeout", transfer_timeout.count(), idle_timeout.count(), kDay, " ms"));
  RETURN_IF_ERROR(CheckRange("stream channel_max_age", channel_max_age.count(), 1000, 30 * kDay, " ms"));
  RETURN_IF_ERROR(CheckRange("max_streams_per_caller", max_streams_per_caller, 4, 1000000, ""));
  return CheckRange("max_streams", max_streams, max_streams_per_caller, 1000000, "");
}

Result<std::unique_ptr<StreamCounter::Slot>> StreamCounter::Open(const std::string& caller, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint32_t& mine = by_caller_[caller];
    if (mine >= per_caller_) {
      return ResourceExhaustedError(what + " refused: " + caller + " has " + std::to_string(mine) +
                                    " streams open, the limit per caller (max_streams_per_caller) is " +
                                    std::to_string(per_caller_));
    }
    if (open_ >= total_) {
      if (mine == 0) by_caller_.erase(caller);
      return ResourceExhaustedError(what + " refused: the coordinator has " + std::to_string(open_) +
                                    " streams open, its limit (max_streams) is " + std::to_string(total_));
    }
    ++mine;
    ++open_;
  }
  return std::make_unique<Slot>(this, caller);
}

void StreamCounter::Release(const std::string& caller) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_caller_.find(caller);
  if (it != by_caller_.end() && --it->second == 0) by_caller_.erase(it);
  if (open_ > 0) --open_;
}

size_t StreamCounter::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

StreamDeadline::StreamDeadline(std::string what, std::chrono::milliseconds idle, std::chrono::milliseconds total,
                               std::string total_name, std::function<void(Status)> expire, const Clock* clock)
    : clock_(clock),
      start_(clock->Now()),
      idle_(idle),
      total_(total),
      total_name_(std::move(total_name)),
      expire_(std::move(expire)),
      what_(std::move(what)),
      last_progress_(start_) {}

void StreamDeadline::Progress() {
  std::lock_guard<std::mutex> lock(mu_);
  last_progress_ = clock_->Now();
}

void StreamDeadline::SetIdleCounted(bool counted) {
  std::lock_guard<std::mutex> lock(mu_);
  if (counted && !idle_counted_) last_progress_ = clock_->Now();
  idle_counted_ = counted;
}

bool StreamDeadline::Hold() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finish_claimed_) return false;
  held_ = true;
  return true;
}

void StreamDeadline::Release() {
  std::lock_guard<std::mutex> lock(mu_);
  held_ = false;
  last_progress_ = clock_->Now();  // the wait was not the peer's doing
}

void StreamDeadline::SetAliveProbe(std::function<bool()> alive) {
  std::lock_guard<std::mutex> lock(mu_);
  alive_ = std::move(alive);
}

void StreamDeadline::Cap(TimePoint at, std::string why) {
  std::lock_guard<std::mutex> lock(mu_);
  cap_ = at;
  cap_why_ = std::move(why);
}

void StreamDeadline::Rename(std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  what_ = std::move(what);
}

bool StreamDeadline::ClaimFinish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finish_claimed_) return false;
  finish_claimed_ = true;
  return true;
}

bool StreamDeadline::finish_claimed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finish_claimed_;
}

std::optional<Status> StreamDeadline::Expired(TimePoint now) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ExpiredLocked(now);
}

std::optional<Status> StreamDeadline::ExpiredLocked(TimePoint now) const {
  if (cap_ && now >= *cap_) return DeadlineExceededError(what_ + ": " + cap_why_);
  if (now >= start_ + total_) {
    return DeadlineExceededError(what_ + ": open longer than its " + total_name_ + " of " + Millis(total_));
  }
  if (idle_counted_ && now >= last_progress_ + idle_) {
    return DeadlineExceededError(what_ + ": nothing received or taken for " + Millis(idle_) +
                                 ", its idle timeout (idle_timeout)");
  }
  return std::nullopt;
}

std::optional<StreamDeadline::TimePoint> StreamDeadline::Check(TimePoint now) {
  std::function<bool()> probe;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_claimed_) return std::nullopt;
    const bool only_idle = idle_counted_ && now >= last_progress_ + idle_ && (!cap_ || now < *cap_) &&
                           now < start_ + total_;
    if (only_idle && !held_) probe = alive_;
  }
  const bool alive = probe && probe();
  std::optional<Status> expired;
  TimePoint next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_claimed_) return std::nullopt;
    if (alive) last_progress_ = now;
    expired = ExpiredLocked(now);
    if (expired && held_) {
      // The reactor looks for itself when it resumes; look again later in case it does not.
      return now + idle_;
    }
    if (expired) {
      finish_claimed_ = true;
    } else {
      next = start_ + total_;
      if (cap_) next = std::min(next, *cap_);
      next = std::min(next, (idle_counted_ ? last_progress_ : now) + idle_);
    }
  }
  if (expired) {
    expire_(*expired);
    return std::nullopt;
  }
  return next;
}

StreamWatchdog::~StreamWatchdog() { Shutdown(); }

void StreamWatchdog::Watch(const std::shared_ptr<StreamDeadline>& stream) {
  if (stream->clock_ != clock_) {
    throw std::invalid_argument("StreamWatchdog::Watch: the stream's deadline is on another clock than the watchdog's");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (shutdown_) return;
  // First look at the earliest limit: Check() finds the next one from there.
  auto first = clock_->Now() + std::min(stream->idle_, stream->total_);
  {
    std::lock_guard<std::mutex> stream_lock(stream->mu_);
    if (stream->cap_) first = std::min(first, *stream->cap_);
  }
  due_.emplace(first, stream);
  if (due_.size() >= sweep_at_) SweepLocked();
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  if (first < wakes_at_) {
    ++changes_;
    cv_.notify_all();
  }
}

void StreamWatchdog::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutdown_) {
    const auto now = clock_->Now();
    std::vector<std::weak_ptr<StreamDeadline>> due;
    while (!due_.empty() && due_.begin()->first <= now) {
      due.push_back(std::move(due_.begin()->second));
      due_.erase(due_.begin());
    }
    if (due.empty()) {
      const uint64_t seen = changes_;
      const auto until = due_.empty() ? StreamDeadline::TimePoint::max() : due_.begin()->first;
      wakes_at_ = until;
      clock_->WaitUntil(lock, cv_, until, [&] { return shutdown_ || changes_ != seen; });
      wakes_at_ = StreamDeadline::TimePoint::min();
      continue;
    }
    lock.unlock();
    std::vector<std::pair<StreamDeadline::TimePoint, std::weak_ptr<StreamDeadline>>> again;
    for (auto& weak : due) {
      auto stream = weak.lock();
      if (!stream) continue;
      // No exception leaves this thread: a stream whose check throws is logged and dropped.
      try {
        if (auto next = stream->Check(now)) again.emplace_back(*next, std::move(weak));
      } catch (const std::exception& e) {
        spdlog::error("stream watchdog: checking a stream failed: {}", EscapeUntrusted(e.what()));
      }
    }
    lock.lock();
    for (auto& [at, weak] : again) due_.emplace(at, std::move(weak));
  }
}

void StreamWatchdog::SweepLocked() {
  for (auto it = due_.begin(); it != due_.end();) {
    it = it->second.expired() ? due_.erase(it) : std::next(it);
  }
  sweep_at_ = std::max(kMinSweep, 2 * due_.size());
}

size_t StreamWatchdog::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return due_.size();
}

void StreamWatchdog::Shutdown() {
  std::thread thread;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    due_.clear();
    thread = std::move(thread_);
    cv_.notify_all();
  }
  if (thread.joinable()) thread.join();
}

std::string CallerKey(bool has_certificate, const std::string& role, const std::string& common_name,
                      const std::string& peer) {
  if (has_certificate) return "caller '" + role + "/" + common_name + "'";
  // "ipv4:10.0.0.7:53122", "ipv6:[::1]:53122": the address without its port.
  std::string address = peer;
  if (auto colon = address.find(':'); colon != std::string::npos) address = address.substr(colon + 1);
  if (auto port = address.rfind(':'); port != std::string::npos) address = address.substr(0, port);
  return "caller " + address.substr(0, 64);
}

}  // namespace tessera::server
