#include "worker/worker_metrics.h"

#include "base/metrics.h"
#include "device/device.h"
#include "device/placement.h"

namespace tessera::worker {
namespace {

struct Families {
  metrics::HistogramFamily& train = metrics::Global().Histogram(
      "tessera_local_train_seconds", "Local training time of one round (every epoch), in seconds.", {},
      metrics::LatencyBuckets());
  metrics::HistogramFamily& download = metrics::Global().Histogram(
      "tessera_model_download_seconds", "Time to download a round's global model, in seconds.", {},
      metrics::LatencyBuckets());
  metrics::CounterFamily& trained =
      metrics::Global().Counter("tessera_rounds_trained_total", "Rounds whose update the coordinator accepted.");
  metrics::CounterFamily& refused =
      metrics::Global().Counter("tessera_updates_refused_total", "Updates the coordinator refused.");
  metrics::HistogramFamily& collective = metrics::Global().Histogram(
      "tessera_cohort_collective_seconds",
      "Time a cohort round spent in gradient collectives (allreduce), in seconds.", {}, metrics::LatencyBuckets());
  metrics::HistogramFamily& cohort_compute = metrics::Global().Histogram(
      "tessera_cohort_compute_seconds", "Time a cohort round spent computing, collectives excluded, in seconds.", {},
      metrics::LatencyBuckets());
  metrics::CounterFamily& fallback_ops = metrics::Global().Counter(
      "tessera_device_fallback_ops_total", "Ops the device ran on the host because it lacks them.", {"device"});
  metrics::CounterFamily& fallback_bytes = metrics::Global().Counter(
      "tessera_device_fallback_bytes_total", "Bytes that host fallbacks moved between the device and the host.",
      {"device"});
  metrics::GaugeFamily& pool = metrics::Global().Gauge(
      "tessera_device_pool_bytes",
      "Device memory the pool holds: in_use (handed out) or reserved (held from the driver).", {"device", "kind"});
};

Families& F() {
  static Families* families = new Families();
  return *families;
}

// Counters that mirror a cumulative account: add what it grew by since the last scrape.
void CatchUp(metrics::Counter& counter, double account) {
  if (account > counter.value()) counter.Inc(account - counter.value());
}

}  // namespace

void RecordTraining(double compute_seconds, double download_seconds) {
  F().train.With().Observe(compute_seconds);
  F().download.With().Observe(download_seconds);
}

void RecordUpdate(bool accepted) { (accepted ? F().trained : F().refused).With().Inc(); }

void RecordCohortRound(double collective_seconds, double compute_seconds) {
  F().collective.With().Observe(collective_seconds);
  F().cohort_compute.With().Observe(compute_seconds);
}

uint64_t AddDeviceCollector(std::function<void(const std::function<void(Device&)>&)> with_device) {
  Families& f = F();
  f.trained.With();
  f.refused.With();
  return metrics::Global().AddCollector([&f, with_device] {
    with_device([&f](Device& device) {
      const std::string name = device.capabilities().kind;
      const MemoryPoolStats pool = device.pool_stats();
      f.pool.With({name, "in_use"}).Set(static_cast<double>(pool.bytes_in_use));
      f.pool.With({name, "reserved"}).Set(static_cast<double>(pool.bytes_from_driver));
      double ops = 0, bytes = 0;
      if (const OpPlacement* placement = device.placement()) {
        for (const auto& [op, account] : placement->Fallbacks()) {
          ops += static_cast<double>(account.calls);
          bytes += static_cast<double>(account.host_link_bytes());
        }
      }
      CatchUp(f.fallback_ops.With({name}), ops);
      CatchUp(f.fallback_bytes.With({name}), bytes);
    });
  });
}

void RemoveDeviceCollector(uint64_t id) { metrics::Global().RemoveCollector(id); }

}  // namespace tessera::worker
