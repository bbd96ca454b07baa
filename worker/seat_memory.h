// What a worker keeps for a job's seat ("JOB#PARTY") between rounds: top-k's residual, FedBN's
// local tensors. In memory only, and bounded: past its limit the seat used longest ago goes (a
// job that ended, whose seat is never used again), never the seat being kept.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace tessera::worker {

template <typename Value>
class SeatMemory {
 public:
  explicit SeatMemory(size_t limit) : limit_(limit) {}

  // The seat's value, counted as used now; nullptr when none is kept.
  Value* Find(const std::string& seat) {
    auto it = entries_.find(seat);
    if (it == entries_.end()) return nullptr;
    it->second.used = ++clock_;
    return &it->second.value;
  }
  // Keeps `value` for `seat`, counted as used now; past the limit, drops the seats used longest
  // ago (never `seat`).
  void Keep(const std::string& seat, Value value) {
    entries_[seat] = Entry{std::move(value), ++clock_};
    while (entries_.size() > limit_ && entries_.size() > 1) {
      auto oldest = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->first != seat && (oldest == entries_.end() || it->second.used < oldest->second.used)) oldest = it;
      }
      entries_.erase(oldest);
    }
  }
  void Erase(const std::string& seat) { entries_.erase(seat); }
  // Drops every seat of `job` ("JOB#PARTY").
  void EraseJob(const std::string& job) {
    std::erase_if(entries_, [&](const auto& entry) { return entry.first.rfind(job + "#", 0) == 0; });
  }

  // The jobs that have a seat kept: each seat's name before its '#' (a job id has none).
  std::set<std::string> Jobs() const {
    std::set<std::string> jobs;
    for (const auto& [seat, entry] : entries_) jobs.insert(seat.substr(0, seat.find('#')));
    return jobs;
  }

  bool Holds(const std::string& seat) const { return entries_.count(seat) > 0; }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    Value value;
    uint64_t used = 0;
  };
  const size_t limit_;
  std::map<std::string, Entry> entries_;
  uint64_t clock_ = 0;
};

}  // namespace tessera::worker
