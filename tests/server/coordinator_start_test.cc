// What a coordinator owns exclusively: its state directory and its port. A second one on
// either is refused at start with a message that says which and why; --listen is checked
// before anything binds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "server/coordinator.h"
#include "tests/captured_log.h"
#include "tests/server/test_directory.h"

namespace tessera::server {
namespace {

class CoordinatorStartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDirectory("tessera-start");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  CoordinatorOptions Options(const std::string& sub, const std::string& listen = "127.0.0.1:0") {
    // Plaintext: these tests are about the directory and the port.
    CoordinatorOptions options = LoopbackCoordinatorOptions(dir_ / sub, "start-test");
    options.listen_address = listen;
    return options;
  }

  std::filesystem::path dir_;
};

TEST_F(CoordinatorStartTest, ASecondCoordinatorOnTheSameStateDirectoryIsRefusedNamingTheFirst) {
  auto first = Coordinator::Start(Options("state"));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = Coordinator::Start(Options("state"));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  const std::string lock = (dir_ / "state" / "coordinator.lock").string();
  EXPECT_EQ(second.status().message(),
            "state directory '" + (dir_ / "state").string() + "' is in use by another process (pid " +
                std::to_string(::getpid()) + ", lock file '" + lock +
                "'); stop that coordinator first, or use another --state-dir");
  // The first is unharmed, and once it is gone the directory can be taken.
  EXPECT_GT((*first)->port(), 0);
  first->reset();
  auto third = Coordinator::Start(Options("state"));
  EXPECT_TRUE(third.ok()) << third.status().ToString();
}

TEST_F(CoordinatorStartTest, ASecondCoordinatorOnTheSamePortFailsToStart) {
  auto first = Coordinator::Start(Options("a"));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string port = std::to_string((*first)->port());
  auto second = Coordinator::Start(Options("b", "127.0.0.1:" + port));
  ASSERT_FALSE(second.ok()) << "two coordinators share port " << port;
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(second.status().message(), "cannot listen on '127.0.0.1:" + port + "': port " + port +
                                           " is in use on '127.0.0.1' (by another coordinator?)");
}

TEST_F(CoordinatorStartTest, TheListenAddressIsCheckedBeforeAnythingStarts) {
  auto no_port = Coordinator::Start(Options("s", "localhost"));
  ASSERT_FALSE(no_port.ok());
  EXPECT_EQ(no_port.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_port.status().message().find("--listen 'localhost': the port is missing; expected HOST:PORT"),
            std::string::npos)
      << no_port.status().message();
  auto too_big = Coordinator::Start(Options("s", "127.0.0.1:99999"));
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().message().find("--listen '127.0.0.1:99999': port 99999 is out of range"),
            std::string::npos)
      << too_big.status().message();
  EXPECT_FALSE(std::filesystem::exists(dir_ / "s")) << "nothing is created for a refused address";
}

TEST_F(CoordinatorStartTest, AnAddressThatIsNotThisMachinesIsNamed) {
  CoordinatorOptions options = Options("s", "192.0.2.1:7070");  // TEST-NET-1, never local
  options.tls.insecure_remote = true;
  auto elsewhere = Coordinator::Start(options);
  ASSERT_FALSE(elsewhere.ok());
  EXPECT_EQ(elsewhere.status().message(),
            "cannot listen on '192.0.2.1:7070': '192.0.2.1' is not an address of this machine");
}

TEST_F(CoordinatorStartTest, ALeftoverFileIsLoggedEscapedAndBounded) {
  // Whoever can write the state directory names its files: a name that moves the cursor and
  // starts a line of its own, and one of 250 bytes.
  const std::filesystem::path checkpoints = dir_ / "state" / "checkpoints";
  std::filesystem::create_directories(checkpoints);
  std::ofstream(checkpoints / "a\x1b[2J\nforged line.tmp") << "left";
  std::ofstream(checkpoints / (std::string(246, 'b') + ".tmp")) << "left";
  testing::CapturedLog log;
  auto coordinator = Coordinator::Start(Options("state"));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string text = log.text();
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_EQ(text.find("\nforged line"), std::string::npos) << text;
  EXPECT_NE(text.find("removed leftover checkpoint file 'a\\x1b[2J\\nforged line.tmp' from '" + checkpoints.string() +
                      "'"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("removed leftover checkpoint file '" + std::string(128, 'b') + "…(250 bytes)' from"),
            std::string::npos)
      << text;
  EXPECT_FALSE(std::filesystem::exists(checkpoints / "a\x1b[2J\nforged line.tmp"));
}

}  // namespace
}  // namespace tessera::server
