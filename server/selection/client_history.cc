#include "server/selection/client_history.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/escape.h"
#include "server/selection/selection.h"

namespace tessera::server {
namespace {

bool StartsWith(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

constexpr double kMaxMs = 7 * 24 * 3600e3;
constexpr double kMaxLoss = 1e30;
constexpr char kMagic[] = "TSRHIST1";

// A time from a report: finite, not negative, at most a week (Round::Admit bounds what a
// worker claims; a record from the store is read as hostile all the same).
double Bounded(double ms) { return std::isfinite(ms) ? std::clamp(ms, 0.0, kMaxMs) : 0; }

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

// Reads the encoding front to back; each read fails once the bytes run out.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  bool Get(T* value) {
    if (bytes_.size() < sizeof(T)) return false;
    std::memcpy(value, bytes_.data(), sizeof(T));
    bytes_.remove_prefix(sizeof(T));
    return true;
  }
  bool GetBytes(size_t n, std::string* out) {
    if (bytes_.size() < n) return false;
    out->assign(bytes_.data(), n);
    bytes_.remove_prefix(n);
    return true;
  }
  size_t left() const { return bytes_.size(); }

 private:
  std::string_view bytes_;
};

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
      const double loss = std::isfinite(w.train_loss()) ? std::clamp(w.train_loss(), 0.0, kMaxLoss) : 0;
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

std::string ClientHistory::Encode() const {
  std::string out(kMagic, 8);
  Put<uint32_t>(&out, static_cast<uint32_t>(clients_.size()));
  for (const auto& [seat, entry] : clients_) {
    Put<uint32_t>(&out, static_cast<uint32_t>(seat.size()));
    out.append(seat);
    Put<uint32_t>(&out, entry.last_selected);
    Put<uint8_t>(&out, entry.accepted ? 1 : 0);
    if (entry.accepted) {
      Put<double>(&out, entry.accepted->train_loss);
      Put<uint64_t>(&out, entry.accepted->samples);
    }
    Put<uint8_t>(&out, static_cast<uint8_t>(entry.times.size()));
    for (const ReportTime& t : entry.times) {
      Put<double>(&out, t.ms);
      Put<uint8_t>(&out, t.at_least ? 1 : 0);
    }
  }
  return out;
}

Result<ClientHistory> ClientHistory::Decode(std::string_view bytes, const std::string& source) {
  const std::string where = source + ": selection history";
  if (bytes.size() < 12 || bytes.compare(0, 8, std::string_view(kMagic, 8)) != 0) {
    return DataLossError(where + ": expected magic " + kMagic + " and a client count");
  }
  Reader in(bytes.substr(8));
  uint32_t count = 0;
  in.Get(&count);
  // The smallest client takes 10 bytes (an empty seat, no update, no time): a count the bytes
  // cannot hold is refused before anything is made for it.
  constexpr size_t kMinClientBytes = 4 + 4 + 1 + 1;
  if (count > in.left() / kMinClientBytes) {
    return DataLossError(where + ": field 'clients': " + std::to_string(count) + " clients do not fit in the " +
                         std::to_string(in.left()) + " bytes after the count");
  }
  ClientHistory history;
  std::string previous;
  for (uint32_t i = 0; i < count; ++i) {
    const std::string client = where + ": client " + std::to_string(i);
    const auto truncated = [&](const char* field) {
      return DataLossError(client + ": field '" + field + "': the bytes end before it");
    };
    uint32_t seat_bytes = 0;
    if (!in.Get(&seat_bytes)) return truncated("seat");
    if (seat_bytes > kMaxSeatBytes) {
      return DataLossError(client + ": field 'seat': " + std::to_string(seat_bytes) + " bytes; expected at most " +
                           std::to_string(kMaxSeatBytes));
    }
    std::string seat;
    if (!in.GetBytes(seat_bytes, &seat)) return truncated("seat");
    if (i > 0 && !(previous < seat)) {
      return DataLossError(client + ": field 'seat': " + QuoteUntrusted(seat, 160) +
                           " is not after the seat before it; expected each seat once, in order");
    }
    Entry entry;
    uint8_t accepted = 0, times = 0;
    if (!in.Get(&entry.last_selected)) return truncated("last_selected");
    if (!in.Get(&accepted)) return truncated("accepted");
    if (accepted > 1) {
      return DataLossError(client + ": field 'accepted': " + std::to_string(accepted) + "; expected 0 or 1");
    }
    if (accepted == 1) {
      Training training;
      if (!in.Get(&training.train_loss)) return truncated("train_loss");
      if (!in.Get(&training.samples)) return truncated("samples");
      if (!(training.train_loss >= 0 && training.train_loss <= kMaxLoss)) {
        return DataLossError(client + ": field 'train_loss': expected a number from 0 to 1e30");
      }
      entry.accepted = training;
    }
    if (!in.Get(&times)) return truncated("times");
    if (times > kKeptTimes) {
      return DataLossError(client + ": field 'times': " + std::to_string(times) + "; expected at most " +
                           std::to_string(kKeptTimes));
    }
    for (uint8_t t = 0; t < times; ++t) {
      ReportTime time;
      uint8_t at_least = 0;
      if (!in.Get(&time.ms) || !in.Get(&at_least)) return truncated("times");
      if (!(time.ms >= 0 && time.ms <= kMaxMs) || at_least > 1) {
        return DataLossError(client + ": field 'times': time " + std::to_string(t) +
                             " is out of range; expected 0 to " + std::to_string(static_cast<uint64_t>(kMaxMs)) +
                             " ms and a flag 0 or 1");
      }
      time.at_least = at_least == 1;
      entry.times.push_back(time);
    }
    history.clients_.emplace_hint(history.clients_.end(), seat, std::move(entry));
    previous = std::move(seat);
  }
  if (in.left() != 0) {
    return DataLossError(where + ": " + std::to_string(in.left()) + " bytes after the last client; expected none");
  }
  return history;
}

NamedTensor ClientHistory::ToTensor() const {
  const std::string bytes = Encode();
  const uint64_t length = bytes.size();
  const size_t values = 2 + (bytes.size() + 2) / 3;
  NamedTensor t{std::string(kTensorName), {static_cast<int64_t>(values)}, std::vector<float>(values, 0.0f)};
  t.values[0] = static_cast<float>(length & 0xffffff);
  t.values[1] = static_cast<float>(length >> 24);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = 0;
    for (size_t k = 0; k < 3 && i + k < bytes.size(); ++k) v |= uint32_t{static_cast<uint8_t>(bytes[i + k])} << (8 * k);
    t.values[2 + i / 3] = static_cast<float>(v);
  }
  return t;
}

Result<ClientHistory> ClientHistory::FromTensor(const NamedTensor& tensor, const std::string& source) {
  const std::string where = source + ": tensor '" + std::string(kTensorName) + "'";
  constexpr uint64_t kMaxValues = 2 + (kMaxEncodedBytes + 2) / 3;
  if (tensor.shape.size() == 1 && tensor.shape[0] >= 0 && static_cast<uint64_t>(tensor.shape[0]) > kMaxValues) {
    return DataLossError(where + ": field 'shape': " + std::to_string(tensor.shape[0]) + " values; expected at most " +
                         std::to_string(kMaxValues) + " (" + std::to_string(kMaxEncodedBytes) + " bytes of history)");
  }
  const size_t n = tensor.values.size();
  if (tensor.shape.size() != 1 || tensor.shape[0] < 2 || static_cast<uint64_t>(tensor.shape[0]) != n) {
    return DataLossError(where + ": field 'shape': " + EscapeUntrusted(ShapeToString(tensor.shape)) +
                         "; expected one dimension of at least 2, its values' count");
  }
  for (size_t i = 0; i < n; ++i) {
    const float v = tensor.values[i];
    if (!(v >= 0 && v < 16777216.0f) || v != std::floor(v)) {
      return DataLossError(where + ": value " + std::to_string(i) + ": expected an integer from 0 to 2^24 - 1");
    }
  }
  const auto word = [&](size_t i) { return static_cast<uint32_t>(tensor.values[i]); };
  const uint64_t length = uint64_t{word(0)} | (uint64_t{word(1)} << 24);
  if ((length + 2) / 3 != n - 2) {
    return DataLossError(where + ": field 'length': " + std::to_string(length) + " bytes; the tensor holds " +
                         std::to_string(n - 2) + " values of three bytes after it");
  }
  std::string bytes(static_cast<size_t>(length), '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((word(2 + i / 3) >> (8 * (i % 3))) & 0xff);
  return Decode(bytes, source);
}

}  // namespace tessera::server
