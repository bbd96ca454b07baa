#include "bench/loadgen/client_fleet.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "bench/loadgen/simulated_client.h"

namespace tessera::loadgen {

const char* CounterName(Counter counter) {
  static const char* const kNames[] = {
      "joins",          "join_failures",      "join_refusals",    "heartbeats",       "heartbeat_failures",
      "channel_drops",  "train_tasks",        "superseded_tasks", "cancels",          "verdicts_accepted",
      "verdicts_refused", "downloads",        "download_failures", "uploads_accepted", "uploads_refused",
      "upload_failures", "uploads_skipped",   "failures_reported", "bytes_downloaded", "bytes_uploaded"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(Counter::kNumCounters));
  return kNames[static_cast<size_t>(counter)];
}

const char* LatencyName(Latency latency) {
  static const char* const kNames[] = {"download", "upload", "heartbeat"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(Latency::kNumLatencies));
  return kNames[static_cast<size_t>(latency)];
}

ClientFleet::ClientFleet(FleetOptions options)
    : options_(std::move(options)),
      payloads_(options_.update, options_.chunk_bytes, options_.random_variants, options_.seed) {
  const uint32_t channels = std::max<uint32_t>(1, std::min(options_.channels, std::max<uint32_t>(1, options_.clients)));
  for (uint32_t i = 0; i < channels; ++i) {
    auto channel = NewChannel();
    stubs_.push_back(v1::WorkerService::NewStub(channel));
    generic_stubs_.push_back(std::make_unique<grpc::GenericStub>(channel));
    channels_.push_back(std::move(channel));
  }
  for (uint32_t i = 0; i < options_.clients; ++i) {
    clients_.push_back(std::make_unique<SimulatedClient>(this, i, stubs_[i % stubs_.size()].get(),
                                                        generic_stubs_[i % generic_stubs_.size()].get()));
  }
}

ClientFleet::~ClientFleet() {
  // Every call's completion uses the fleet (its counters, its clients, their channels): the
  // last one must end before any of it is freed. Each call is cancelled by Stop() and has a
  // deadline besides, so the wait ends.
  if (Stop(std::chrono::seconds(10))) return;
  std::fprintf(stderr, "tessera-loadgen: waiting for calls still open 10 s after the clients were stopped\n");
  while (!Stop(std::chrono::seconds(60))) {
  }
}

std::shared_ptr<grpc::Channel> ClientFleet::NewChannel() const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(2 << 20);  // as the worker: chunks are at most 1 MiB
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);  // as the worker
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Channels with the same arguments would share one connection; each gets its own.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (options_.stream_window_bytes > 0) {
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, static_cast<int>(options_.stream_window_bytes));
  }
  return grpc::CreateCustomChannel(options_.coordinator, grpc::InsecureChannelCredentials(), args);
}

void ClientFleet::Start() {
  for (auto& client : clients_) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return first_joins_in_flight_ < std::max<uint32_t>(1, options_.join_window) || stopping(); });
      if (stopping()) return;
      ++first_joins_in_flight_;
    }
    client->Join(/*first=*/true);
  }
}

void ClientFleet::FirstJoinAnswered(bool refused_for_good) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --first_joins_in_flight_;
    join_refused_ = join_refused_ || refused_for_good;
  }
  cv_.notify_all();
}

void ClientFleet::ChannelReadyChanged(int delta) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    channels_ready_ += delta;
  }
  cv_.notify_all();
}

size_t ClientFleet::ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<size_t>(std::max<int64_t>(0, channels_ready_));
}

bool ClientFleet::WaitReady(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return channels_ready_ >= static_cast<int64_t>(clients_.size()) || join_refused_; });
  return channels_ready_ >= static_cast<int64_t>(clients_.size()) && !join_refused_;
}

void ClientFleet::CallStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  ++calls_in_flight_;
}

void ClientFleet::CallEnded() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--calls_in_flight_ == 0) cv_.notify_all();
}

bool ClientFleet::Stop(std::chrono::milliseconds timeout) {
  stopping_ = true;
  cv_.notify_all();
  timers_.Stop();  // no heartbeat, retry or upload starts from the timers any more
  for (auto& client : clients_) client->Cancel();
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return calls_in_flight_ == 0; });
}

void ClientFleet::Record(Latency latency, double ms) {
  std::lock_guard<std::mutex> lock(mu_);
  latencies_[static_cast<size_t>(latency)].push_back(ms);
}

void ClientFleet::ResetLatencies() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& samples : latencies_) samples.clear();
}

LatencySummary ClientFleet::Summarize(Latency latency) const {
  std::vector<double> samples;
  {
    std::lock_guard<std::mutex> lock(mu_);
    samples = latencies_[static_cast<size_t>(latency)];
  }
  LatencySummary summary;
  summary.count = samples.size();
  if (samples.empty()) return summary;
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) { return samples[std::min(samples.size() - 1, static_cast<size_t>(q * samples.size()))]; };
  summary.median_ms = at(0.5);
  summary.p99_ms = at(0.99);
  summary.max_ms = samples.back();
  return summary;
}

void ClientFleet::RecordError(const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [text, count] : errors_) {
    if (text == message) {
      ++count;
      return;
    }
  }
  if (errors_.size() < 10) errors_.emplace_back(message, 1);
}

std::vector<std::string> ClientFleet::errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [text, count] : errors_) out.push_back(std::to_string(count) + "x " + text);
  return out;
}

}  // namespace tessera::loadgen
