// What a job's committed rounds say about each client, for the selection policies that learn
// from them (server/selection/deadline_selection.h, server/selection/utility_selection.h).
//
// Per client (by seat: a lone worker, or "cohort:NAME"):
//  - the time it took to report in each of its last kKeptTimes timed rounds:
//    - an accepted update took max(reported_ms, download + data loading + compute + upload):
//      the coordinator's time from the round's tasks being sent to its update's arrival, or
//      the worker's own phases when those add up to more (a record from before reported_ms,
//      or a report on a clock that stood still);
//    - a client dropped unreported at the round's close (its deadline, or over-selected)
//      took at least dropped_ms (the deadline for an older record without it), and at least
//      as long as each accepted client of that round: a lower bound, which ranks after an
//      equal time that was measured;
//    - a failure, a lost worker or a refused update says nothing about its speed;
//  - the train loss and sample count of its last accepted update;
//  - the last round it was selected in, whatever came of it.
// Its expected time is the upper median of its kept times (of two, the slower).
//
// Not thread-safe: the job's thread owns it. Memory: kKeptTimes times and a few numbers per
// client that took part in the job.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "tessera/v1/job.pb.h"

namespace tessera::server {

class ClientHistory {
 public:
  static constexpr size_t kKeptTimes = 5;

  // A time a client took to report, in ms; `at_least`: it had not reported then.
  struct ReportTime {
    double ms = 0;
    bool at_least = false;
    // Shorter first; a measured time before a lower bound of the same value.
    bool operator<(const ReportTime& other) const {
      return ms != other.ms ? ms < other.ms : (!at_least && other.at_least);
    }
  };
  // Its last accepted update: the mean train loss it reported and its samples.
  struct Training {
    double train_loss = 0;
    uint64_t samples = 0;
  };

  // Takes in a committed round's reports, in round order.
  void Observe(const v1::RoundRecord& record, const v1::JobSpec& spec);

  // The client's expected time to report, or none when it was never timed.
  std::optional<ReportTime> ExpectedTime(const std::string& seat) const;
  std::optional<Training> LastAccepted(const std::string& seat) const;
  // The last round it was selected in; 0 when never.
  uint32_t LastSelected(const std::string& seat) const;

 private:
  struct Entry {
    std::deque<ReportTime> times;  // oldest first
    std::optional<Training> accepted;
    uint32_t last_selected = 0;
  };
  std::map<std::string, Entry> clients_;
};

}  // namespace tessera::server
