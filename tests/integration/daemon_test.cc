// The daemons' doors, as a user meets them: the real binaries, started as processes. A
// second coordinator on a state directory or a port that is taken exits naming the reason;
// a mistyped flag exits 2 naming what was expected; SIGTERM drains and exits 0 however many
// threads OpenBLAS started before main().
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <sstream>

#include "tessera/config.h"
#include "tests/integration/harness.h"
#include "tests/integration/process.h"

namespace tessera::testing {
namespace {

constexpr auto kExitWait = std::chrono::seconds(30);

class DaemonTest : public ::testing::Test {
 protected:
  DaemonTest() : dir_(std::string("daemon-") + ::testing::UnitTest::GetInstance()->current_test_info()->name()) {}

  // A coordinator on `listen` with its state under `state`; waits until it says it listens
  // (its port in *port) or has exited.
  std::unique_ptr<Process> Coordinator(const std::string& tag, const std::string& state, const std::string& listen,
                                       int* port, std::vector<std::string> extra = {},
                                       std::vector<std::string> unset = {}, std::vector<std::string> env = {}) {
    std::vector<std::string> argv{TESSERA_COORDINATOR_BIN, "--listen", listen, "--state-dir", dir_.str() + "/" + state,
                                  "--join-token", kToken, "--tls-dir", TestPki::Get().WriteCoordinatorDir(dir_.str())};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = std::make_unique<Process>(argv, dir_.str() + "/" + tag + ".log", env, unset);
    const std::regex listening("listening on port ([0-9]+)");
    std::smatch match;
    std::string text;
    WaitUntil(
        [&] {
          text = p->Log();
          return std::regex_search(text, match, listening) || !Running(*p);
        },
        std::chrono::seconds(30));
    *port = std::regex_search(text, match, listening) ? std::stoi(match[1]) : 0;
    return p;
  }

  // True while `p` runs; reaps it (keeping its status) once it has exited.
  bool Running(Process& p) {
    if (exited_.count(&p)) return false;
    auto status = p.WaitExit(std::chrono::milliseconds(0));
    if (status) exited_[&p] = *status;
    return !status;
  }
  int ExitStatus(Process& p) {
    if (!exited_.count(&p)) {
      auto status = p.WaitExit(kExitWait);
      EXPECT_TRUE(status.has_value()) << "still running:\n" << p.Log();
      exited_[&p] = status.value_or(-1);
    }
    return exited_[&p];
  }

  TempDir dir_;
  std::map<Process*, int> exited_;
};

TEST_F(DaemonTest, ASecondCoordinatorOnTheSameStateDirectoryExitsNamingTheFirstsPid) {
  int port = 0;
  auto first = Coordinator("first", "state", "127.0.0.1:0", &port);
  ASSERT_GT(port, 0) << first->Log();
  int second_port = 0;
  auto second = Coordinator("second", "state", "127.0.0.1:0", &second_port);
  const int status = ExitStatus(*second);
  EXPECT_EQ(DescribeExit(status), "exited with 1") << second->Log();
  EXPECT_NE(second->Log().find("is in use by another process (pid " + std::to_string(first->pid()) + ", lock file"),
            std::string::npos)
      << second->Log();
  EXPECT_TRUE(Running(*first));
}

TEST_F(DaemonTest, ASecondCoordinatorOnTheSamePortExits) {
  int port = 0;
  auto first = Coordinator("first", "a", "127.0.0.1:0", &port);
  ASSERT_GT(port, 0) << first->Log();
  int second_port = 0;
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto second = Coordinator("second", "b", address, &second_port);
  EXPECT_EQ(DescribeExit(ExitStatus(*second)), "exited with 1") << second->Log();
  EXPECT_NE(second->Log().find("cannot listen on '" + address + "': port " + std::to_string(port) + " is in use"),
            std::string::npos)
      << second->Log();
}

TEST_F(DaemonTest, AMistypedCoordinatorFlagExitsNamingWhatWasExpected) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--listen", "localhost"}, "--listen 'localhost': the port is missing; expected HOST:PORT"},
      {{"--listen", "127.0.0.1:99999"}, "--listen '127.0.0.1:99999': port 99999 is out of range"},
      {{"--log-level", "verbose"}, "flag --log-level: expected trace, debug, info, warn, error or off, got 'verbose'"},
      {{"--heartbeat-timeout-ms", "-5"}, "flag --heartbeat-timeout-ms: expected 100 to 3600000, got '-5'"},
      {{"--log-format", "xml"}, "flag --log-format: expected text or json, got 'xml'"},
      {{"--stream-window-kib", "-1"}, "flag --stream-window-kib: expected 0 to 65536, got '-1'"},
      {{"--commit-retry-s", "-1"}, "flag --commit-retry-s: expected 0 to 604800, got '-1'"},
      {{"--commit-retry-s", "5m"}, "flag --commit-retry-s: expected an integer, got '5m'"},
      {{"--metrics-listen", "localhost"}, "--metrics-listen 'localhost': the port is missing; expected HOST:PORT"},
      {{"--eval-device", "gpu"}, "--eval-device: unknown device 'gpu'; expected cpu, cuda, xrt, emu:PROFILE ("},
      // An unset variable, which would otherwise serve TLS without client certificates.
      {{"--tls-client-ca", ""}, "flag --tls-client-ca: expected a non-empty value, got ''"},
      {{"--data-dir", dir_.str() + "/no-such-data"},
       "--data-dir '" + dir_.str() + "/no-such-data': cannot read it (No such file or directory)"},
      {{"--dataset", "tab=" + dir_.str() + "/no-such-data"},
       "--dataset tab='" + dir_.str() + "/no-such-data': cannot read it (No such file or directory)"},
  };
  int n = 0;
  for (const auto& [args, says] : cases) {
    std::vector<std::string> argv{TESSERA_COORDINATOR_BIN, "--state-dir", dir_.str() + "/state", "--join-token",
                                  kToken};
    if (args[0] != "--listen") argv.insert(argv.end(), {"--listen", "127.0.0.1:0"});
    argv.insert(argv.end(), args.begin(), args.end());
    Process p(argv, dir_.str() + "/flags-" + std::to_string(n++) + ".log");
    auto status = p.WaitExit(kExitWait);
    ASSERT_TRUE(status.has_value()) << p.Log();
    EXPECT_EQ(DescribeExit(*status), "exited with 2") << p.Log();
    EXPECT_NE(p.Log().find("tessera-coordinator: " + says), std::string::npos) << p.Log();
  }
}

// Options that cannot serve anyone are a bad command line (exit 2, which the service unit does
// not restart), not a failure that may clear.
TEST_F(DaemonTest, ACoordinatorWithoutCredentialsForWorkersExits2) {
  Process p({TESSERA_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--state-dir", dir_.str() + "/state", "--insecure"},
            dir_.str() + "/no-credential.log");
  auto status = p.WaitExit(kExitWait);
  ASSERT_TRUE(status.has_value()) << p.Log();
  EXPECT_EQ(DescribeExit(*status), "exited with 2") << p.Log();
  EXPECT_NE(p.Log().find("workers need a credential to join"), std::string::npos) << p.Log();
}

TEST_F(DaemonTest, ACoordinatorWhoseEvaluationDeviceCannotBeMadeExitsAtStart) {
  const std::string missing = dir_.str() + "/no-such-profile.toml";
  int port = 0;
  auto p = Coordinator("eval-device", "state", "127.0.0.1:0", &port, {"--eval-device", "emu:" + missing});
  EXPECT_EQ(port, 0) << "it listened:\n" << p->Log();
  EXPECT_EQ(DescribeExit(ExitStatus(*p)), "exited with 1") << p->Log();
  EXPECT_NE(p->Log().find("tessera-coordinator: --eval-device 'emu:"), std::string::npos) << p->Log();
  EXPECT_NE(p->Log().find("' cannot be used here: device profile file '" + missing + "' cannot be opened"),
            std::string::npos)
      << p->Log();
}

TEST_F(DaemonTest, AMistypedWorkerFlagExitsNamingTheValidChoices) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--device", "gpu"}, "--device: unknown device 'gpu'; expected cpu, cuda, xrt, emu:PROFILE ("},
      {{"--fallback-device", "cpux"}, "--fallback-device: unknown device 'cpux'; expected cpu, "},
      {{"--log-level", "loud"}, "flag --log-level: expected trace, debug, info, warn, error or off, got 'loud'"},
      {{"--coordinator", "localhost"}, "--coordinator 'localhost': the port is missing"},
      {{"--coordinator", ""}, "flag --coordinator: expected a non-empty value, got ''"},
      {{"--data-dir", dir_.str() + "/no-such-data"},
       "--data-dir '" + dir_.str() + "/no-such-data': cannot read it (No such file or directory)"},
      {{"--chunk-kib", "2048"}, "flag --chunk-kib: expected 1 to 1024, got '2048'"},
      {{"--cohort", "site", "--cohort-timeout-s", "0"}, "flag --cohort-timeout-s: expected 1 to 604800, got '0'"},
      {{"--cohort", "site", "--cohort-timeout-s", "30s"}, "flag --cohort-timeout-s: expected an integer, got '30s'"},
      {{"--keep-round-memory", "--huge-pages"}, "--huge-pages and --keep-round-memory: a kept round's buffers stay"},
      {{"--trainer", "t=/no/such/trainer run.py"}, "--trainer t: the program '/no/such/trainer' is not an executable file"},
      {{"--trainer", "t=no-such-trainer-program run.py"},
       "--trainer t: the program 'no-such-trainer-program' is not an executable file in any directory of PATH"},
      {{"--cohort-timeout-s", "600"},
       "--cohort-timeout-s bounds the waits of a cohort's members; give --cohort too"},
      {{"--pace-real-time", "--device", "cpu"},
       "--pace-real-time paces an emulated device; --device 'cpu' is not one (expected emu:PROFILE, emu:FILE.toml or emu:FILE.toml#PROFILE)"},
      {{"--cohort", "site", "--cohort-address", "10.0.0.5:7000"},
       "--cohort-address '10.0.0.5:7000': expected the DNS name or IP address (IPv6 without brackets) this worker's "
       "cohort peers reach it at, without a port"},
      {{"--cohort", "site", "--cohort-address", "0.0.0.0"},
       "--cohort-address '0.0.0.0': a wildcard, which the cohort's peers cannot dial"},
  };
  int n = 0;
  for (const auto& [args, says] : cases) {
    std::vector<std::string> argv{TESSERA_WORKER_BIN, "--join-token", kToken, "--name", "w", "--insecure"};
    argv.insert(argv.end(), args.begin(), args.end());
    Process p(argv, dir_.str() + "/flags-" + std::to_string(n++) + ".log");
    auto status = p.WaitExit(kExitWait);
    ASSERT_TRUE(status.has_value()) << p.Log();
    EXPECT_EQ(DescribeExit(*status), "exited with 2") << p.Log();
    EXPECT_NE(p.Log().find("tessera-worker: " + says), std::string::npos) << p.Log();
  }
}

// A profile file that cannot be read stops the worker at start, naming its flag: --device's
// was found only as the device opened (its error named no flag), and --fallback-device's only
// once --device turned out unusable.
TEST_F(DaemonTest, AWorkerWhoseDeviceCannotBeMadeExitsInsteadOfTrainingOnTheCpu) {
  const std::string missing = dir_.str() + "/no-such-profile.toml";
  for (const std::string flag : {"--device", "--fallback-device"}) {
    SCOPED_TRACE(flag);
    Process p({TESSERA_WORKER_BIN, "--join-token", kToken, "--name", "w", "--insecure", "--coordinator", "127.0.0.1:1",
               flag, "emu:" + missing},
              dir_.str() + "/worker" + flag + ".log");
    auto status = p.WaitExit(kExitWait);
    ASSERT_TRUE(status.has_value()) << "the worker fell back to another device:\n" << p.Log();
    EXPECT_EQ(DescribeExit(*status), "exited with 1") << p.Log();
    EXPECT_NE(p.Log().find("tessera-worker: " + flag + " 'emu:" + missing + "' cannot be used here: device profile file '" +
                           missing + "' cannot be opened"),
              std::string::npos)
        << p.Log();
    EXPECT_EQ(p.Log().find("falling back"), std::string::npos) << p.Log();
  }
}

// An xclbin that TESSERA_XRT_XCLBIN names but that is missing (a typo, a file not deployed) is
// a mistake to fix: the worker fell back to the CPU with a warning, as if this host had no card.
TEST_F(DaemonTest, AWorkerAskedForXrtWithAMissingXclbinExitsInsteadOfTrainingOnTheCpu) {
  const std::string missing = dir_.str() + "/no-such.xclbin";
  for (const std::string flag : {"--device", "--fallback-device"}) {
    SCOPED_TRACE(flag);
    Process p({TESSERA_WORKER_BIN, "--join-token", kToken, "--name", "w", "--insecure", "--coordinator", "127.0.0.1:1",
               flag, "xrt"},
              dir_.str() + "/worker-xrt" + flag + ".log", {"TESSERA_XRT_XCLBIN=" + missing});
    auto status = p.WaitExit(kExitWait);
    ASSERT_TRUE(status.has_value()) << "the worker fell back to another device:\n" << p.Log();
    EXPECT_EQ(DescribeExit(*status), "exited with 1") << p.Log();
    EXPECT_NE(p.Log().find("tessera-worker: " + flag + " 'xrt' cannot be used here: TESSERA_XRT_XCLBIN: xclbin '" +
                           missing + "' does not exist"),
              std::string::npos)
        << p.Log();
    EXPECT_EQ(p.Log().find("falling back"), std::string::npos) << p.Log();
  }
}

// A CUDA driver here (the stand-in libcuda.so.1, stand_in_cuda_driver.cc) but no module where
// modules are looked for (TESSERA_MODULE_DIR naming an empty directory): an install to fix, as
// a cuBLAS missing would be. The worker fell back to the CPU with a warning, as if this host
// had no GPU; without a driver, or with one and no GPU, it still does (ProcessTest).
TEST_F(DaemonTest, AWorkerAskedForCudaWhoseModuleCannotBeLoadedExitsInsteadOfTrainingOnTheCpu) {
#if !TESSERA_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA: no module to load";
#endif
  const std::string modules = dir_.str() + "/no-modules";
  std::filesystem::create_directories(modules);
  const char* library_path = std::getenv("LD_LIBRARY_PATH");
  const std::vector<std::string> env = {
      std::string("LD_LIBRARY_PATH=") + TESSERA_STAND_IN_CUDA_DRIVER_DIR +
          (library_path != nullptr ? std::string(":") + library_path : ""),
      "TESSERA_MODULE_DIR=" + modules};
  for (const std::string flag : {"--device", "--fallback-device"}) {
    SCOPED_TRACE(flag);
    Process p({TESSERA_WORKER_BIN, "--join-token", kToken, "--name", "w", "--insecure", "--coordinator", "127.0.0.1:1",
               flag, "cuda"},
              dir_.str() + "/worker-cuda" + flag + ".log", env);
    auto status = p.WaitExit(kExitWait);
    ASSERT_TRUE(status.has_value()) << "the worker fell back to another device:\n" << p.Log();
    EXPECT_EQ(DescribeExit(*status), "exited with 1") << p.Log();
    EXPECT_NE(p.Log().find("tessera-worker: " + flag + " 'cuda' cannot be used here: cannot load the CUDA backend: " +
                           "libtessera_cuda.so is in none of " + modules),
              std::string::npos)
        << p.Log();
    EXPECT_EQ(p.Log().find("falling back"), std::string::npos) << p.Log();
  }
}

// OpenBLAS starts its threads from its constructor, before main() can block any signal,
// unless OPENBLAS_NUM_THREADS=1. The kernel gives a process-directed SIGTERM to a thread that
// does not block it: one of those.
TEST_F(DaemonTest, SigtermDrainsTheCoordinatorAndExitsZeroWhateverOpenBlasStarted) {
  const std::vector<std::vector<std::string>> environments = {{}, {"OPENBLAS_NUM_THREADS=4"}};
  int n = 0;
  for (const auto& env : environments) {
    int port = 0;
    auto p = Coordinator("coordinator-" + std::to_string(n), "state-" + std::to_string(n), "127.0.0.1:0", &port, {},
                         {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOTO_NUM_THREADS"}, env);
    ++n;
    ASSERT_GT(port, 0) << p->Log();
    p->Signal(SIGTERM);
    EXPECT_EQ(DescribeExit(ExitStatus(*p)), "exited with 0") << p->Log();
    EXPECT_NE(p->Log().find("signal 15: shutting down"), std::string::npos) << p->Log();
  }
}

TEST_F(DaemonTest, SigtermStopsTheWorkerAndExitsZeroWhateverOpenBlasStarted) {
  int port = 0;
  auto coordinator = Coordinator("coordinator", "state", "127.0.0.1:0", &port);
  ASSERT_GT(port, 0) << coordinator->Log();
  Process worker({TESSERA_WORKER_BIN, "--coordinator", "127.0.0.1:" + std::to_string(port), "--join-token", kToken,
                  "--tls-dir", TestPki::Get().WriteWorkerDir(dir_.str(), "w1")},
                 dir_.str() + "/w1.log", {}, {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "GOTO_NUM_THREADS"});
  ASSERT_TRUE(WaitUntil([&] { return coordinator->Log().find("worker w1 joined") != std::string::npos; },
                        std::chrono::seconds(120)))
      << coordinator->Log() << worker.Log();
  worker.Signal(SIGTERM);
  auto status = worker.WaitExit(kExitWait);
  ASSERT_TRUE(status.has_value()) << worker.Log();
  EXPECT_EQ(DescribeExit(*status), "exited with 0") << worker.Log();
  EXPECT_NE(worker.Log().find("signal 15: stopping"), std::string::npos) << worker.Log();
}

TEST_F(DaemonTest, WithLogFormatJsonEveryLogLineIsAJsonObject) {
  int port = 0;
  auto p = Coordinator("coordinator", "state", "127.0.0.1:0", &port, {"--log-format", "json"});
  ASSERT_GT(port, 0) << p->Log();
  p->Signal(SIGTERM);
  EXPECT_EQ(DescribeExit(ExitStatus(*p)), "exited with 0") << p->Log();
  const std::regex line(
      R"re(\{"time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z","level":"(info|warning)","source":"coordinator",)re"
      R"re("message":"(.*)"\})re");
  std::istringstream log(p->Log());
  std::vector<std::string> messages;
  for (std::string text; std::getline(log, text);) {
    if (text.rfind("tessera-coordinator listening", 0) == 0) continue;  // stdout, for scripts
    std::smatch match;
    ASSERT_TRUE(std::regex_match(text, match, line)) << text;
    messages.push_back(match[2]);
  }
  ASSERT_EQ(messages.size(), 2u) << p->Log();
  EXPECT_EQ(messages[0].rfind("coordinator listening on port " + std::to_string(port) + " (mutual TLS); state in ", 0),
            0u)
      << messages[0];
  EXPECT_EQ(messages[1], "signal 15: shutting down");
}

}  // namespace
}  // namespace tessera::testing
