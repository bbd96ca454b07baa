// Metrics: the text exposition format Prometheus reads, bounded label sets, process metrics.
#include "base/metrics.h"

#include <gtest/gtest.h>

#include <ctime>
#include <thread>

#include "base/escape.h"

namespace tessera::metrics {
namespace {

TEST(MetricsTest, CountersGaugesAndHistogramsRenderInTheTextFormat) {
  Registry registry;
  registry.Counter("tessera_updates_total", "Updates received.", {"job", "outcome"})
      .With({"job-1", "accepted"})
      .Inc(3);
  registry.Gauge("tessera_workers", "Workers alive.").With().Set(2);
  auto& h = registry.Histogram("tessera_round_seconds", "Round latency.", {"job"}, {0.5, 1, 5});
  h.With({"job-1"}).Observe(0.25);
  h.With({"job-1"}).Observe(0.75);
  h.With({"job-1"}).Observe(100);
  const std::string text = registry.Render();
  EXPECT_NE(text.find("# HELP tessera_updates_total Updates received.\n# TYPE tessera_updates_total counter\n"
                      "tessera_updates_total{job=\"job-1\",outcome=\"accepted\"} 3\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("# TYPE tessera_workers gauge\ntessera_workers 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_round_seconds_bucket{job=\"job-1\",le=\"0.5\"} 1\n"
                      "tessera_round_seconds_bucket{job=\"job-1\",le=\"1\"} 2\n"
                      "tessera_round_seconds_bucket{job=\"job-1\",le=\"5\"} 2\n"
                      "tessera_round_seconds_bucket{job=\"job-1\",le=\"+Inf\"} 3\n"
                      "tessera_round_seconds_sum{job=\"job-1\"} 101\n"
                      "tessera_round_seconds_count{job=\"job-1\"} 3\n"),
            std::string::npos)
      << text;
  // Families come sorted by name.
  EXPECT_LT(text.find("tessera_round_seconds"), text.find("tessera_updates_total"));
  EXPECT_LT(text.find("tessera_updates_total"), text.find("tessera_workers"));
}

TEST(MetricsTest, NumbersAreWrittenShortestAndExact) {
  Registry registry;
  auto& g = registry.Gauge("g", "g", {"k"});
  g.With({"a"}).Set(0.1);
  g.With({"b"}).Set(1.0 / 3);
  g.With({"c"}).Set(1e300);
  auto& h = registry.Histogram("h_seconds", "h", {}, {0.0025, 0.005});
  h.With().Observe(0.001);
  const std::string text = registry.Render();
  EXPECT_NE(text.find("g{k=\"a\"} 0.1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("g{k=\"b\"} 0.33333333333333331\n"), std::string::npos) << text;
  EXPECT_NE(text.find("g{k=\"c\"} 1e+300\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_seconds_bucket{le=\"0.0025\"} 1\n"), std::string::npos) << text;
}

TEST(MetricsTest, LabelValuesAreEscapedAndBounded) {
  Registry registry;
  registry.Counter("c_total", "c", {"worker"}).With({std::string("a\"b\\c\nd") + std::string(500, 'x')}).Inc();
  const std::string text = registry.Render();
  EXPECT_NE(text.find("c_total{worker=\"a\\\"b\\\\c\\nd" + std::string(121, 'x') + "\"} 1\n"), std::string::npos)
      << text;
}

// HELP text escapes a backslash and a line feed, as the text format asks: a line break in it
// would start a line Prometheus cannot parse. A double quote stays as it is there.
TEST(MetricsTest, HelpTextIsEscaped) {
  Registry registry;
  registry.Counter("e_total", "A path like C:\\tmp,\nthen \"quoted\".").With().Inc();
  const std::string text = registry.Render();
  EXPECT_NE(text.find("# HELP e_total A path like C:\\\\tmp,\\nthen \"quoted\".\n# TYPE e_total counter\n"),
            std::string::npos)
      << text;
}

// Prometheus refuses a whole page that holds a label value that is not UTF-8: a value cut
// inside a character, or with a stray byte (a device named after a path in another encoding).
TEST(MetricsTest, LabelValuesStayUtf8WhenCutAndStrayBytesAreReplaced) {
  Registry registry;
  auto& family = registry.Counter("d_total", "d", {"device"});
  family.With({std::string(127, 'x') + "\xC3\xA9" + "tail"}).Inc();
  family.With({"emu:/profiles/\xE9t\xE9.toml"}).Inc(2);
  const std::string text = registry.Render();
  EXPECT_NE(text.find("d_total{device=\"" + std::string(127, 'x') + "\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("d_total{device=\"emu:/profiles/\xEF\xBF\xBDt\xEF\xBF\xBD.toml\"} 2\n"), std::string::npos)
      << text;
  EXPECT_EQ(ValidUtf8(text, text.size()), text) << "the whole page is UTF-8";
  // The cut value is the series' key: the same long name finds the same series again.
  family.With({std::string(127, 'x') + "\xC3\xA9" + "other tail"}).Inc();
  EXPECT_NE(registry.Render().find("d_total{device=\"" + std::string(127, 'x') + "\"} 2\n"), std::string::npos);
}

TEST(MetricsTest, AFamilyStopsGrowingAtItsLimit) {
  Registry registry;
  auto& family = registry.Counter("names_total", "one series per name", {"name"}, /*max_series=*/4);
  for (int i = 0; i < 100; ++i) family.With({"name-" + std::to_string(i)}).Inc();
  const std::string text = registry.Render();
  size_t series = 0;
  for (size_t at = text.find("names_total{"); at != std::string::npos; at = text.find("names_total{", at + 1)) ++series;
  EXPECT_EQ(series, 4u) << text;
  EXPECT_NE(text.find("names_total{name=\"other\"} 97\n"), std::string::npos) << text;
}

// An ended job's series are retired: shown until the family is full, then the first to make
// room, so that a new job gets series of its own instead of sharing "other".
TEST(MetricsTest, RetiredSeriesMakeRoomOnceTheFamilyIsFull) {
  Registry registry;
  auto& family = registry.Histogram("phase_seconds", "per job and phase", {"job", "phase"}, {1}, /*max_series=*/4);
  for (const char* job : {"job-a", "job-b", "job-c"}) family.With({job, "total"}).Observe(2);
  family.Retire("job", "job-b");
  family.Retire("job", "job-a");
  family.Retire("phase", "no-such-phase");
  std::string text = registry.Render();
  EXPECT_NE(text.find("phase_seconds_count{job=\"job-b\",phase=\"total\"} 1\n"), std::string::npos)
      << "a retired series is shown until its room is needed\n" << text;
  family.With({"job-d", "total"}).Observe(0.5);
  family.With({"job-a", "total"}).Observe(0.5);  // asked for again: live again
  family.With({"job-e", "total"}).Observe(0.5);
  text = registry.Render();
  EXPECT_EQ(text.find("job=\"job-b\""), std::string::npos) << "retired first, so it made room first\n" << text;
  EXPECT_NE(text.find("phase_seconds_count{job=\"job-d\",phase=\"total\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("phase_seconds_bucket{job=\"job-d\",phase=\"total\",le=\"1\"} 1\n"), std::string::npos)
      << "the reused series starts at zero\n" << text;
  EXPECT_NE(text.find("phase_seconds_count{job=\"job-a\",phase=\"total\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("phase_seconds_count{job=\"other\",phase=\"other\"} 1\n"), std::string::npos)
      << "with nothing retired left, job-e shares \"other\"\n" << text;
  EXPECT_EQ(text.find("job=\"job-e\""), std::string::npos) << text;
}

// A writer may still hold a series from With() when its job is retired and the slot is taken
// for new label values: the series is set back to zero in place, never freed, so the held
// reference stays valid (the address sanitizer build would report a use after free otherwise)
// and what it adds counts toward the new values.
TEST(MetricsTest, AHeldSeriesStaysValidWhenItsRoomIsTaken) {
  Registry registry;
  auto& counters = registry.Counter("done_total", "per job", {"job"}, /*max_series=*/2);
  auto& histograms = registry.Histogram("took_seconds", "per job", {"job"}, {1}, /*max_series=*/2);
  Counter& counter = counters.With({"job-a"});
  Histogram& histogram = histograms.With({"job-a"});
  counter.Inc(5);
  histogram.Observe(2);
  counters.Retire("job", "job-a");
  histograms.Retire("job", "job-a");
  Counter& reused_counter = counters.With({"job-b"});
  Histogram& reused_histogram = histograms.With({"job-b"});
  EXPECT_EQ(&reused_counter, &counter) << "the retired series was reused in place";
  EXPECT_EQ(&reused_histogram, &histogram) << "the retired series was reused in place";
  EXPECT_EQ(counter.value(), 0);
  EXPECT_EQ(histogram.count(), 0u);
  EXPECT_EQ(histogram.sum(), 0);
  EXPECT_EQ(histogram.CumulativeCounts(), (std::vector<uint64_t>{0, 0}));
  counter.Inc();  // the late writer's update
  histogram.Observe(0.5);
  const std::string text = registry.Render();
  EXPECT_EQ(text.find("job=\"job-a\""), std::string::npos) << text;
  EXPECT_NE(text.find("done_total{job=\"job-b\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("took_seconds_bucket{job=\"job-b\",le=\"1\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("took_seconds_sum{job=\"job-b\"} 0.5\n"), std::string::npos) << text;
}

TEST(MetricsTest, ConcurrentUpdatesAreAllCounted) {
  Registry registry;
  auto& counter = registry.Counter("hits_total", "hits", {"t"});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) counter.With({"x"}).Inc();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter.With({"x"}).value(), 40000);
}

TEST(MetricsTest, ProcessMetricsAreReadAtEachScrape) {
  Registry registry;
  RegisterProcessMetrics(registry);
  // The kernel counts CPU time in clock ticks (10 ms): a test process started a moment ago
  // may not have used one yet. Spend a little more than a tick first.
  const std::clock_t start = std::clock();
  volatile double sink = 0;
  while (std::clock() - start < CLOCKS_PER_SEC / 50) sink = sink + 1;
  const std::string text = registry.Render();
  for (const char* name : {"process_resident_memory_bytes ", "process_cpu_seconds_total ", "process_open_fds ",
                           "process_threads ", "process_start_time_seconds "}) {
    const size_t at = text.find(std::string("\n") + name);
    ASSERT_NE(at, std::string::npos) << name << "\n" << text;
    EXPECT_GT(std::stod(text.substr(at + 1 + std::string(name).size())), 0) << name;
  }
}

}  // namespace
}  // namespace tessera::metrics
