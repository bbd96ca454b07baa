// Pieces shared by the federation tests: a temporary state directory, an in-process
// coordinator on port 0, in-process workers on threads, small job specs, and waiting for a
// job through the user-facing service. Everything runs over mutual TLS with the test
// deployment's certificates (TestPki), as a provisioned deployment does.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <filesystem>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli/provision.h"
#include "proto/transport_security.h"
#include "server/coordinator.h"
#include "tessera/v1/job_service.grpc.pb.h"
#include "tessera/v1/worker_service.grpc.pb.h"
#include "worker/agent.h"
#include "worker/coordinator_client.h"

namespace tessera::testing {

inline constexpr char kToken[] = "test-join-token";

class TempDir {
 public:
  explicit TempDir(const std::string& tag);
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// The test deployment's certificates, made once per process with cli/provision.h: a CA, the
// coordinator's certificate (127.0.0.1, localhost, ::1), an operator's ("test-operator"), and
// a worker's for any name, issued on first use. Thread-safe.
class TestPki {
 public:
  static TestPki& Get();
  const cli::CertificateAuthority& ca() const { return ca_; }
  // The coordinator's end: its certificate, and the CA as the client CA (mutual TLS).
  wire::ServerTls CoordinatorTls() const;
  wire::ClientTls OperatorTls() const;
  wire::ClientTls WorkerTls(const std::string& name);
  // Writes an identity as `tessera provision` does (DIR/ca.crt, tls.crt, tls.key) for
  // --tls-dir, and returns DIR: `dir`/coordinator, `dir`/operators/test-operator,
  // `dir`/workers/NAME.
  std::string WriteCoordinatorDir(const std::string& dir) const;
  std::string WriteOperatorDir(const std::string& dir) const;
  std::string WriteWorkerDir(const std::string& dir, const std::string& name);

 private:
  TestPki();
  cli::IssuedCertificate Worker(const std::string& name);
  cli::CertificateAuthority ca_;
  cli::IssuedCertificate coordinator_;
  cli::IssuedCertificate operator_;
  std::mutex mu_;
  std::map<std::string, cli::IssuedCertificate> workers_;
};

// Mutual TLS with TestPki, the join token kToken, and quick heartbeats so that lost workers
// are noticed in about a second.
server::CoordinatorOptions TestCoordinatorOptions(const std::string& state_dir);

// A WorkerAgent running on its own thread until destroyed.
class WorkerThread {
 public:
  WorkerThread(const std::string& address, const std::string& name, const std::string& token = kToken,
               const std::string& data_dir = "", const std::string& cohort = "", const std::string& device = "cpu");
  // A worker with these options (name, token and quick backoffs are set here).
  WorkerThread(const std::string& address, const std::string& name, worker::WorkerOptions options);
  ~WorkerThread();
  // Waits for Run() to return (a fatal error) for up to `timeout`.
  bool WaitDone(std::chrono::milliseconds timeout);
  Status result();
  worker::WorkerAgent& agent() { return *agent_; }

 private:
  std::unique_ptr<worker::WorkerAgent> agent_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status result_;
};

// A worker that speaks the protocol by hand through the real client (worker/coordinator_client.h)
// as worker `name`: joins, heartbeats every 100 ms and keeps its task channel open until
// destroyed, handing each train task to `on_task` on the channel's thread.
class HandWorker {
 public:
  // `accepts_inline_model`: the join says it takes small models inside its tasks.
  HandWorker(const std::string& address, const std::string& name,
             std::function<void(const v1::TrainTask&)> on_task, bool accepts_inline_model = false);
  ~HandWorker();
  worker::CoordinatorClient& client() { return *client_; }
  const v1::JoinResponse& joined() const { return joined_; }
  // The model `task` trains, as this worker downloads it.
  Result<TensorSet> Download(const v1::TrainTask& task);

 private:
  std::unique_ptr<worker::CoordinatorClient> client_;
  v1::JoinResponse joined_;
  std::atomic<bool> stop_{false};
  std::thread heartbeat_, channel_;
};

// A small, fast job: an MLP on the first `train_samples` training images, IID over
// `parties` parties, all taking part.
v1::JobSpec SmallJob(uint32_t rounds, uint32_t parties, uint32_t train_samples = 6000);

// The job service as the operator "test-operator" (its certificate).
std::unique_ptr<v1::JobService::Stub> JobStub(int port);
// A raw WorkerService stub, for tests that speak the protocol by hand as worker `name`.
std::unique_ptr<v1::WorkerService::Stub> WorkerStub(int port, const std::string& name);
// Polls until the job is in a final state or `timeout` passes; returns the last view.
v1::GetJobResponse WaitForJob(v1::JobService::Stub& stub, const std::string& job_id,
                              std::chrono::seconds timeout);
// Polls until `predicate(job)` holds or `timeout`; returns whether it held.
bool WaitUntil(const std::function<bool()>& predicate, std::chrono::milliseconds timeout);
// Whether Debian's /usr/bin/python3 (not the python3 first on PATH) can import `modules`
// ("torch, numpy"): the export and external-trainer tests skip, saying so, when it cannot.
bool SystemPythonHas(const std::string& modules);
// Waits until `count` workers are ready at the coordinator.
bool WaitForWorkers(v1::JobService::Stub& stub, size_t count, std::chrono::milliseconds timeout);

}  // namespace tessera::testing
