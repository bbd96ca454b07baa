// `tessera bench collectives` flags: a value the benchmark cannot honour, or a flag that does
// not apply to the mode it is given in, is exit code 2 with a message naming the flag, never a
// run that quietly does something else.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
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

}  // namespace
}  // namespace tessera::collectives
