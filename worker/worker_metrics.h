// The worker's Prometheus metrics, served on its own --metrics-listen port
// (docs/MONITORING.md): local training and download times, rounds trained and refused, a
// cohort's collective time beside its compute, and the device's host fallbacks and memory
// pool, read when scraped.
#pragma once

#include <cstdint>
#include <functional>

namespace tessera {
class Device;
}

namespace tessera::worker {

void RecordTraining(double compute_seconds, double download_seconds);
void RecordUpdate(bool accepted);
// A cohort round: the time spent in gradient collectives and the rest of the local compute.
void RecordCohortRound(double collective_seconds, double compute_seconds);

// Reads `device()` (which may change or be null) at every scrape; returns the collector's id
// in metrics::Global(), for RemoveDeviceCollector.
uint64_t AddDeviceCollector(std::function<void(const std::function<void(Device&)>&)> with_device);
void RemoveDeviceCollector(uint64_t id);

}  // namespace tessera::worker
