#include "base/metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "base/escape.h"

namespace tessera::metrics {
namespace {

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kCounter: return "counter";
    case Kind::kGauge: return "gauge";
    case Kind::kHistogram: return "histogram";
  }
  return "untyped";
}

std::string Number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // The shortest of 15 or 17 significant digits that reads back as the same double.
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.15g", value);
  if (std::strtod(buffer, nullptr) != value) std::snprintf(buffer, sizeof(buffer), "%.17g", value);
  return buffer;
}

void AtomicAdd(std::atomic<double>& target, double delta) { target.fetch_add(delta, std::memory_order_relaxed); }

// HELP text as the text format writes it: backslash and line feed escaped.
std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (const char c : help) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// "{a="x",b="y"}" (empty when there are no labels), with `extra` (such as le="0.5") last.
std::string LabelText(const Labels& names, const Labels& values, const std::string& extra = "") {
  std::string out;
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) {
    out += (out.empty() ? "" : ",") + names[i] + "=\"" + EscapeLabelValue(values[i]) + "\"";
  }
  if (!extra.empty()) out += (out.empty() ? "" : ",") + extra;
  return out.empty() ? out : "{" + out + "}";
}

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (const char c : ValidUtf8(value, kMaxLabelValueBytes)) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), buckets_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_->size() && value > (*bounds_)[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
  count_.fetch_add(1, std::memory_order_relaxed);
}

void Histogram::Reset() {
  for (size_t i = 0; i <= bounds_->size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
  sum_.store(0, std::memory_order_relaxed);
  count_.store(0, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> counts(bounds_->size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    counts[i] = running;
  }
  return counts;
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 600};
}

std::vector<double> CoarseLatencyBuckets() { return {0.05, 0.25, 1, 5, 30, 120}; }

std::vector<double> ByteBuckets() {
  std::vector<double> bounds;
  for (double b = 1024; b <= 4.0 * 1024 * 1024 * 1024; b *= 4) bounds.push_back(b);
  return bounds;
}

FamilyBase::FamilyBase(std::string name, std::string help, Kind kind, Labels label_names, size_t max_series)
    : name_(std::move(name)),
      help_(std::move(help)),
      kind_(kind),
      label_names_(std::move(label_names)),
      max_series_(max_series < 1 ? 1 : max_series) {}

size_t FamilyBase::IndexOf(const Labels& given) {
  Labels values = given;
  values.resize(label_names_.size());
  for (auto& v : values) v = ValidUtf8(v, kMaxLabelValueBytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(values); it != index_.end()) {
    retired_[it->second] = 0;  // in use again
    return it->second;
  }
  if (index_.size() + 1 >= max_series_) {
    // Full: the longest retired series (an ended job's) makes room, its slot reused at zero.
    while (!retired_order_.empty()) {
      const size_t i = retired_order_.front();
      retired_order_.pop_front();
      if (!retired_[i]) continue;  // asked for again since, or gone already
      retired_[i] = 0;
      std::erase_if(index_, [i](const auto& entry) { return entry.second == i; });
      ResetSeriesLocked(i);
      index_.emplace(std::move(values), i);
      return i;
    }
    // Nothing retired: everything new shares one series, so a flood of names cannot grow the
    // process.
    Labels other(label_names_.size(), "other");
    if (auto it = index_.find(other); it != index_.end()) return it->second;
    values = other;
  }
  const size_t i = AddSeriesLocked();
  if (retired_.size() <= i) retired_.resize(i + 1, 0);
  index_.emplace(values, i);
  return i;
}

void FamilyBase::Retire(const std::string& label_name, const std::string& value) {
  const auto name = std::find(label_names_.begin(), label_names_.end(), label_name);
  if (name == label_names_.end()) return;
  const size_t k = static_cast<size_t>(name - label_names_.begin());
  const std::string key = ValidUtf8(value, kMaxLabelValueBytes);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [values, i] : index_) {
    if (values[k] != key || retired_[i]) continue;
    retired_[i] = 1;
    retired_order_.push_back(i);
  }
  // Series retired, asked for again and retired again leave stale entries: keep the queue
  // within the series' number, each retired series once, in order.
  if (retired_order_.size() > 2 * max_series_) {
    std::vector<char> kept(retired_.size(), 0);
    std::erase_if(retired_order_, [&](size_t i) {
      if (!retired_[i] || kept[i]) return true;
      kept[i] = 1;
      return false;
    });
  }
}

void FamilyBase::Render(std::string* out) const {
  *out += "# HELP " + name_ + " " + EscapeHelp(help_) + "\n# TYPE " + name_ + " " + KindName(kind_) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [values, index] : index_) RenderSeries(LabelText(label_names_, values), index, out);
}

void CounterFamily::RenderSeries(const std::string& labels, size_t index, std::string* out) const {
  out->append(name_).append(labels).append(" ").append(Number(series_[index]->value())).append("\n");
}

size_t CounterFamily::AddSeriesLocked() {
  series_.push_back(std::make_unique<metrics::Counter>());
  return series_.size() - 1;
}

void CounterFamily::ResetSeriesLocked(size_t index) { series_[index]->Reset(); }

void GaugeFamily::RenderSeries(const std::string& labels, size_t index, std::string* out) const {
  out->append(name_).append(labels).append(" ").append(Number(series_[index]->value())).append("\n");
}

size_t GaugeFamily::AddSeriesLocked() {
  series_.push_back(std::make_unique<metrics::Gauge>());
  return series_.size() - 1;
}

void GaugeFamily::ResetSeriesLocked(size_t index) { series_[index]->Reset(); }

HistogramFamily::HistogramFamily(std::string name, std::string help, Labels label_names, std::vector<double> bounds,
                                 size_t max_series)
    : Family<metrics::Histogram>(std::move(name), std::move(help), Kind::kHistogram, std::move(label_names),
                                 max_series),
      bounds_(std::move(bounds)) {
  for (double b : bounds_) bound_text_.push_back(Number(b));
  bound_text_.push_back("+Inf");
}

void HistogramFamily::RenderSeries(const std::string& labels, size_t index, std::string* out) const {
  const auto& h = *series_[index];
  const auto counts = h.CumulativeCounts();
  // name_bucket{labels,le="bound"} count: the labels without their braces, then le.
  std::string prefix = name_ + "_bucket{";
  if (!labels.empty()) prefix.append(labels, 1, labels.size() - 2).append(",");
  prefix += "le=\"";
  for (size_t i = 0; i < counts.size(); ++i) {
    out->append(prefix).append(bound_text_[i]).append("\"} ").append(std::to_string(counts[i])).append("\n");
  }
  out->append(name_).append("_sum").append(labels).append(" ").append(Number(h.sum())).append("\n");
  out->append(name_).append("_count").append(labels).append(" ").append(std::to_string(h.count())).append("\n");
}

size_t HistogramFamily::AddSeriesLocked() {
  series_.push_back(std::make_unique<metrics::Histogram>(&bounds_));
  return series_.size() - 1;
}

void HistogramFamily::ResetSeriesLocked(size_t index) { series_[index]->Reset(); }

CounterFamily& Registry::Counter(const std::string& name, const std::string& help, Labels label_names,
                                 size_t max_series) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = families_[name];
  if (!slot) slot = std::make_unique<CounterFamily>(name, help, Kind::kCounter, std::move(label_names), max_series);
  return dynamic_cast<CounterFamily&>(*slot);
}

GaugeFamily& Registry::Gauge(const std::string& name, const std::string& help, Labels label_names,
                             size_t max_series) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = families_[name];
  if (!slot) slot = std::make_unique<GaugeFamily>(name, help, Kind::kGauge, std::move(label_names), max_series);
  return dynamic_cast<GaugeFamily&>(*slot);
}

HistogramFamily& Registry::Histogram(const std::string& name, const std::string& help, Labels label_names,
                                     std::vector<double> bounds, size_t max_series) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = families_[name];
  if (!slot) {
    slot = std::make_unique<HistogramFamily>(name, help, std::move(label_names), std::move(bounds), max_series);
  }
  return dynamic_cast<HistogramFamily&>(*slot);
}

uint64_t Registry::AddCollector(std::function<void()> collect) {
  std::lock_guard<std::mutex> lock(mu_);
  collectors_.emplace(next_collector_, std::move(collect));
  return next_collector_++;
}

void Registry::RemoveCollector(uint64_t id) {
  std::lock_guard<std::mutex> collecting(collect_mu_);  // no call of it is in flight after this
  std::lock_guard<std::mutex> lock(mu_);
  collectors_.erase(id);
}

std::string Registry::Render() {
  std::vector<const FamilyBase*> families;
  {
    std::lock_guard<std::mutex> collecting(collect_mu_);
    std::vector<std::function<void()>> collectors;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [id, c] : collectors_) collectors.push_back(c);
    }
    for (auto& c : collectors) c();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, f] : families_) families.push_back(f.get());
  }
  std::string out;
  out.reserve(last_size_.load(std::memory_order_relaxed) + 4096);
  for (const auto* f : families) f->Render(&out);  // families are never removed
  last_size_.store(out.size(), std::memory_order_relaxed);
  return out;
}

Registry& Global() {
  static Registry* registry = new Registry();  // never destroyed: threads may update it at exit
  return *registry;
}

void RegisterProcessMetrics(Registry& registry) {
  auto& rss = registry.Gauge("process_resident_memory_bytes", "Resident memory size in bytes.");
  auto& cpu = registry.Counter("process_cpu_seconds_total", "User and system CPU time spent in seconds.");
  auto& fds = registry.Gauge("process_open_fds", "Number of open file descriptors.");
  auto& threads = registry.Gauge("process_threads", "Number of OS threads in the process.");
  auto& start = registry.Gauge("process_start_time_seconds", "Start time of the process since the Unix epoch in seconds.");
  start.With().Set(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  registry.AddCollector([&rss, &cpu, &fds, &threads] {
    std::ifstream stat("/proc/self/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), {});
    // Fields after the command name (which may hold spaces) in parentheses.
    const size_t close = text.rfind(')');
    if (close != std::string::npos) {
      std::istringstream fields(text.substr(close + 2));
      std::vector<std::string> f;
      for (std::string field; fields >> field;) f.push_back(field);
      // f[0] is field 3 (state): utime is field 14, stime 15, num_threads 20, rss 24.
      if (f.size() > 21) {
        const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
        const double seconds = (std::stod(f[11]) + std::stod(f[12])) / ticks;
        auto& c = cpu.With();
        if (seconds > c.value()) c.Inc(seconds - c.value());
        threads.With().Set(std::stod(f[17]));
        rss.With().Set(std::stod(f[21]) * static_cast<double>(::sysconf(_SC_PAGESIZE)));
      }
    }
    size_t open = 0;
    if (DIR* dir = ::opendir("/proc/self/fd")) {
      while (const dirent* entry = ::readdir(dir)) open += entry->d_name[0] != '.';
      ::closedir(dir);
      if (open > 0) --open;  // the directory being read
    }
    fds.With().Set(static_cast<double>(open));
  });
}

}  // namespace tessera::metrics
