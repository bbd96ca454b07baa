// The workers the coordinator knows: their sessions, liveness and task channels.
//
// A worker's name is its identity: a worker that joins again under the same name (after a
// restart, or after the coordinator restarted) takes over its seat, with a new session and a
// new session generation. Work handed to the old generation is considered lost.
//
// Thread-safe. NextTask blocks for at most the given timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "tessera/v1/job_service.pb.h"
#include "tessera/v1/worker_service.pb.h"

namespace tessera::server {

struct WorkerRegistryOptions {
  uint32_t heartbeat_interval_ms = 1000;
  uint32_t heartbeat_timeout_ms = 5000;  // no heartbeat for this long: the worker is lost
};

class WorkerRegistry {
 public:
  explicit WorkerRegistry(WorkerRegistryOptions options);

  // Workers known from before a restart: listed, not alive, with no session until they join.
  void Restore(const std::vector<v1::WorkerStatus>& workers);
  // The worker's status as List() shows it (for persisting after a join).
  std::optional<v1::WorkerStatus> Describe(const std::string& worker_id) const;
  // Admits a worker (the join token was already checked). Returns its id and a new session.
  Result<v1::JoinResponse> Join(const v1::JoinRequest& request);
  // UNAUTHENTICATED when `session` is not the worker's current one.
  Status Authenticate(const std::string& worker_id, const std::string& session) const;
  Status Heartbeat(const std::string& worker_id, const std::string& session, const std::string& state);

  // The current session generation, or 0 for an unknown worker.
  uint64_t Generation(const std::string& worker_id) const;
  // Alive: heard from within the heartbeat timeout, its task channel not lost, and still on
  // `generation` when given.
  bool IsAlive(const std::string& worker_id, uint64_t generation = 0) const;
  // Alive workers with an open task channel, sorted by id.
  std::vector<std::string> ReadyWorkers() const;

  // Queues a task for the worker's channel. Fails when the worker is unknown.
  Status Send(const std::string& worker_id, v1::Task task);
  // Marks the worker's task channel open for `generation`; returns false when stale.
  bool OpenChannel(const std::string& worker_id, uint64_t generation);
  void CloseChannel(const std::string& worker_id, uint64_t generation);
  // The next task for the channel of `generation`; nullopt after `timeout`, or with
  // *closed set when the channel was superseded by a newer session or the registry stops.
  std::optional<v1::Task> NextTask(const std::string& worker_id, uint64_t generation,
                                   std::chrono::milliseconds timeout, bool* closed);

  void RecordRound(const std::string& worker_id, bool accepted);
  // The cohort the worker joined with ("" for none).
  std::string Cohort(const std::string& worker_id) const;
  std::vector<v1::WorkerStatus> List() const;
  const WorkerRegistryOptions& options() const { return options_; }

  // Wakes every channel so that handlers return.
  void Shutdown();

 private:
  struct Worker {
    std::string session;
    uint64_t generation = 0;
    std::chrono::steady_clock::time_point last_heard;
    int64_t last_heard_unix_ms = 0;
    bool channel_open = false;
    bool channel_lost = false;  // its task channel closed: the worker died or must rejoin
    std::deque<v1::Task> outbox;
    v1::WorkerStatus status;
  };
  bool IsAliveLocked(const Worker& w) const;

  WorkerRegistryOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Worker> workers_;
  uint64_t next_generation_ = 1;
  bool shutdown_ = false;
};

std::string RandomHex(size_t bytes);  // from the OS's random source
int64_t UnixMillis();

}  // namespace tessera::server
