// Limits of the emulated backend: what a profile file may hold (its size and the range of
// each figure) and how far a paced device sleeps.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "device/device.h"
#include "device/emulated/factory.h"
#include "device/emulated/profile.h"

namespace tessera {
namespace {

std::string WriteProfile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

std::string Profile(const std::string& field, const std::string& value) {
  std::string text =
      "[npu]\npeak_tflops_fp32 = 1.0\npeak_tflops_fp16 = 8.0\nmemory_bandwidth_gbps = 100\n"
      "memory_bytes = 1048576\nhost_link_gbps = 4\npower_watts = 20\nnative_ops = [\"gemm\"]\n";
  const size_t at = text.find(field + " = ");
  const size_t end = text.find('\n', at);
  return text.replace(at, end - at, field + " = " + value);
}

TEST(EmulatedLimitsTest, FiguresOutOfRangeAreRefusedNamingFileProfileAndField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"memory_bytes", "1e30"},          // past uint64_t: the conversion was undefined
      {"memory_bytes", "2e19"},
      {"peak_tflops_fp32", "1e300"},     // x 1e12 is infinite
      {"peak_tflops_fp16", "1e300"},
      {"power_watts", "1e300"},
      {"memory_bandwidth_gbps", "1e300"},
      {"memory_bandwidth_gbps", "1e-300"},  // a copy modelled past the clock's range
      {"host_link_gbps", "1e-300"},
  };
  for (const auto& [field, value] : cases) {
    const std::string path = WriteProfile("range_profile.toml", Profile(field, value));
    auto profiles = LoadProfiles(path);
    ASSERT_EQ(profiles.status().code(), StatusCode::kInvalidArgument) << field << " = " << value;
    for (const std::string& part : {std::string("range_profile.toml"), std::string("'npu'"), "'" + field + "'"}) {
      EXPECT_NE(profiles.status().message().find(part), std::string::npos) << profiles.status().ToString();
    }
  }
  // The bounds themselves are accepted.
  EXPECT_TRUE(LoadProfiles(WriteProfile("edge_profile.toml", Profile("host_link_gbps", "0.000001"))).ok());
  EXPECT_TRUE(LoadProfiles(WriteProfile("edge_profile.toml", Profile("peak_tflops_fp32", "1e9"))).ok());
  auto largest = LoadProfiles(WriteProfile("edge_profile.toml", Profile("memory_bytes", "9223372036854775807")));
  ASSERT_TRUE(largest.ok()) << largest.status().ToString();
  EXPECT_EQ(largest->front().memory_bytes, uint64_t{9223372036854775807u});
}

TEST(EmulatedLimitsTest, AProfileFilePastOneMebibyteIsRefusedUnparsed) {
  std::string text = Profile("power_watts", "20");
  text += std::string((size_t{1} << 20), '#') + "\n";  // one long comment: valid TOML
  const std::string path = WriteProfile("large_profile.toml", text);
  auto profiles = LoadProfiles(path);
  ASSERT_EQ(profiles.status().code(), StatusCode::kInvalidArgument) << profiles.status().ToString();
  EXPECT_NE(profiles.status().message().find("large_profile.toml"), std::string::npos);
  EXPECT_NE(profiles.status().message().find("larger than 1048576 bytes"), std::string::npos)
      << profiles.status().ToString();
}

// A FIFO named as a profile file held its reader (a worker at start) until something wrote to
// it; a directory read as an empty file ("holds no profile").
TEST(EmulatedLimitsTest, AProfileThatIsNotARegularFileIsRefusedWithoutWaitingForAWriter) {
  const std::string fifo = ::testing::TempDir() + "fifo_profile.toml";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  // A writer that hands a valid profile to whoever opens the FIFO to read, so that a load that
  // waits for it returns (and fails this test) rather than hanging.
  std::thread writer([&] {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);  // a reader gone is EPIPE here, not a signal
    const int fd = ::open(fifo.c_str(), O_WRONLY);
    if (fd < 0) return;
    const std::string text = Profile("power_watts", "20");
    (void)!::write(fd, text.data(), text.size());
    ::close(fd);
  });
  auto profiles = LoadProfiles(fifo);
  const int release = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // the writer, if still waiting
  writer.join();
  if (release >= 0) ::close(release);
  ASSERT_EQ(profiles.status().code(), StatusCode::kInvalidArgument) << profiles.status().ToString();
  EXPECT_NE(profiles.status().message().find("fifo_profile.toml"), std::string::npos);
  EXPECT_NE(profiles.status().message().find("expected a regular file"), std::string::npos)
      << profiles.status().ToString();

  auto directory = LoadProfiles(::testing::TempDir());
  ASSERT_EQ(directory.status().code(), StatusCode::kInvalidArgument) << directory.status().ToString();
  EXPECT_NE(directory.status().message().find("expected a regular file"), std::string::npos)
      << directory.status().ToString();
}

// A profile's name becomes part of a device's name: a short word. What the file holds is shown
// escaped and bounded in every message.
TEST(EmulatedLimitsTest, ProfileNamesAreShortWords) {
  const std::string body = Profile("power_watts", "20").substr(std::string("[npu]").size());
  for (const std::string& name : {std::string("\"evil\\u001b[31m\""), std::string(65, 'n'), std::string("\"a b\"")}) {
    auto profiles = LoadProfiles(WriteProfile("named_profile.toml", "[" + name + "]" + body));
    ASSERT_EQ(profiles.status().code(), StatusCode::kInvalidArgument) << name;
    const std::string& message = profiles.status().message();
    EXPECT_NE(message.find("expected a name of 1 to 64 letters, digits, '-', '_' or '.'"), std::string::npos) << message;
    EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
  }
  EXPECT_TRUE(LoadProfiles(WriteProfile("named_profile.toml", "[" + std::string(64, 'n') + "]" + body)).ok());
  EXPECT_TRUE(LoadProfiles(WriteProfile("named_profile.toml", "[\"my_npu-2.1\"]" + body)).ok());
}

TEST(EmulatedLimitsTest, WhatAProfileFileHoldsIsShownEscapedAndBounded) {
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"native_ops", "[\"gemm\\u001b[31m\"]"},
      {"power_watts", "20\nprecision = \"\\u001b[31m\""},
      {"power_watts", "20\ndtypes = [\"float32\", \"\\u001b[31m\"]"},
      {"power_watts", "20\n\"\\u001b[31m\" = 1"},
      {"power_watts", "20\nprecision = \"" + std::string(100000, 'x') + "\""},
  };
  for (const auto& [field, value] : fields) {
    auto profiles = LoadProfiles(WriteProfile("words_profile.toml", Profile(field, value)));
    ASSERT_EQ(profiles.status().code(), StatusCode::kInvalidArgument) << value.substr(0, 80);
    const std::string& message = profiles.status().message();
    EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
    EXPECT_LT(message.size(), 1000u) << message.substr(0, 1000);
  }
}

TEST(EmulatedLimitsTest, APacingStopEndsTheSleepAndKeepsTheModelledTime) {
  DeviceProfile slow = *FindBuiltinProfile("generic");
  slow.host_link_gbps = 1e-6;  // 1 KB/s: 4 KB is modelled at 4 s
  auto paced = CreateEmulatedDevice(slow, EmulatedDeviceOptions{.pace_real_time = true});
  ASSERT_TRUE(paced.ok()) << paced.status().ToString();
  std::vector<float> host(1000, 1.0f);
  auto buffer = (*paced)->Allocate(host.size() * sizeof(float));
  ASSERT_TRUE(buffer.ok());
  int asked = 0;
  SetEmulatedPacingStop(**paced, [&] { return ++asked >= 2; });  // the second look says stop
  ResetEmulatedClock(**paced);
  ASSERT_TRUE((*paced)->CopyHostToDevice(host.data(), *buffer, 0, host.size() * sizeof(float)).ok());
  EXPECT_EQ(asked, 2);
  EXPECT_NEAR(EmulatedModelledMs(**paced), 4000.0, 1e-6);

  // Once told to stop, every later sleep ends at its first look.
  ASSERT_TRUE((*paced)->CopyHostToDevice(host.data(), *buffer, 0, host.size() * sizeof(float)).ok());
  EXPECT_EQ(asked, 3);
  SetEmulatedPacingStop(**paced, nullptr);
  auto cpu = CreateDevice("cpu");
  ASSERT_TRUE(cpu.ok());
  SetEmulatedPacingStop(**cpu, [] { return true; });  // not emulated: no-op
}

TEST(EmulatedLimitsTest, ARequestPastTheLargestSizeClassSaysSoInsteadOfSizeClassZero) {
  auto device = CreateDevice("emu:edge-npu");
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  auto huge = (*device)->Allocate(SIZE_MAX);
  ASSERT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("emu:edge-npu (emulated)"), std::string::npos) << huge.status().ToString();
  EXPECT_NE(huge.status().message().find("larger than the largest size class"), std::string::npos)
      << huge.status().ToString();
  EXPECT_EQ(huge.status().message().find("size class 0"), std::string::npos) << huge.status().ToString();
}

}  // namespace
}  // namespace tessera
