#include "server/selection/client_history.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "server/selection/selection.h"

namespace tessera::server {
namespace {

bool StartsWith(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

// A time from a report: finite, not negative, at most a week (Round::Admit bounds what a
// worker claims; a record from the store is read as hostile all the same).
double Bounded(double ms) { return std::isfinite(ms) ? std::clamp(ms, 0.0, 7 * 24 * 3600e3) : 0; }

double AcceptedTime(const v1::WorkerRoundReport& w) {
  const double phases = Bounded(w.download_ms()) + Bounded(w.data_load_ms()) + Bounded(w.compute_ms()) +
                        Bounded(w.upload_ms());
  return std::max(Bounded(w.reported_ms()), phases);
}

}  // namespace

void ClientHistory::Observe(const v1::RoundRecord& record, const v1::JobSpec& spec) {
  // The round closed after its accepted updates arrived: a client dropped at the close took
  // longer than each of them, whatever the clocks say (one that stood still in a test, or
  // a worker's phases that add up to more than the coordinator saw).
  double slowest_accepted = 0;
  for (const v1::WorkerRoundReport& w : record.workers()) {
    if (StartsWith(w.outcome(), "accepted")) slowest_accepted = std::max(slowest_accepted, AcceptedTime(w));
  }
  for (const v1::WorkerRoundReport& w : record.workers()) {
    Entry& entry = clients_[SeatOf(w)];
    entry.last_selected = std::max(entry.last_selected, record.round());
    const std::string& outcome = w.outcome();
    ReportTime time;
    if (StartsWith(outcome, "accepted")) {  // "accepted: clipped, ..." too
      time.ms = AcceptedTime(w);
      const double loss = std::isfinite(w.train_loss()) ? std::clamp(w.train_loss(), 0.0, 1e30) : 0;
      entry.accepted = Training{loss, w.samples()};
    } else if (StartsWith(outcome, "dropped: over-selected")) {
      time = {std::max(Bounded(w.dropped_ms()), slowest_accepted), true};
    } else if (StartsWith(outcome, "dropped: deadline")) {
      // A record from before dropped_ms: it was dropped at the deadline.
      const double dropped = w.dropped_ms() > 0 ? Bounded(w.dropped_ms()) : static_cast<double>(spec.round_deadline_ms());
      time = {std::max(dropped, slowest_accepted), true};
    } else {
      continue;  // failed, lost or refused: nothing about its speed
    }
    entry.times.push_back(time);
    if (entry.times.size() > kKeptTimes) entry.times.pop_front();
  }
}

std::optional<ClientHistory::ReportTime> ClientHistory::ExpectedTime(const std::string& seat) const {
  auto it = clients_.find(seat);
  if (it == clients_.end() || it->second.times.empty()) return std::nullopt;
  std::vector<ReportTime> sorted(it->second.times.begin(), it->second.times.end());
  std::sort(sorted.begin(), sorted.end());
  return sorted[sorted.size() / 2];  // the upper median: of two, the slower
}

std::optional<ClientHistory::Training> ClientHistory::LastAccepted(const std::string& seat) const {
  auto it = clients_.find(seat);
  if (it == clients_.end()) return std::nullopt;
  return it->second.accepted;
}

uint32_t ClientHistory::LastSelected(const std::string& seat) const {
  auto it = clients_.find(seat);
  return it == clients_.end() ? 0 : it->second.last_selected;
}

}  // namespace tessera::server
