// `tessera bench collectives` flags: a value the benchmark cannot honour, or a flag that does
// not apply to the mode it is given in, is exit code 2 with a message naming the flag, never a
// run that quietly does something else.
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "collectives/benchmark.h"

namespace tessera::collectives {
namespace {

struct Outcome {
  int code;
  std::string stderr_text;
};

Outcome RunBenchmark(std::vector<std::string> args) {
  args.insert(args.begin(), "bench_collectives");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  testing::internal::CaptureStderr();
  const int code = CollectivesBenchmarkMain(static_cast<int>(args.size()), argv.data());
  return {code, testing::internal::GetCapturedStderr()};
}

TEST(CollectivesBenchmarkFlagsTest, AMessageSizeThatIsNotWholeFloat32ElementsIsRefused) {
  // Rows would report 6 bytes while allreducing one 4-byte element.
  Outcome min = RunBenchmark({"--ranks", "1", "--backends", "p2p", "--min-bytes", "6", "--max-bytes", "8"});
  EXPECT_EQ(min.code, 2) << min.stderr_text;
  EXPECT_NE(min.stderr_text.find("flag --min-bytes: expected a multiple of 4 (float32 elements), got 6"),
            std::string::npos)
      << min.stderr_text;
  Outcome max = RunBenchmark({"--ranks", "1", "--backends", "p2p", "--min-bytes", "4", "--max-bytes", "10"});
  EXPECT_EQ(max.code, 2) << max.stderr_text;
  EXPECT_NE(max.stderr_text.find("flag --max-bytes: expected a multiple of 4 (float32 elements), got 10"),
            std::string::npos)
      << max.stderr_text;
}

// Each rank count is read as an integer flag is: strtol took "+2", " 2" and "2" alike. The
// backend named after it is refused too, so a count taken by mistake runs nothing.
TEST(CollectivesBenchmarkFlagsTest, ARankCountIsDecimalDigitsInRange) {
  for (const std::string& ranks : {"+2", " 2", "2 ", "2,", ",2", "2,,4", "2x", "0x2", "0", "65", "-1", "4294967298"}) {
    Outcome outcome = RunBenchmark({"--ranks", ranks, "--backends", "no-such-backend"});
    EXPECT_EQ(outcome.code, 2) << ranks << ": " << outcome.stderr_text;
    EXPECT_EQ(outcome.stderr_text, "tessera bench collectives: flag --ranks: expected comma-separated integers from 1 "
                                   "to 64, got '" + ranks + "'\n")
        << ranks;
  }
  Outcome good = RunBenchmark({"--ranks", "1,64", "--backends", "no-such-backend"});
  EXPECT_EQ(good.code, 2);
  EXPECT_NE(good.stderr_text.find("flag --backends"), std::string::npos) << good.stderr_text;
}

TEST(CollectivesBenchmarkFlagsTest, SweepFlagsWithTcpCeilingAreRefused) {
  for (const std::vector<std::string>& sweep :
       {std::vector<std::string>{"--ranks", "2"}, std::vector<std::string>{"--repeat", "3"},
        std::vector<std::string>{"--max-bytes", "4096"}}) {
    std::vector<std::string> args = {"--tcp-ceiling"};
    args.insert(args.end(), sweep.begin(), sweep.end());
    Outcome outcome = RunBenchmark(args);
    EXPECT_EQ(outcome.code, 2) << sweep[0] << ": " << outcome.stderr_text;
    EXPECT_NE(outcome.stderr_text.find(sweep[0] + " does not apply to --tcp-ceiling"), std::string::npos)
        << outcome.stderr_text;
  }
}

TEST(CollectivesBenchmarkFlagsTest, RepeatUnderMpirunIsRefused) {
  const std::filesystem::path store =
      std::filesystem::temp_directory_path() / ("tessera-bench-flags-" + std::to_string(::getpid()));
  ::setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
  ::setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  Outcome outcome = RunBenchmark({"--store-dir", store.string(), "--backends", "p2p", "--min-bytes", "4",
                                  "--max-bytes", "4", "--repeat", "3"});
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  std::filesystem::remove_all(store);
  EXPECT_EQ(outcome.code, 2) << outcome.stderr_text;
  EXPECT_NE(outcome.stderr_text.find("--repeat is for ranks forked here"), std::string::npos)
      << outcome.stderr_text;
}

// A wait that a signal interrupts is retried: it was counted as a child that exited with 0.
TEST(CollectivesBenchmarkChildrenTest, AnInterruptedWaitIsRetriedAndTheChildsExitCounts) {
  const pid_t failing = ::fork();
  ASSERT_GE(failing, 0);
  if (failing == 0) ::_exit(3);
  const pid_t passing = ::fork();
  ASSERT_GE(passing, 0);
  if (passing == 0) ::_exit(0);
  int interrupted = 0;
  auto wait_once_interrupted = [&](pid_t pid, int* status, int options) -> pid_t {
    if (interrupted++ % 2 == 0) {
      errno = EINTR;
      return -1;
    }
    return ::waitpid(pid, status, options);
  };
  const std::vector<std::string> failed = WaitForChildren({failing, passing}, wait_once_interrupted);
  EXPECT_EQ(failed, std::vector<std::string>{"rank 0 exited with 3"});
  EXPECT_EQ(interrupted, 4);
}

// A child that cannot be waited for is a failure that says why, never a success.
TEST(CollectivesBenchmarkChildrenTest, AChildThatCannotBeWaitedForIsAFailure) {
  const pid_t gone = ::fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);  // reaped here: no longer this process's child
  const std::vector<std::string> failed = WaitForChildren({gone});
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0], "rank 0 (pid " + std::to_string(gone) + ") could not be waited for: " + std::strerror(ECHILD));
}

// A fork that fails ends the ranks forked before it: none is left waiting for a rank that
// never came, and no pid -1 (which waitpid takes for "any child") is handed back.
TEST(CollectivesBenchmarkChildrenTest, AFailedForkEndsTheRanksForkedBeforeIt) {
  std::vector<pid_t> forked;
  int calls = 0;
  auto fork_twice = [&]() -> pid_t {
    if (calls++ == 1) {
      errno = EAGAIN;
      return -1;
    }
    const pid_t pid = ::fork();
    if (pid > 0) forked.push_back(pid);
    return pid;
  };
  auto children = ForkChildren(3, [](int) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test, whatever it finds
    for (;;) ::pause();                  // a rank waiting for its peers
  }, fork_twice);
  ASSERT_FALSE(children.ok());
  EXPECT_EQ(children.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(children.status().message(), std::string("fork for rank 1 of 3: ") + std::strerror(EAGAIN) +
                                             "; the ranks forked before it were ended");
  EXPECT_EQ(calls, 2);
  ASSERT_EQ(forked.size(), 1u);
  // Killed and reaped already.
  errno = 0;
  EXPECT_EQ(::waitpid(forked[0], nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

}  // namespace
}  // namespace tessera::collectives
