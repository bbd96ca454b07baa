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
// What it holds travels in each committed round's checkpoint (ToTensor, FromTensor), so that a
// resumed job's selection knows every client an uninterrupted one would, however many rounds
// ago it was last seen.
//
// Not thread-safe: the job's thread owns it. Memory: kKeptTimes times and a few numbers per
// client that took part in the job.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "core/tensor.h"
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
    bool operator==(const ReportTime& other) const = default;
  };
  // Its last accepted update: the mean train loss it reported and its samples.
  struct Training {
    double train_loss = 0;
    uint64_t samples = 0;
    bool operator==(const Training& other) const = default;
  };

  // Takes in a committed round's reports, in round order.
  void Observe(const v1::RoundRecord& record, const v1::JobSpec& spec);

  // The client's expected time to report, or none when it was never timed.
  std::optional<ReportTime> ExpectedTime(const std::string& seat) const;
  std::optional<Training> LastAccepted(const std::string& seat) const;
  // The last round it was selected in; 0 when never.
  uint32_t LastSelected(const std::string& seat) const;
  size_t clients() const { return clients_.size(); }
  bool operator==(const ClientHistory& other) const = default;

  // The history as bytes ("TSRHIST1", then each client in seat order), and back. Decode reads
  // `bytes` as hostile: a count past what the bytes can hold, a seat longer than kMaxSeatBytes
  // or out of order (each seat once), more than kKeptTimes times, a time or loss out of the
  // range Observe keeps, a flag other than 0 or 1, or bytes left over are DataLoss naming
  // `source`, the client and the field.
  static constexpr size_t kMaxSeatBytes = 1024;
  std::string Encode() const;
  static Result<ClientHistory> Decode(std::string_view bytes, const std::string& source);
  // The encoding as a float32 tensor named kTensorName, for a checkpoint: its length in its
  // first two values (24 bits each), then three bytes a value, each value an integer below
  // 2^24 (exact in float32, and never a NaN a copy could change). FromTensor refuses, as
  // DataLoss naming `source` and the field, a tensor of another shape or of more than
  // kMaxEncodedBytes, a value that is no such integer, or a length that does not fit the
  // values, then decodes. (A history of 100,000 clients takes about 20 MB.)
  static constexpr uint64_t kMaxEncodedBytes = uint64_t{256} << 20;
  static constexpr std::string_view kTensorName = "selection/history";
  NamedTensor ToTensor() const;
  static Result<ClientHistory> FromTensor(const NamedTensor& tensor, const std::string& source);

 private:
  struct Entry {
    std::deque<ReportTime> times;  // oldest first
    std::optional<Training> accepted;
    uint32_t last_selected = 0;
    bool operator==(const Entry& other) const = default;
  };
  std::map<std::string, Entry> clients_;
};

}  // namespace tessera::server
