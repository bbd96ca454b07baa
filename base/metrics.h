// Metrics a process exposes to Prometheus: counters, gauges and histograms, each a family of
// series told apart by a fixed list of label names, rendered in Prometheus' text exposition
// format (version 0.0.4) by Registry::Render().
//
// A family is declared once, with its name, help, unit-bearing name ("_seconds", "_bytes")
// and label names; a series is looked up by its label values and kept for the life of the
// process (once retired, it may be reused for new label values), so hot paths hold on to the
// series they use. Label values come from a bounded set
// (jobs, workers, phases, reasons), never per round; a family refuses to grow past
// `max_series` and counts what it folded into the series whose labels are all "other", once
// the series retired (FamilyBase::Retire: an ended job's) have made room.
//
// Thread-safe. Updates are lock-free atomics; Render() takes each family's lock briefly.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tessera::metrics {

using Labels = std::vector<std::string>;

class Counter {
 public:
  void Inc(double delta = 1) { value_.fetch_add(delta, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  friend class CounterFamily;
  void Reset() { value_.store(0, std::memory_order_relaxed); }
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta) { value_.fetch_add(delta, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  friend class GaugeFamily;
  void Reset() { value_.store(0, std::memory_order_relaxed); }
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  explicit Histogram(const std::vector<double>* bounds);
  void Observe(double value);
  // Cumulative counts per bound (the last is +Inf), the sum and the count.
  std::vector<uint64_t> CumulativeCounts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  friend class HistogramFamily;
  void Reset();
  const std::vector<double>* bounds_;  // ascending, owned by the family
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_->size() + 1 (+Inf)
  std::atomic<double> sum_{0};
  std::atomic<uint64_t> count_{0};
};

// Bucket bounds for latencies in seconds: 1 ms to about 10 minutes.
std::vector<double> LatencyBuckets();
// Coarse bounds for latencies in seconds, for families with a series per worker (thousands
// of them): 50 ms to 2 minutes in six buckets.
std::vector<double> CoarseLatencyBuckets();
// Bucket bounds for sizes in bytes: 1 KiB to 4 GiB, by powers of four.
std::vector<double> ByteBuckets();

enum class Kind { kCounter, kGauge, kHistogram };

class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, Kind kind, Labels label_names, size_t max_series);
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  void Render(std::string* out) const;

  // Says that the series whose label `label_name` holds `value` will not be updated again (the
  // job they count has ended): they are still rendered, but once the family is full they make
  // room for new label values, the longest retired first, instead of those new values being
  // folded into "other". A series that makes room is set back to zero in place, never freed,
  // so a reference from With() that a writer still holds stays valid; an update made through
  // it after that counts toward the new label values. A retired series asked for again by
  // With() counts as live again.
  void Retire(const std::string& label_name, const std::string& value);

 protected:
  virtual void RenderSeries(const std::string& labels, size_t index, std::string* out) const = 0;
  virtual size_t AddSeriesLocked() = 0;
  // Sets series `index` back to zero in place: the object stays where it is, since a writer
  // may still hold a reference to it.
  virtual void ResetSeriesLocked(size_t index) = 0;
  // The series' index for `values`; values.size() must equal the label names'.
  size_t IndexOf(const Labels& values);

  const std::string name_;
  const std::string help_;
  const Kind kind_;
  const Labels label_names_;
  const size_t max_series_;
  mutable std::mutex mu_;
  std::map<Labels, size_t> index_;  // label values -> series
  std::vector<char> retired_;        // by series: retired and not asked for since
  std::deque<size_t> retired_order_;  // series in the order they were retired
};

template <typename Series>
class Family : public FamilyBase {
 public:
  using FamilyBase::FamilyBase;
  // The series for `values` (created on first use). The reference stays valid for the life
  // of the family; once the series is retired (Retire) and its room taken by new label
  // values, it counts for those.
  Series& With(const Labels& values = {}) {
    const size_t i = IndexOf(values);
    std::lock_guard<std::mutex> lock(mu_);
    return *series_[i];
  }

 protected:
  std::vector<std::unique_ptr<Series>> series_;  // grows under mu_; never replaced or freed
};

class CounterFamily : public Family<Counter> {
 public:
  using Family<Counter>::Family;

 private:
  void RenderSeries(const std::string& labels, size_t index, std::string* out) const override;
  size_t AddSeriesLocked() override;
  void ResetSeriesLocked(size_t index) override;
};

class GaugeFamily : public Family<Gauge> {
 public:
  using Family<Gauge>::Family;

 private:
  void RenderSeries(const std::string& labels, size_t index, std::string* out) const override;
  size_t AddSeriesLocked() override;
  void ResetSeriesLocked(size_t index) override;
};

class HistogramFamily : public Family<Histogram> {
 public:
  HistogramFamily(std::string name, std::string help, Labels label_names, std::vector<double> bounds,
                  size_t max_series);

 private:
  void RenderSeries(const std::string& labels, size_t index, std::string* out) const override;
  size_t AddSeriesLocked() override;
  void ResetSeriesLocked(size_t index) override;
  const std::vector<double> bounds_;
  std::vector<std::string> bound_text_;  // le="..." of each bucket, +Inf last
};

class Registry {
 public:
  static constexpr size_t kDefaultMaxSeries = 2000;

  // Declaring a name twice returns the first family (its help and labels must agree).
  CounterFamily& Counter(const std::string& name, const std::string& help, Labels label_names = {},
                         size_t max_series = kDefaultMaxSeries);
  GaugeFamily& Gauge(const std::string& name, const std::string& help, Labels label_names = {},
                     size_t max_series = kDefaultMaxSeries);
  HistogramFamily& Histogram(const std::string& name, const std::string& help, Labels label_names,
                             std::vector<double> bounds, size_t max_series = kDefaultMaxSeries);
  // Called at each Render(), before the families are written: for values read when scraped
  // (memory, open files, queue lengths). Returns an id for RemoveCollector(), after which the
  // collector is not running and never runs again (so what it reads may then go away). A
  // collector must not add or remove collectors.
  uint64_t AddCollector(std::function<void()> collect);
  void RemoveCollector(uint64_t id);

  // Every family in the text format, sorted by name.
  std::string Render();

 private:
  std::mutex collect_mu_;  // held while collectors run; taken before mu_
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<FamilyBase>> families_;
  std::map<uint64_t, std::function<void()>> collectors_;
  std::atomic<size_t> last_size_{0};  // the last page's size, to reserve the next
  uint64_t next_collector_ = 1;
};

// The process's registry: what its /metrics endpoint serves.
Registry& Global();

// Declares the process_* metrics (resident memory, CPU seconds, open files, threads, start
// time) in `registry`, read from /proc at each scrape.
void RegisterProcessMetrics(Registry& registry);

// The longest label value kept, in bytes; a longer one is cut between characters.
inline constexpr size_t kMaxLabelValueBytes = 128;

// A label value as the text format writes it: valid UTF-8 (Prometheus refuses a page with a
// value that is not; each stray byte becomes U+FFFD), cut to 128 bytes between characters,
// backslash, quote and newline escaped.
std::string EscapeLabelValue(const std::string& value);

}  // namespace tessera::metrics
