#include "tests/integration/harness.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "proto/job_rounds.h"

namespace tessera::testing {

TempDir::TempDir(const std::string& tag) {
  path_ = std::filesystem::temp_directory_path() / ("tessera-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

namespace {

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

wire::ClientTls ClientTlsOf(const cli::CertificateAuthority& ca, const cli::IssuedCertificate& issued) {
  wire::ClientTls tls;
  tls.ca_pem = ca.cert_pem;
  tls.cert_pem = issued.cert_pem;
  tls.key_pem = issued.key_pem;
  return tls;
}

cli::IssuedCertificate MustIssue(const cli::CertificateAuthority& ca, const cli::CertificateRequest& request) {
  auto issued = cli::IssueCertificate(ca, request);
  if (!issued.ok()) {
    std::fprintf(stderr, "test PKI: %s\n", issued.status().ToString().c_str());
    std::abort();
  }
  return *issued;
}

}  // namespace

TestPki& TestPki::Get() {
  static TestPki* pki = new TestPki;
  return *pki;
}

TestPki::TestPki() {
  auto ca = cli::CreateCertificateAuthority("Tessera test CA", Now() - 3600, Now() + 86400);
  if (!ca.ok()) {
    std::fprintf(stderr, "test PKI: %s\n", ca.status().ToString().c_str());
    std::abort();
  }
  ca_ = *ca;
  coordinator_ = MustIssue(ca_, {"127.0.0.1", wire::kCoordinatorRole, {"127.0.0.1", "localhost", "::1"}, true,
                                 Now() - 3600, Now() + 86400});
  operator_ = MustIssue(ca_, {"test-operator", wire::kOperatorRole, {}, false, Now() - 3600, Now() + 86400});
}

cli::IssuedCertificate TestPki::Worker(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(name);
  if (it == workers_.end()) {
    it = workers_.emplace(name, MustIssue(ca_, {name, wire::kWorkerRole, {}, false, Now() - 3600, Now() + 86400}))
             .first;
  }
  return it->second;
}

wire::ServerTls TestPki::CoordinatorTls() const {
  wire::ServerTls tls;
  tls.cert_pem = coordinator_.cert_pem;
  tls.key_pem = coordinator_.key_pem;
  tls.client_ca_pem = ca_.cert_pem;
  return tls;
}

wire::ClientTls TestPki::OperatorTls() const { return ClientTlsOf(ca_, operator_); }

wire::ClientTls TestPki::WorkerTls(const std::string& name) { return ClientTlsOf(ca_, Worker(name)); }

std::string TestPki::WriteCoordinatorDir(const std::string& dir) const {
  const std::string path = dir + "/coordinator";
  if (Status s = cli::WriteIdentity(path, ca_.cert_pem, coordinator_); !s.ok()) std::abort();
  return path;
}

std::string TestPki::WriteOperatorDir(const std::string& dir) const {
  const std::string path = dir + "/operators/test-operator";
  if (Status s = cli::WriteIdentity(path, ca_.cert_pem, operator_); !s.ok()) std::abort();
  return path;
}

std::string TestPki::WriteWorkerDir(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/workers/" + name;
  if (Status s = cli::WriteIdentity(path, ca_.cert_pem, Worker(name)); !s.ok()) std::abort();
  return path;
}

server::CoordinatorOptions TestCoordinatorOptions(const std::string& state_dir) {
  server::CoordinatorOptions options;
  options.tls = TestPki::Get().CoordinatorTls();
  options.listen_address = "127.0.0.1:0";
  options.state_dir = state_dir;
  options.join_token = kToken;
  options.registry.heartbeat_interval_ms = 200;
  options.registry.heartbeat_timeout_ms = 1500;
  options.runner.worker_wait_timeout = std::chrono::seconds(60);
  return options;
}

WorkerThread::WorkerThread(const std::string& address, const std::string& name, const std::string& token,
                           const std::string& data_dir, const std::string& cohort, const std::string& device)
    : WorkerThread(address, name, [&] {
        worker::WorkerOptions options;
        options.join_token = token;
        options.data_dir = data_dir;
        options.cohort = cohort;
        options.device = device;
        return options;
      }()) {}

WorkerThread::WorkerThread(const std::string& address, const std::string& name, worker::WorkerOptions options) {
  options.name = name;
  if (options.join_token.empty()) options.join_token = kToken;
  options.backoff_initial_ms = 100;
  options.backoff_max_ms = 500;
  auto client = worker::MakeGrpcCoordinatorClient(address, TestPki::Get().WorkerTls(name));
  if (!client.ok()) std::abort();
  agent_ = std::make_unique<worker::WorkerAgent>(options, std::move(client).value());
  thread_ = std::thread([this] {
    Status s = agent_->Run();
    std::lock_guard<std::mutex> lock(mu_);
    result_ = s;
    done_ = true;
    cv_.notify_all();
  });
}

WorkerThread::~WorkerThread() {
  agent_->Stop();
  if (thread_.joinable()) thread_.join();
}

bool WorkerThread::WaitDone(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return done_; });
}

Status WorkerThread::result() {
  std::lock_guard<std::mutex> lock(mu_);
  return result_;
}

HandWorker::HandWorker(const std::string& address, const std::string& name,
                       std::function<void(const v1::TrainTask&)> on_task, bool accepts_inline_model)
    : client_(std::move(worker::MakeGrpcCoordinatorClient(address, TestPki::Get().WorkerTls(name))).value()) {
  v1::JoinRequest join;
  join.set_join_token(kToken);
  join.set_name(name);
  join.set_accepts_inline_model(accepts_inline_model);
  auto joined = client_->Join(join);
  EXPECT_TRUE(joined.ok()) << joined.status().ToString();
  if (joined.ok()) joined_ = *joined;
  heartbeat_ = std::thread([this] {
    while (!stop_) {
      v1::HeartbeatRequest beat;
      beat.set_worker_id(joined_.worker_id());
      beat.set_session(joined_.session());
      client_->Heartbeat(beat).ok();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  channel_ = std::thread([this, on_task = std::move(on_task)] {
    v1::TaskChannelRequest open;
    open.set_worker_id(joined_.worker_id());
    open.set_session(joined_.session());
    // The channel ends when the test stops the worker; how it ends does not matter here.
    client_->RunTaskChannel(open, [&](const v1::Task& task) {
      if (task.has_train()) on_task(task.train());
    }).ok();
  });
}

Result<TensorSet> HandWorker::Download(const v1::TrainTask& task) {
  v1::DownloadModelRequest request;
  request.set_worker_id(joined_.worker_id());
  request.set_session(joined_.session());
  request.set_job_id(task.job_id());
  request.set_model_version(task.model_version());
  return client_->DownloadModel(request, uint64_t{1} << 30, task.round(), task.attempt(), 0);  // a test model is far smaller
}

HandWorker::~HandWorker() {
  stop_ = true;
  client_->CancelTaskChannel();
  channel_.join();
  heartbeat_.join();
}

v1::JobSpec SmallJob(uint32_t rounds, uint32_t parties, uint32_t train_samples) {
  v1::JobSpec spec;
  spec.set_name("small");
  spec.mutable_model()->set_name("mlp");
  spec.mutable_model()->add_hidden(64);
  spec.mutable_data()->set_dataset("fashion-mnist");
  spec.mutable_data()->set_max_train_samples(train_samples);
  spec.mutable_data()->set_max_test_samples(1000);
  spec.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_IID);
  spec.mutable_data()->mutable_partition()->set_parties(parties);
  spec.mutable_data()->mutable_partition()->set_seed(3);
  spec.set_strategy("fedavg");
  spec.set_rounds(rounds);
  spec.set_clients_per_round(parties);
  spec.set_min_clients(parties);
  spec.set_round_deadline_ms(60000);
  spec.set_local_epochs(1);
  spec.set_batch_size(32);
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_learning_rate(0.01);
  spec.mutable_optimizer()->set_momentum(0.9);
  spec.set_seed(11);
  spec.set_max_round_attempts(3);
  return spec;
}

std::unique_ptr<v1::JobService::Stub> JobStub(int port) {
  return v1::JobService::NewStub(*wire::MakeChannel("127.0.0.1:" + std::to_string(port), TestPki::Get().OperatorTls()));
}

std::unique_ptr<v1::WorkerService::Stub> WorkerStub(int port, const std::string& name) {
  return v1::WorkerService::NewStub(
      *wire::MakeChannel("127.0.0.1:" + std::to_string(port), TestPki::Get().WorkerTls(name)));
}

bool WaitUntil(const std::function<bool()>& predicate, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return predicate();
}

v1::GetJobResponse WaitForJob(v1::JobService::Stub& stub, const std::string& job_id, std::chrono::seconds timeout) {
  v1::GetJobResponse last;
  WaitUntil(
      [&] {
        v1::GetJobResponse response;
        if (!wire::GetJobWithRounds(stub, job_id, nullptr, &response).ok()) return false;
        last = response;
        const auto state = response.job().state();
        return state == v1::JOB_SUCCEEDED || state == v1::JOB_FAILED || state == v1::JOB_CANCELLED;
      },
      timeout);
  return last;
}

bool WaitForWorkers(v1::JobService::Stub& stub, size_t count, std::chrono::milliseconds timeout) {
  return WaitUntil(
      [&] {
        grpc::ClientContext ctx;
        v1::ListWorkersResponse response;
        if (!stub.ListWorkers(&ctx, v1::ListWorkersRequest(), &response).ok()) return false;
        size_t ready = 0;
        for (const auto& w : response.workers()) {
          ready += w.alive() && w.state() != "disconnected" && w.state() != "joined" ? 1 : 0;
        }
        return ready >= count;
      },
      timeout);
}

bool SystemPythonHas(const std::string& modules) {
  return std::system(("/usr/bin/python3 -c 'import " + modules + "' > /dev/null 2>&1").c_str()) == 0;
}

}  // namespace tessera::testing
