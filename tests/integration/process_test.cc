// The daemons as real processes, killed with SIGKILL mid-round and mid-job: the round still
// closes by its deadline, a restarted worker rejoins and is selected again, a restarted
// coordinator resumes at its last committed round with every worker reconnecting by itself,
// and a stateful strategy's job resumed after a kill is bit-identical to an uninterrupted one,
// also when its newest checkpoints were damaged and it falls back to an older one.
// And what a worker maps: a CPU worker maps no CUDA, cuBLAS or NCCL library, and one asked for
// CUDA on a machine without a driver, or with a driver and no GPU, says why and trains on its
// fallback device.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>

#include "base/backend_module.h"
#include "device/cuda/factory.h"
#include "proto/job_rounds.h"
#include "tests/integration/harness.h"
#include "tests/integration/process.h"

namespace tessera::testing {
namespace {

std::unique_ptr<Process> StartCoordinator(const TempDir& dir, const std::string& listen, int* port) {
  const std::string log = dir.str() + "/coordinator.log";
  // A restarted coordinator appends to its predecessor's log: its own lines are those after
  // the log's length before it starts (measured after, its "listening" line could be in it).
  std::error_code no_log;
  const uintmax_t length = std::filesystem::file_size(log, no_log);
  const size_t before = no_log ? 0 : static_cast<size_t>(length);
  auto p = std::make_unique<Process>(
      std::vector<std::string>{TESSERA_COORDINATOR_BIN, "--listen", listen, "--state-dir", dir.str() + "/state",
                               "--join-token", kToken, "--tls-dir", TestPki::Get().WriteCoordinatorDir(dir.str()),
                               "--heartbeat-interval-ms", "200", "--heartbeat-timeout-ms", "1500"},
      log);
  const std::regex listening("listening on port ([0-9]+)");
  std::smatch match;
  WaitUntil(
      [&] {
        const std::string text = p->Log().substr(std::min(before, p->Log().size()));
        return std::regex_search(text, match, listening);
      },
      std::chrono::seconds(20));
  const std::string text = p->Log().substr(std::min(before, p->Log().size()));
  *port = std::regex_search(text, match, listening) ? std::stoi(match[1]) : 0;
  return p;
}

std::unique_ptr<Process> StartWorker(const TempDir& dir, int port, const std::string& name,
                                     const std::vector<std::string>& flags = {},
                                     std::vector<std::string> env = {}) {
  std::vector<std::string> argv{TESSERA_WORKER_BIN, "--coordinator", "127.0.0.1:" + std::to_string(port),
                                "--join-token", kToken, "--tls-dir", TestPki::Get().WriteWorkerDir(dir.str(), name)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  env.push_back("OPENBLAS_NUM_THREADS=1");
  return std::make_unique<Process>(std::move(argv), dir.str() + "/" + name + ".log", std::move(env));
}

std::string WorkerState(v1::JobService::Stub& stub, const std::string& name) {
  grpc::ClientContext ctx;
  v1::ListWorkersResponse response;
  if (!stub.ListWorkers(&ctx, v1::ListWorkersRequest(), &response).ok()) return "";
  for (const auto& w : response.workers()) {
    if (w.worker_id() == name) return w.state();
  }
  return "";
}

v1::JobSpec CnnJob(uint32_t rounds, uint32_t epochs) {
  v1::JobSpec spec = SmallJob(rounds, 3, 4500);
  spec.mutable_model()->set_name("simplecnn");
  spec.mutable_model()->clear_hidden();
  spec.set_local_epochs(epochs);
  spec.set_batch_size(64);
  spec.mutable_optimizer()->set_learning_rate(0.02);
  return spec;
}

TEST(ProcessTest, AKilledWorkerDoesNotStallTheRoundAndRejoinsWhenRestarted) {
  TempDir dir("kill-worker");
  int port = 0;
  auto coordinator = StartCoordinator(dir, "127.0.0.1:0", &port);
  ASSERT_GT(port, 0) << coordinator->Log();
  std::map<std::string, std::unique_ptr<Process>> workers;
  for (const char* name : {"w1", "w2", "w3"}) workers[name] = StartWorker(dir, port, name);
  auto stub = JobStub(port);
  ASSERT_TRUE(WaitForWorkers(*stub, 3, std::chrono::seconds(30))) << coordinator->Log();

  v1::JobSpec spec = CnnJob(4, 4);
  spec.set_min_clients(2);
  grpc::ClientContext ctx;
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = spec;
  v1::SubmitJobResponse submitted;
  ASSERT_TRUE(stub->SubmitJob(&ctx, submit, &submitted).ok());
  const std::string job = submitted.job().id();

  // Kill w2 while it trains round 1, then bring it back under the same name.
  ASSERT_TRUE(WaitUntil([&] { return WorkerState(*stub, "w2").rfind("training job-", 0) == 0; }, std::chrono::seconds(60)))
      << coordinator->Log();
  workers["w2"]->Kill(SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  workers["w2"] = StartWorker(dir, port, "w2");

  auto done = WaitForJob(*stub, job, std::chrono::seconds(240));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error() << "\n" << coordinator->Log();
  ASSERT_EQ(done.rounds_size(), 4);
  const auto& first = done.rounds(0);
  EXPECT_EQ(first.clients_reported(), 2u);
  EXPECT_LT(first.latency().total_ms(), spec.round_deadline_ms());
  bool w2_dropped = false;
  for (const auto& w : first.workers()) {
    if (w.worker_id() == "w2") w2_dropped = w.outcome().rfind("dropped", 0) == 0;
  }
  EXPECT_TRUE(w2_dropped);
  // Selected again, and accepted, in a later round.
  bool w2_back = false;
  for (int r = 1; r < done.rounds_size(); ++r) {
    for (const auto& w : done.rounds(r).workers()) {
      if (w.worker_id() == "w2" && w.outcome() == "accepted") w2_back = true;
    }
  }
  EXPECT_TRUE(w2_back) << coordinator->Log();
}

std::string Submit(v1::JobService::Stub& stub, const v1::JobSpec& spec) {
  grpc::ClientContext ctx;
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = spec;
  v1::SubmitJobResponse submitted;
  grpc::Status s = stub.SubmitJob(&ctx, submit, &submitted);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return submitted.job().id();
}

std::vector<std::unique_ptr<Process>> StartThreeWorkers(const TempDir& dir, int port) {
  std::vector<std::unique_ptr<Process>> workers;
  for (const char* name : {"w1", "w2", "w3"}) workers.push_back(StartWorker(dir, port, name));
  return workers;
}

// Waits until `job` has committed at least `rounds` rounds; *seen holds the job and its rounds.
bool WaitForCommitted(v1::JobService::Stub& stub, const std::string& job, uint32_t rounds, v1::GetJobResponse* seen) {
  return WaitUntil(
      [&] {
        return wire::GetJobWithRounds(stub, job, nullptr, seen).ok() && seen->job().rounds_committed() >= rounds;
      },
      std::chrono::seconds(120));
}

TEST(ProcessTest, AKilledCoordinatorResumesAtItsLastCommittedRound) {
  TempDir dir("kill-coordinator");
  int port = 0;
  auto coordinator = StartCoordinator(dir, "127.0.0.1:0", &port);
  ASSERT_GT(port, 0) << coordinator->Log();
  auto workers = StartThreeWorkers(dir, port);
  auto stub = JobStub(port);
  ASSERT_TRUE(WaitForWorkers(*stub, 3, std::chrono::seconds(30))) << coordinator->Log();

  const uint32_t rounds = 12;  // many, so that two commit well before the last (the test polls every 50 ms)
  const std::string job = Submit(*stub, CnnJob(rounds, 1));
  ASSERT_FALSE(job.empty());

  // Let two rounds commit, then kill the coordinator without warning. The workers are paused
  // meanwhile, so that the job cannot run to its end before the kill (at most the round they
  // are in commits), and go on once the coordinator is back, reconnecting by themselves.
  v1::GetJobResponse before;
  ASSERT_TRUE(WaitForCommitted(*stub, job, 2, &before));
  for (auto& worker : workers) worker->Signal(SIGSTOP);
  coordinator->Kill(SIGKILL);
  auto restarted = StartCoordinator(dir, "127.0.0.1:" + std::to_string(port), &port);
  for (auto& worker : workers) worker->Signal(SIGCONT);
  ASSERT_GT(port, 0) << restarted->Log();
  stub = JobStub(port);
  auto done = WaitForJob(*stub, job, std::chrono::seconds(240));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error() << "\n" << restarted->Log();
  ASSERT_EQ(done.rounds_size(), static_cast<int>(rounds));
  std::set<uint32_t> seen;
  for (const auto& r : done.rounds()) {
    EXPECT_TRUE(seen.insert(r.round()).second) << "round " << r.round() << " recorded twice";
  }
  EXPECT_EQ(seen.size(), rounds);
  EXPECT_EQ(*seen.begin(), 1u);
  EXPECT_EQ(*seen.rbegin(), rounds);
  // The rounds committed before the kill were neither lost nor run again.
  for (const auto& r : before.rounds()) {
    const auto& after = done.rounds(static_cast<int>(r.round()) - 1);
    EXPECT_EQ(after.model_sha256(), r.model_sha256()) << "round " << r.round();
    EXPECT_EQ(after.committed_unix_ms(), r.committed_unix_ms()) << "round " << r.round();
  }
  EXPECT_NE(restarted->Log().find("resuming"), std::string::npos) << restarted->Log();
  // Every worker reconnected by itself and took part after the restart.
  const auto& last = done.rounds(static_cast<int>(rounds) - 1);
  EXPECT_EQ(last.clients_reported(), 3u);
}

// A strategy whose state carries from round to round (FedAvgM's server momentum, FedAdam's
// moments m and v, SCAFFOLD's control variates): a resumed job that lost the state, or
// restored it from the wrong round, ends on another model.
class StatefulStrategyKillTest : public ::testing::TestWithParam<std::string> {};

// Damages the newest two checkpoint files of `job` in `state_dir` (one may be that of a round
// written and never committed): a restart falls back to an older one. Returns how many.
int DamageNewestCheckpoints(const std::string& state_dir, const std::string& job) {
  std::map<uint32_t, std::filesystem::path> files;
  const std::string prefix = job + "-round-";
  for (const auto& entry : std::filesystem::directory_iterator(state_dir + "/checkpoints")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || name.size() < prefix.size() + 6) continue;
    if (name.compare(name.size() - 5, 5, ".ckpt") != 0) continue;
    const uint32_t round = static_cast<uint32_t>(std::stoul(name.substr(prefix.size())));
    if (round > 0) files[round] = entry.path();
  }
  int damaged = 0;
  for (auto it = files.rbegin(); it != files.rend() && damaged < 2; ++it, ++damaged) {
    std::fstream f(it->second, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char last = static_cast<char>(f.get());
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(last ^ 0x5a));  // a tensor's last byte: its hash no longer matches
  }
  return damaged;
}

// Runs the job uninterrupted, then again with the coordinator killed after two rounds (its
// newest checkpoints damaged before the restart when `damage_newest`), and compares every
// round's model.
void ExpectResumedBitIdentical(const std::string& strategy, bool damage_newest) {
  TempDir dir("kill-" + strategy + (damage_newest ? "-damaged" : ""));
  int port = 0;
  auto coordinator = StartCoordinator(dir, "127.0.0.1:0", &port);
  ASSERT_GT(port, 0) << coordinator->Log();
  auto workers = StartThreeWorkers(dir, port);
  auto stub = JobStub(port);
  ASSERT_TRUE(WaitForWorkers(*stub, 3, std::chrono::seconds(30))) << coordinator->Log();

  const uint32_t rounds = 12;  // many, so that two commit well before the last (the test polls every 50 ms)
  v1::JobSpec spec = SmallJob(rounds, 3, 3000);
  spec.set_strategy(strategy);
  if (strategy == "fedavgm") {
    spec.mutable_server()->set_learning_rate(1.0);
    spec.mutable_server()->set_momentum(0.9);
  } else if (strategy == "scaffold") {
    // SCAFFOLD carries the server's control variate and one per seat from round to round,
    // and each round's model depends on them through the clients' corrected gradients: a
    // resumed job that lost any, or took one from the wrong round or seat, ends elsewhere.
  } else {
    spec.mutable_server()->set_learning_rate(0.01);
    spec.mutable_server()->set_beta1(0.9);
    spec.mutable_server()->set_beta2(0.99);
    spec.mutable_server()->set_tau(1e-3);
  }

  const std::string reference = Submit(*stub, spec);
  auto uninterrupted = WaitForJob(*stub, reference, std::chrono::seconds(240));
  ASSERT_EQ(uninterrupted.job().state(), v1::JOB_SUCCEEDED) << uninterrupted.job().error() << coordinator->Log();
  ASSERT_EQ(uninterrupted.rounds_size(), static_cast<int>(rounds));

  const std::string job = Submit(*stub, spec);
  v1::GetJobResponse before;
  ASSERT_TRUE(WaitForCommitted(*stub, job, 2, &before));
  // The workers go first, so that the job cannot run to its end before the coordinator is
  // killed (on a fast machine its last rounds took milliseconds): at most the round they were
  // in commits. They come back to the restarted coordinator under the same names.
  for (auto& worker : workers) worker->Kill(SIGKILL);
  coordinator->Kill(SIGKILL);
  if (damage_newest) {
    ASSERT_EQ(DamageNewestCheckpoints(dir.str() + "/state", job), 2);
  }
  auto restarted = StartCoordinator(dir, "127.0.0.1:" + std::to_string(port), &port);
  ASSERT_GT(port, 0) << restarted->Log();
  workers = StartThreeWorkers(dir, port);
  stub = JobStub(port);
  auto resumed = WaitForJob(*stub, job, std::chrono::seconds(240));
  ASSERT_EQ(resumed.job().state(), v1::JOB_SUCCEEDED) << resumed.job().error() << "\n" << restarted->Log();
  ASSERT_EQ(resumed.rounds_size(), static_cast<int>(rounds));
  EXPECT_NE(restarted->Log().find("resuming"), std::string::npos) << restarted->Log();
  if (damage_newest) {
    EXPECT_NE(restarted->Log().find("falling back to the checkpoint of round"), std::string::npos) << restarted->Log();
  }
  for (uint32_t r = 0; r < rounds; ++r) {
    EXPECT_EQ(resumed.rounds(static_cast<int>(r)).model_sha256(), uninterrupted.rounds(static_cast<int>(r)).model_sha256())
        << "round " << r + 1 << " differs from the uninterrupted run";
  }
}

TEST_P(StatefulStrategyKillTest, ResumedAfterAKillIsBitIdenticalToAnUninterruptedRun) {
  ExpectResumedBitIdentical(GetParam(), /*damage_newest=*/false);
}

// Moved back to an older checkpoint, the job runs the rounds after it again from that round's
// model and state (SCAFFOLD's every party's variate among it), and ends on the same model.
TEST_P(StatefulStrategyKillTest, ResumedFromAnOlderCheckpointAfterAKillIsBitIdenticalToo) {
  ExpectResumedBitIdentical(GetParam(), /*damage_newest=*/true);
}

INSTANTIATE_TEST_SUITE_P(ProcessTest, StatefulStrategyKillTest, ::testing::Values("fedavgm", "fedadam", "scaffold"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// An asynchronous (FedBuff) job with real workers: each server step folds buffer_size updates
// and commits a version; killed with SIGKILL after two steps and restarted, the coordinator
// resumes from the last committed version (the steps before the kill kept as they were, task
// numbers going on from the last step's count) and the job ends with all its steps.
TEST(ProcessTest, AnAsyncJobCommitsStepsAndResumesAfterAKill) {
  TempDir dir("kill-async");
  int port = 0;
  auto coordinator = StartCoordinator(dir, "127.0.0.1:0", &port);
  ASSERT_GT(port, 0) << coordinator->Log();
  auto workers = StartThreeWorkers(dir, port);
  auto stub = JobStub(port);
  ASSERT_TRUE(WaitForWorkers(*stub, 3, std::chrono::seconds(30))) << coordinator->Log();

  const uint32_t steps = 12;  // many, so that two commit well before the last (the test polls every 50 ms)
  v1::JobSpec spec = SmallJob(steps, 3, 3000);
  spec.set_strategy("fedavgm");
  spec.mutable_server()->set_learning_rate(1.0);
  spec.mutable_server()->set_momentum(0.5);
  auto* async = spec.mutable_async();
  async->set_buffer_size(2);
  async->set_max_staleness(3);
  async->set_staleness_weighting("polynomial");
  async->set_staleness_exponent(0.5);
  async->set_concurrency(3);
  const std::string job = Submit(*stub, spec);
  v1::GetJobResponse before;
  ASSERT_TRUE(WaitForCommitted(*stub, job, 2, &before)) << coordinator->Log();
  // Paused workers cannot let the job reach its last step before the kill; they go on, and
  // reconnect by themselves, once the coordinator is back.
  for (auto& worker : workers) worker->Signal(SIGSTOP);
  coordinator->Kill(SIGKILL);
  // A step can commit between the read above and the kill: what was committed before the kill
  // is told by its commit time, on this machine's clock as the coordinator's.
  const int64_t killed_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count();
  auto restarted = StartCoordinator(dir, "127.0.0.1:" + std::to_string(port), &port);
  for (auto& worker : workers) worker->Signal(SIGCONT);
  ASSERT_GT(port, 0) << restarted->Log();
  stub = JobStub(port);
  auto done = WaitForJob(*stub, job, std::chrono::seconds(240));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error() << "\n" << restarted->Log();
  ASSERT_EQ(done.rounds_size(), static_cast<int>(steps));
  EXPECT_NE(restarted->Log().find("resuming"), std::string::npos) << restarted->Log();
  EXPECT_NE(restarted->Log().find("asynchronous from version"), std::string::npos) << restarted->Log();
  // The steps committed before the kill were neither lost nor made again.
  for (const auto& r : before.rounds()) {
    const auto& after = done.rounds(static_cast<int>(r.round()) - 1);
    EXPECT_EQ(after.model_sha256(), r.model_sha256()) << "step " << r.round();
    EXPECT_EQ(after.committed_unix_ms(), r.committed_unix_ms()) << "step " << r.round();
  }
  // Task numbers go on after the restart: every step made after it sent more tasks than any
  // step committed before the kill.
  uint32_t tasks_before_kill = 0;
  for (const auto& r : done.rounds()) {
    if (r.committed_unix_ms() <= killed_unix_ms) {
      tasks_before_kill = std::max(tasks_before_kill, r.async_step().tasks_sent());
    }
  }
  for (const auto& r : done.rounds()) {
    ASSERT_TRUE(r.has_async_step()) << "step " << r.round();
    EXPECT_EQ(r.async_step().updates_folded(), 2u) << "step " << r.round();
    EXPECT_EQ(r.clients_reported(), 2u) << "step " << r.round();
    EXPECT_LE(r.async_step().max_staleness(), 3u) << "step " << r.round();
    for (const auto& w : r.workers()) {
      if (w.outcome().rfind("accepted", 0) != 0) continue;
      EXPECT_GT(w.staleness_weight(), 0.0);
      EXPECT_LE(w.staleness_weight(), 1.0);
      EXPECT_DOUBLE_EQ(w.staleness_weight(), 1.0 / std::sqrt(1.0 + w.staleness())) << w.worker_id();
    }
    if (r.committed_unix_ms() > killed_unix_ms) {
      EXPECT_GT(r.async_step().tasks_sent(), tasks_before_kill) << "step " << r.round();
    }
  }
  // Not every worker need have an update folded: one whose tasks a faster pair keeps making
  // too stale is cancelled each time (FedBuff's point), so nothing is asserted of who folded.
  EXPECT_GT(done.rounds(static_cast<int>(steps) - 1).test_accuracy(), 0.3);  // chance is 0.1
}

// --pace-real-time reaches the device of a real worker process: it joins on a paced emulated
// device, and says so in the device properties the coordinator lists.
TEST(ProcessTest, AWorkerStartedWithPaceRealTimeJoinsOnAPacedEmulatedDevice) {
  TempDir dir("paced-worker");
  int port = 0;
  auto coordinator = StartCoordinator(dir, "127.0.0.1:0", &port);
  ASSERT_GT(port, 0) << coordinator->Log();
  auto paced = StartWorker(dir, port, "paced", {"--device", "emu:edge-npu", "--pace-real-time"});
  auto unpaced = StartWorker(dir, port, "unpaced", {"--device", "emu:edge-npu"});
  auto stub = JobStub(port);
  ASSERT_TRUE(WaitForWorkers(*stub, 2, std::chrono::seconds(30))) << paced->Log();
  grpc::ClientContext ctx;
  v1::ListWorkersResponse listed;
  ASSERT_TRUE(stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &listed).ok());
  std::map<std::string, std::string> pacing;
  for (const auto& w : listed.workers()) {
    EXPECT_EQ(w.device().kind(), "emu:edge-npu") << w.worker_id();
    auto it = w.device().properties().find("pace_real_time");
    pacing[w.worker_id()] = it == w.device().properties().end() ? "absent" : it->second;
  }
  EXPECT_EQ(pacing["paced"], "true");
  EXPECT_EQ(pacing["unpaced"], "false");
}

// The lines of /proc/<pid>/maps that `pattern` finds.
std::vector<std::string> MappingsMatching(pid_t pid, const std::regex& pattern) {
  std::vector<std::string> found;
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  for (std::string line; std::getline(maps, line);) {
    if (std::regex_search(line, pattern)) found.push_back(line);
  }
  return found;
}

// The lines naming a CUDA, cuBLAS or NCCL library (Tessera's modules included).
std::vector<std::string> CudaMappings(pid_t pid) {
  static const std::regex cuda("cublas|cudart|libcuda\\.|nccl|libtessera_cuda");
  return MappingsMatching(pid, cuda);
}

// The lines naming Gloo, ibverbs, XRT or Open MPI, or Tessera's modules for them.
std::vector<std::string> ModuleLibraryMappings(pid_t pid) {
  static const std::regex gloo_or_xrt("libgloo|libibverbs|libxrt|libmpi|libopen-pal|libtessera_(gloo|xrt|mpi)");
  return MappingsMatching(pid, gloo_or_xrt);
}

// A "Vm...:" figure of /proc/<pid>/status in kB; -1 when absent.
int64_t MemoryFigureKb(pid_t pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

TEST(ProcessTest, AnIdleCpuWorkerMapsNoCudaGlooXrtOrMpiLibrary) {
  TempDir dir("idle-cpu-worker");
  int port = 0;
  auto coordinator = StartCoordinator(dir, "127.0.0.1:0", &port);
  ASSERT_GT(port, 0) << coordinator->Log();
  auto worker = StartWorker(dir, port, "idle", {"--device", "cpu"});
  auto stub = JobStub(port);
  ASSERT_TRUE(WaitForWorkers(*stub, 1, std::chrono::seconds(30))) << worker->Log();
  const std::vector<std::string> mapped = CudaMappings(worker->pid());
  EXPECT_TRUE(mapped.empty()) << mapped.size() << " CUDA mappings in an idle CPU worker, the first: "
                              << mapped.front();
  const std::vector<std::string> modules = ModuleLibraryMappings(worker->pid());
  EXPECT_TRUE(modules.empty()) << modules.size() << " Gloo, XRT or MPI mappings in an idle CPU worker, the first: "
                               << modules.front();
  std::cout << "idle cpu worker, joined: VmRSS " << MemoryFigureKb(worker->pid(), "VmRSS") << " kB, VmHWM "
            << MemoryFigureKb(worker->pid(), "VmHWM") << " kB\n";
}

TEST(ProcessTest, AWorkerAskedForCudaWithoutItSaysWhyAndJoinsOnItsFallback) {
  // With a driver here the worker may take the GPU; without one the module is never loaded.
  const bool driver_here = LoadSystemLibrary("libcuda.so.1").ok();
  TempDir dir("cuda-fallback-worker");
  int port = 0;
  auto coordinator = StartCoordinator(dir, "127.0.0.1:0", &port);
  ASSERT_GT(port, 0) << coordinator->Log();
  auto worker = StartWorker(dir, port, "fallback", {"--device", "cuda", "--fallback-device", "cpu"});
  auto stub = JobStub(port);
  ASSERT_TRUE(WaitForWorkers(*stub, 1, std::chrono::seconds(30))) << worker->Log();
  const std::string log = worker->Log();
  EXPECT_EQ(log.find("undefined symbol"), std::string::npos) << log;
  if (log.find("on device NVIDIA") != std::string::npos) return;  // a GPU here: it took it
  EXPECT_NE(log.find("device 'cuda' is not usable here ("), std::string::npos) << log;
  EXPECT_NE(log.find("on device cpu"), std::string::npos) << log;
  if (!driver_here) {
    const bool built_with_cuda = CudaViability().reason.rfind("built without CUDA", 0) != 0;
    EXPECT_NE(log.find(built_with_cuda ? "no CUDA driver: " : "built without CUDA"), std::string::npos) << log;
    const std::vector<std::string> mapped = CudaMappings(worker->pid());
    EXPECT_TRUE(mapped.empty()) << mapped.size() << " CUDA mappings, the first: " << mapped.front();
  }
}

// A driver but no GPU (the stand-in libcuda.so.1, stand_in_cuda_driver.cc): the worker loads the
// CUDA module, every symbol it takes from the worker resolves, the CUDA runtime's reason is
// logged and the worker trains on its fallback.
TEST(ProcessTest, AWorkerWithADriverButNoGpuLoadsTheCudaModuleAndSaysWhyNot) {
  if (CudaViability().reason.rfind("built without CUDA", 0) == 0) GTEST_SKIP() << CudaViability().reason;
  TempDir dir("stand-in-driver-worker");
  int port = 0;
  auto coordinator = StartCoordinator(dir, "127.0.0.1:0", &port);
  ASSERT_GT(port, 0) << coordinator->Log();
  const char* library_path = std::getenv("LD_LIBRARY_PATH");
  auto worker = StartWorker(dir, port, "stand-in", {"--device", "cuda", "--fallback-device", "cpu"},
                            {std::string("LD_LIBRARY_PATH=") + TESSERA_STAND_IN_CUDA_DRIVER_DIR +
                             (library_path != nullptr ? std::string(":") + library_path : "")});
  auto stub = JobStub(port);
  ASSERT_TRUE(WaitForWorkers(*stub, 1, std::chrono::seconds(30))) << worker->Log();
  const std::string log = worker->Log();
  const std::string why = "device 'cuda' is not usable here (device backend 'cuda' is not viable here: ";
  EXPECT_NE(log.find(why + "no CUDA device: "), std::string::npos) << log;
  EXPECT_NE(log.find("on device cpu"), std::string::npos) << log;
  bool module_mapped = false;
  for (const std::string& line : CudaMappings(worker->pid())) {
    module_mapped = module_mapped || line.find("libtessera_cuda.so") != std::string::npos;
  }
  EXPECT_TRUE(module_mapped) << "the worker did not load libtessera_cuda.so";
}

}  // namespace
}  // namespace tessera::testing
