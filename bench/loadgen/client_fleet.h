// Many simulated workers in one process, each doing on the wire what tessera-worker does
// (worker/agent.cc, worker/coordinator_client.cc), with no training in between:
//
//  - Join with the join token, then Heartbeat at the interval the coordinator returned
//    (each beat sent when the previous one has been answered and the interval has passed,
//    carrying the client's state: idle, training, uploading);
//  - hold OpenTaskChannel open; on a TrainTask, take the model inside it (a small model, when
//    the join said so) or DownloadModel (either checked against its manifest, DownloadCheck),
//    optionally wait `compute_ms`, then UploadUpdate: the header (job, round,
//    attempt, base model version, samples, compute and download times, the delta's manifest)
//    and the delta's chunks (UpdatePayloads); a newer task queued during work is taken next;
//  - on a CancelTask for the work in hand (its job, round and attempt; attempt 0 meaning
//    every attempt), skip its upload, and drop a waiting task it names; on an
//    UpdateVerdict, count it;
//  - on a broken channel or a refused heartbeat, join again with backoff (as the worker
//    does) and count the drop; a download that fails its checks is reported with a failure
//    header, as the worker reports a round it cannot train.
//
// Every call uses gRPC's callback API: no thread waits on a call. Heartbeats, backoffs and
// simulated compute run on one TimerQueue thread; everything else runs on gRPC's own
// callback threads, a handful whatever the number of clients. The clients share
// `channels` gRPC channels (one TCP connection each), assigned round-robin; with one per
// client, as real workers have, no client's heartbeat waits behind another's transfer on a
// shared connection (with a few shared connections, 10 MiB transfers delay heartbeats past
// the coordinator's timeout).
//
// Thread-safe. Start(), WaitReady() and Stop() are for one controlling thread.
#pragma once

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bench/loadgen/timer_queue.h"
#include "bench/loadgen/update_payload.h"
#include "proto/tensor_transfer.h"
#include "tessera/v1/worker_service.grpc.pb.h"

namespace tessera::loadgen {

struct FleetOptions {
  std::string coordinator;          // HOST:PORT
  std::string join_token;
  std::string name_prefix = "loadgen";  // clients are named PREFIX-0, PREFIX-1, ...
  uint32_t clients = 10;
  uint32_t channels = 1;            // gRPC channels (TCP connections), at most one per client
  uint32_t join_window = 64;        // first joins in flight at once
  UpdateKind update = UpdateKind::kZero;
  uint32_t chunk_bytes = wire::kDefaultUploadChunkBytes;  // upload chunk size, as tessera-worker --chunk-kib
  uint32_t stream_window_bytes = 0;  // a fixed HTTP/2 receive window per stream; 0: gRPC's probing
  uint32_t random_variants = 4;
  uint64_t seed = 1;
  bool verify_downloads = false;    // each downloaded tensor's checksum, as the worker checks it
  bool always_download = false;     // never take a model inside the task (JoinRequest.accepts_inline_model)
  // Never send an update inside the task session (JoinResponse.inline_update_max_bytes):
  // hold a task channel and upload every update by its own call, as older workers do.
  bool always_upload_call = false;
  // Mark each update as the trained model where the task offers it (TrainTask.
  // takes_trained_weights), as tessera-worker does: the coordinator then subtracts its model
  // as it checks each update. The bytes are the same zero or random values (the coordinator's
  // work does not depend on them).
  bool trained_weights = false;
  uint32_t compute_ms = 0;          // simulated local compute between download and upload
  uint64_t samples = 1;             // the sample count each update reports
};

// What the clients did, summed over all of them.
enum class Counter {
  kJoins,              // successful joins, rejoins included
  kJoinFailures,       // joins that failed and were retried
  kJoinRefusals,       // joins refused for good (wrong token, bad name)
  kHeartbeats,
  kHeartbeatFailures,  // refused (session unknown) or failed
  kChannelDrops,       // task channels that ended while the fleet was running
  kTrainTasks,
  kSupersededTasks,    // replaced by a newer task before they were started
  kCancels,
  kVerdictsAccepted,
  kVerdictsRefused,
  kDownloads,
  kDownloadFailures,
  kUploadsAccepted,
  kUploadsRefused,     // the coordinator's reply said no
  kUploadFailures,     // the call itself failed
  kUploadsSkipped,     // the round was cancelled before the upload
  kFailuresReported,   // failure headers sent for downloads that failed their checks
  kBytesDownloaded,
  kBytesUploaded,
  kNumCounters,
};
// "joins", "join_failures", ...: the names the report prints.
const char* CounterName(Counter counter);

enum class Latency { kDownload, kUpload, kHeartbeat, kNumLatencies };
const char* LatencyName(Latency latency);

struct LatencySummary {
  size_t count = 0;
  double median_ms = 0;
  double p99_ms = 0;
  double max_ms = 0;
};

class SimulatedClient;

class ClientFleet {
 public:
  explicit ClientFleet(FleetOptions options);
  ~ClientFleet();  // Stop(), then waits for every call in flight to end
  ClientFleet(const ClientFleet&) = delete;
  ClientFleet& operator=(const ClientFleet&) = delete;

  // Sends every client's first join, at most `join_window` in flight; blocks until the last
  // one is sent, not until it is answered.
  void Start();
  // Until every client has joined and holds its task channel open (true), a join is refused
  // for good, or `timeout` (false).
  bool WaitReady(std::chrono::milliseconds timeout);
  size_t ready() const;
  // Cancels every open call and waits, up to `timeout`, for every call to end; no call
  // starts afterwards. Idempotent. Returns whether every call ended.
  bool Stop(std::chrono::milliseconds timeout);

  uint64_t Get(Counter counter) const { return counters_[static_cast<size_t>(counter)].load(); }
  // Client-side latencies of successful calls, as measured by the clients (time to first
  // message included).
  LatencySummary Summarize(Latency latency) const;
  // Forgets the latencies recorded so far (to measure a window of its own).
  void ResetLatencies();
  // The first distinct error messages seen (at most 10), each with how often it came.
  std::vector<std::string> errors() const;
  const FleetOptions& options() const { return options_; }

  // For the clients and their calls.
  bool stopping() const { return stopping_.load(); }
  // A channel on a connection of its own (the fleet's options, no shared subchannel).
  std::shared_ptr<grpc::Channel> NewChannel() const;
  TimerQueue& timers() { return timers_; }
  UpdatePayloads& payloads() { return payloads_; }
  void Add(Counter counter, uint64_t n = 1) { counters_[static_cast<size_t>(counter)].fetch_add(n); }
  void Record(Latency latency, double ms);
  void RecordError(const std::string& message);
  void CallStarted();
  void CallEnded();  // the last thing a call's completion does: the fleet may be gone after it
  void FirstJoinAnswered(bool refused_for_good);
  void ChannelReadyChanged(int delta);

 private:
  FleetOptions options_;
  std::atomic<uint64_t> counters_[static_cast<size_t>(Counter::kNumCounters)] = {};
  std::atomic<bool> stopping_{false};
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::GenericStub>> generic_stubs_;  // one per stub, on its channel
  UpdatePayloads payloads_;
  TimerQueue timers_;  // after what its callbacks use, so that it stops first
  std::vector<std::unique_ptr<SimulatedClient>> clients_;

  mutable std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  uint64_t calls_in_flight_ = 0;
  uint32_t first_joins_in_flight_ = 0;
  int64_t channels_ready_ = 0;
  bool join_refused_ = false;
  std::vector<std::pair<std::string, uint64_t>> errors_;
  std::vector<double> latencies_[static_cast<size_t>(Latency::kNumLatencies)];
};

}  // namespace tessera::loadgen
